/*
 * numa_hwloc.c - numa.h with hwloc 2.x: load the topology with I/O devices, find the PCI device
 * by bus id, walk up to its first non-I/O ancestor (the package or NUMA-bearing group it hangs
 * off) and take that object's nodeset. Only a single node is an answer: a device whose locality
 * spans the machine (one socket, or firmware that does not say) gains nothing from binding.
 *
 * Components: hwloc's Linux backend finds PCI devices and their locality in sysfs, which is all
 * this needs. The libpciaccess "pci" plugin is turned off (it duplicates that and leaks on
 * topology destroy, which fails the ASan suite), and so are the plugins that enumerate GPUs
 * through their runtimes (cuda, nvml, opencl, rsmi, levelzero, gl): loading a topology must not
 * initialise a GPU driver inside the process as a side effect.
 */
#include "offload/numa.h"

#include <hwloc.h>
#include <stdio.h>

int flexdiag__numa_node_near_pci(const char *bus_id, char *why, size_t n) {
    if (!bus_id || !*bus_id) {
        snprintf(why, n, "the GPU's PCI bus id is unknown: no NUMA placement");
        return -1;
    }
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) != 0) {
        snprintf(why, n, "hwloc_topology_init failed: no NUMA placement");
        return -1;
    }
    static const char *const skip[] = {"pci", "cuda", "nvml", "opencl", "rsmi", "levelzero", "gl"};
    for (size_t i = 0; i < sizeof skip / sizeof *skip; i++) /* unknown names are fine */
        (void)hwloc_topology_set_components(topo, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST,
                                            skip[i]);
    int node = -1;
    (void)hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(topo) != 0) {
        snprintf(why, n, "hwloc_topology_load failed: no NUMA placement");
    } else if (hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE) <= 1) {
        snprintf(why, n, "one NUMA node: nothing to place");
    } else {
        hwloc_obj_t dev = hwloc_get_pcidev_by_busidstring(topo, bus_id);
        hwloc_obj_t anc = dev ? hwloc_get_non_io_ancestor_obj(topo, dev) : NULL;
        if (!dev)
            snprintf(why, n, "hwloc does not know PCI device %s: no NUMA placement", bus_id);
        else if (!anc || !anc->nodeset || hwloc_bitmap_weight(anc->nodeset) != 1)
            snprintf(why, n, "PCI device %s is not local to one NUMA node: no placement", bus_id);
        else
            node = hwloc_bitmap_first(anc->nodeset);
        if (node >= 0) snprintf(why, n, "PCI device %s is local to NUMA node %d", bus_id, node);
    }
    hwloc_topology_destroy(topo);
    return node;
}
