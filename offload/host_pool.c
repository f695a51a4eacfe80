/*
 * host_pool.c - the pinned host pool (see host_pool.h).
 *
 * Order of create: mmap (anonymous, MAP_NORESERVE: nothing is touched yet), ask for transparent
 * huge pages (MADV_HUGEPAGE: 2 MiB pages where the kernel allows them, so the CPU attention's
 * streams over the KV home miss the TLB once per 2 MiB instead of once per 4 KiB; a kernel
 * without THP ignores it), prefer the GPU's NUMA node with mbind before the first touch (pages
 * are placed when first faulted, and pinned pages never migrate afterwards), then
 * host_register, which faults in and locks every page.
 * Placement is MPOL_PREFERRED rather than MPOL_BIND: when the node runs short the kernel spills
 * to another node instead of OOM-killing the process mid-pin; a strict mode can come later.
 * Whether pinning is meaningful is read from the op table: a backend with page-locked memory
 * (host_alloc set, i.e. CUDA) pins; the CPU tables' host_register is a no-op and the pool then
 * reports itself as plain memory.
 */
#include "offload/host_pool.h"

#include <errno.h>
#include <linux/mempolicy.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/core.h"
#include "offload/numa.h"
#include "offload/ranges.h"


struct flexdiag_host_pool {
    char name[64];                /* for messages */
    const flexdiag_kernels *k;    /* backend that pinned the region, NULL when not pinned */
    char *base;                   /* the region, page-aligned */
    size_t bytes;                 /* its length, multiple of 4096 */
    int pinned;                   /* 1: host_register succeeded */
    int numa_node;                /* preferred node, -1: none */
    char note[768];               /* pinning and placement, for the bench row */
    pthread_mutex_t mu;           /* guards ranges */
    flexdiag_ranges ranges;       /* blocks of the region */
};

void flexdiag__host_pool_params_init(flexdiag_host_pool_params *p) {
    memset(p, 0, sizeof *p);
    p->pin = 1;
    p->name = "pinned pool";
}

/* Prefer the GPU's NUMA node for [p, p + n) (before first touch); the node or -1, why filled. */
static int place(void *p, size_t n, const char *bus_id, char *why, size_t wn) {
    const int node = flexdiag__numa_node_near_pci(bus_id, why, wn);
    if (node < 0) return -1;
    unsigned long mask[16] = {0}; /* 1024 nodes */
    if ((size_t)node >= sizeof mask * 8) {
        snprintf(why, wn, "NUMA node %d beyond the 1024 this build can name", node);
        return -1;
    }
    mask[node / 64] |= 1ul << (node % 64);
    /* maxnode counts one more than the bits (the kernel's historical off-by-one) */
    if (syscall(SYS_mbind, p, n, MPOL_PREFERRED, mask, sizeof mask * 8 + 1, 0ul) != 0) {
        snprintf(why, wn, "mbind to NUMA node %d: %s: kernel default placement", node,
                 strerror(errno));
        return -1;
    }
    return node;
}

/* Bytes of [base, base + bytes) the kernel backs with transparent huge pages now (the
 * AnonHugePages of the mappings inside it in /proc/self/smaps; 0 when that cannot be read).
 * Pinning has faulted every page in, so this is what the CPU attention's streams will walk. */
static uint64_t huge_bytes(const void *base, size_t bytes) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return 0;
    const uintptr_t lo = (uintptr_t)base, hi = lo + bytes;
    uint64_t total = 0;
    int inside = 0;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b, kb;
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2 && strchr(line, '-') < strchr(line, ' '))
            inside = a >= lo && b <= hi;
        else if (inside && sscanf(line, "AnonHugePages: %lu kB", &kb) == 1)
            total += (uint64_t)kb << 10;
    }
    fclose(f);
    return total;
}

/* Pin the region through the backend where that means something; note why not otherwise. */
static void pin(flexdiag_host_pool *pool, const flexdiag_host_pool_params *p, char *why,
                size_t wn) {
    const flexdiag_kernels *k = p->k;
    if (!p->pin) {
        snprintf(why, wn, "not pinned: pinning turned off");
    } else if (!k || !k->host_register) {
        snprintf(why, wn, "not pinned: no device backend");
    } else if (!k->host_alloc) {
        snprintf(why, wn, "not pinned: the %s backend has no device memory to pin for", k->name);
    } else {
        const flexdiag_status st = k->host_register(pool->base, pool->bytes);
        if (st == FLEXDIAG_OK) {
            pool->k = k;
            pool->pinned = 1;
            char hb[32], ab[32];
            uint64_t huge = huge_bytes(pool->base, pool->bytes);
            snprintf(why, wn, "pinned by the %s backend, %s of %s in 2 MiB pages", k->name,
                     flexdiag__fmt_bytes(huge, hb, sizeof hb),
                     flexdiag__fmt_bytes(pool->bytes, ab, sizeof ab));
            return;
        }
        /* where pinning fails the pool stays plain memory, with one warning (docs/offloading.md
         * §1); the message is ours now */
        snprintf(why, wn, "not pinned: %s", flexdiag__err_msg());
        flexdiag__err_clear();
        char bb[32];
        FLEXDIAG_WARN("%s: %s stays pageable, copies from it will not overlap: %s", pool->name,
                      flexdiag__fmt_bytes(pool->bytes, bb, sizeof bb), why);
    }
}

flexdiag_status flexdiag__host_pool_create(const flexdiag_host_pool_params *p,
                                           flexdiag_host_pool **out) {
    *out = NULL;
    const char *name = p->name && *p->name ? p->name : "pinned pool";
    const uint64_t bytes = p->budget & ~(uint64_t)(FLEXDIAG_HOST_POOL_ALIGN - 1);
    if (bytes == 0 || bytes > SIZE_MAX)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "%s: budget of %llu bytes: need at least "
                             "4096 (runtime_params.cpu_mem)", name, (unsigned long long)p->budget);
    flexdiag_host_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "%s: no host memory", name);
    snprintf(pool->name, sizeof pool->name, "%s", name);
    pool->bytes = (size_t)bytes;
    pool->numa_node = -1;
    if (flexdiag__ranges_init(&pool->ranges, bytes, FLEXDIAG_HOST_POOL_ALIGN) != FLEXDIAG_OK) {
        free(pool);
        return FLEXDIAG_ERR_OOM_HOST;
    }
    void *m = mmap(NULL, pool->bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        const int e = errno;
        flexdiag__ranges_fini(&pool->ranges);
        free(pool);
        char bb[32];
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "%s: cannot map %s of host memory: %s "
                             "(lower runtime_params.cpu_mem)", name,
                             flexdiag__fmt_bytes(bytes, bb, sizeof bb), strerror(e));
    }
    pool->base = m;
    (void)madvise(m, pool->bytes, MADV_HUGEPAGE); /* best effort: 4 KiB pages otherwise */
    pthread_mutex_init(&pool->mu, NULL);
    char numa_why[256] = "", pin_why[512] = "";
    pool->numa_node = place(pool->base, pool->bytes, p->pci_bus_id, numa_why, sizeof numa_why);
    pin(pool, p, pin_why, sizeof pin_why);
    snprintf(pool->note, sizeof pool->note, "%s; NUMA: %s", pin_why, numa_why);
    char bb[32];
    FLEXDIAG_INFO("%s: %s, %s", pool->name, flexdiag__fmt_bytes(bytes, bb, sizeof bb), pool->note);
    *out = pool;
    return FLEXDIAG_OK;
}

void flexdiag__host_pool_destroy(flexdiag_host_pool *pool) {
    if (!pool) return;
    if (pool->pinned && pool->k->host_unregister(pool->base) != FLEXDIAG_OK) {
        FLEXDIAG_WARN("%s: host_unregister: %s", pool->name, flexdiag__err_msg());
        flexdiag__err_clear();
    }
    munmap(pool->base, pool->bytes);
    pthread_mutex_destroy(&pool->mu);
    flexdiag__ranges_fini(&pool->ranges);
    free(pool);
}

flexdiag_status flexdiag__host_pool_alloc(flexdiag_host_pool *pool, size_t bytes,
                                          const char *what, void **out) {
    *out = NULL;
    if (bytes == 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "%s: block of 0 bytes for %s", pool->name,
                             what ? what : "?");
    pthread_mutex_lock(&pool->mu);
    uint64_t off = 0;
    const int r = flexdiag__ranges_alloc(&pool->ranges, bytes, &off);
    const uint64_t left = pool->ranges.size - pool->ranges.used;
    const uint64_t largest = r == 1 ? 0 : flexdiag__ranges_largest(&pool->ranges);
    pthread_mutex_unlock(&pool->mu);
    if (r < 0) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "%s: no host memory for the block "
                                    "list", pool->name);
    if (r == 0) {
        const uint64_t need = flexdiag__ranges_round(bytes, FLEXDIAG_HOST_POOL_ALIGN);
        char nb[32], lb[32], bb[32], fb[32];
        return flexdiag__err(FLEXDIAG_ERR_OOM_PINNED,
                             "%s: %s needs %zu bytes (%s carved) but only %s of the %s budget is "
                             "left%s (largest free run %s): raise runtime_params.cpu_mem or move "
                             "more to the "
                             "disk tier",
                             pool->name, what ? what : "a block", bytes,
                             flexdiag__fmt_bytes(need, nb, sizeof nb),
                             flexdiag__fmt_bytes(left, lb, sizeof lb),
                             flexdiag__fmt_bytes(pool->bytes, bb, sizeof bb),
                             left >= need ? ", fragmented" : "",
                             flexdiag__fmt_bytes(largest, fb, sizeof fb));
    }
    *out = pool->base + off;
    return FLEXDIAG_OK;
}

void flexdiag__host_pool_free(flexdiag_host_pool *pool, void *p, size_t bytes) {
    if (!p) return;
    const char *c = p;
    FLEXDIAG_ASSERT(c >= pool->base && c < pool->base + pool->bytes);
    pthread_mutex_lock(&pool->mu);
    flexdiag__ranges_free(&pool->ranges, (uint64_t)(c - pool->base), bytes);
    pthread_mutex_unlock(&pool->mu);
}

void *flexdiag__host_pool_base(const flexdiag_host_pool *pool) { return pool->base; }
size_t flexdiag__host_pool_bytes(const flexdiag_host_pool *pool) { return pool->bytes; }
const char *flexdiag__host_pool_note(const flexdiag_host_pool *pool) { return pool->note; }

void flexdiag__host_pool_stats(const flexdiag_host_pool *pool, flexdiag_host_pool_stats *out) {
    flexdiag_host_pool *m = (flexdiag_host_pool *)pool; /* the lock only */
    pthread_mutex_lock(&m->mu);
    out->budget = pool->ranges.size;
    out->used = pool->ranges.used;
    out->peak = pool->ranges.peak;
    out->requested = pool->ranges.requested;
    out->largest_free = flexdiag__ranges_largest(&pool->ranges);
    pthread_mutex_unlock(&m->mu);
    out->pinned = pool->pinned;
    out->numa_node = pool->numa_node;
}
