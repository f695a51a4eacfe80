/*
 * numa.h - the one place hwloc is used: which NUMA node sits nearest a PCI device (the GPU);
 * and, from sysfs, which CPUs a node has (numa_cpus.c).
 *
 * numa_hwloc.c asks hwloc 2.x for the device's PCI locality (its nearest non-I/O ancestor's
 * nodeset); numa_none.c, built where meson found no hwloc, always answers "unknown". The caller
 * (offload/host_pool.c) binds memory to the answer with mbind, so hwloc never reaches the rest
 * of the tree. The op table has no way to ask the backend for the GPU's PCI bus id today, so the
 * caller passes the id it has (NULL: none, the pool uses the whole machine).
 */
#ifndef FLEXDIAG_NUMA_H
#define FLEXDIAG_NUMA_H

#include "base/layer.h"
#if FLEXDIAG_LAYER < FLEXDIAG_LAYER_OFFLOAD
#error "offload/numa.h: a lower layer may not use offload/ (base <- policy <- kernels <- offload <- runtime; docs/architecture.md)"
#endif

#include <sched.h> /* cpu_set_t (the system header: offload/ is off the include path) */
#include <stddef.h>

/* The OS index of the NUMA node nearest the PCI device bus_id ("0000:41:00.0", as
 * cudaDeviceGetPCIBusId writes it), or -1 when it cannot be told or does not matter: no hwloc in
 * this build, one NUMA node, the device unknown, a locality spanning several nodes. why (n bytes,
 * NUL-terminated) says which. */
int flexdiag__numa_node_near_pci(const char *bus_id, char *why, size_t n);

/* numa_cpus.c (sysfs, no hwloc): the CPUs of a Linux cpulist ("0-7,16-23\n") into *set; 0, or 1
 * when it is malformed or names none. */
int flexdiag__cpulist_parse(const char *list, cpu_set_t *set);
/* The CPUs of NUMA node `node` (its /sys/devices/system/node/node<N>/cpulist); 0, or 1 when the
 * node is unknown. */
int flexdiag__numa_node_cpus(int node, cpu_set_t *set);

#endif /* FLEXDIAG_NUMA_H */
