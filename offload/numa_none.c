/*
 * numa_none.c - numa.h in a build without hwloc: the NUMA node of a device is never known, so
 * the pinned pool is placed by the kernel's default policy (first touch).
 */
#include "offload/numa.h"

#include <stdio.h>

int flexdiag__numa_node_near_pci(const char *bus_id, char *why, size_t n) {
    snprintf(why, n, "this build has no hwloc (libhwloc-dev was not found at configure time): "
             "NUMA placement of %s unknown", bus_id ? bus_id : "the GPU");
    return -1;
}
