/*
 * numa_cpus.c - the CPUs of a NUMA node (numa.h), from Linux sysfs: the node's cpulist, so work
 * on pinned memory bound to that node can run next to it. No hwloc needed.
 */
#include "offload/numa.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int flexdiag__cpulist_parse(const char *list, cpu_set_t *set) {
    CPU_ZERO(set);
    const char *p = list;
    while (*p && *p != '\n') {
        char *end = NULL;
        long a = strtol(p, &end, 10), b = a;
        if (end == p || a < 0) return 1;
        p = end;
        if (*p == '-') {
            b = strtol(p + 1, &end, 10);
            if (end == p + 1 || b < a) return 1;
            p = end;
        }
        if (b >= CPU_SETSIZE) return 1;
        for (long c = a; c <= b; c++) CPU_SET((int)c, set);
        if (*p == ',') p++;
        else if (*p && *p != '\n') return 1;
    }
    return CPU_COUNT(set) > 0 ? 0 : 1;
}

int flexdiag__numa_node_cpus(int node, cpu_set_t *set) {
    if (node < 0) return 1;
    char path[96], buf[4096];
    snprintf(path, sizeof path, "/sys/devices/system/node/node%d/cpulist", node);
    FILE *f = fopen(path, "r");
    if (!f) return 1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return flexdiag__cpulist_parse(buf, set);
}
