/*
 * test_host_pool.c - the pinned host pool (offload/host_pool.h) and the range allocator under
 * it (offload/ranges.h), CPU only: exact accounting (4096 granules, no power-of-two rounding),
 * alignment and disjointness of blocks, budget refusal and fragmentation messages, a random
 * alloc/free sequence against a page-bitmap model, concurrent use, the pinning outcomes (CPU
 * backend, no backend, a backend whose host_register refuses, one that pins) and NUMA placement
 * answers for unknown devices.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/core.h"
#include "kernels/kernels.h"
#include "offload/host_pool.h"
#include "offload/numa.h"
#include "offload/ranges.h"
#include "util.h"

#define KIB 4096u
#define MIB (1024u * 1024u)

static flexdiag_host_pool *mk(uint64_t budget, const flexdiag_kernels *k) {
    flexdiag_host_pool_params p;
    flexdiag__host_pool_params_init(&p);
    p.budget = budget;
    p.k = k;
    flexdiag_host_pool *pool = NULL;
    assert_int_equal(flexdiag__host_pool_create(&p, &pool), FLEXDIAG_OK);
    return pool;
}

static void test_accounting(void **state) {
    (void)state;
    flexdiag_host_pool *pool = mk(64 * MIB, flexdiag__kernels_cpu_ref());
    const size_t sizes[] = {1, 4096, 4097, MIB + 3, 3 * MIB, 12345, 8191};
    enum { N = sizeof sizes / sizeof *sizes };
    void *p[N];
    uint64_t used = 0, requested = 0;
    char *base = flexdiag__host_pool_base(pool);
    for (int i = 0; i < N; i++) {
        assert_int_equal(flexdiag__host_pool_alloc(pool, sizes[i], "block", &p[i]), FLEXDIAG_OK);
        assert_int_equal((uintptr_t)p[i] % 4096, 0);
        assert_true((char *)p[i] >= base &&
                    (char *)p[i] + sizes[i] <= base + flexdiag__host_pool_bytes(pool));
        memset(p[i], i + 1, sizes[i]);
        used += (sizes[i] + 4095) / 4096 * 4096;
        requested += sizes[i];
    }
    for (int i = 0; i < N; i++) { /* disjoint: every block still holds its own byte */
        const unsigned char *c = p[i];
        for (size_t j = 0; j < sizes[i]; j += 97) assert_int_equal(c[j], i + 1);
        assert_int_equal(c[sizes[i] - 1], i + 1);
    }
    flexdiag_host_pool_stats st;
    flexdiag__host_pool_stats(pool, &st);
    assert_int_equal(st.budget, 64 * MIB);
    assert_int_equal(st.used, used);
    assert_int_equal(st.requested, requested);
    assert_int_equal(st.peak, used);
    for (int i = 0; i < N; i += 2) flexdiag__host_pool_free(pool, p[i], sizes[i]);
    for (int i = 1; i < N; i += 2) flexdiag__host_pool_free(pool, p[i], sizes[i]);
    flexdiag__host_pool_free(pool, NULL, 5); /* no-op */
    flexdiag__host_pool_stats(pool, &st);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.requested, 0);
    assert_int_equal(st.peak, used);
    assert_int_equal(st.largest_free, 64 * MIB); /* everything coalesced */
    flexdiag__host_pool_destroy(pool);
    flexdiag__host_pool_destroy(NULL);
}

static void test_refusal(void **state) {
    (void)state;
    flexdiag_host_pool_params p;
    flexdiag__host_pool_params_init(&p);
    p.budget = MIB + 1000; /* rounded down */
    p.name = "kv staging";
    flexdiag_host_pool *pool = NULL;
    assert_int_equal(flexdiag__host_pool_create(&p, &pool), FLEXDIAG_OK);
    assert_int_equal(flexdiag__host_pool_bytes(pool), MIB);
    void *a, *b, *c, *x;
    assert_int_equal(flexdiag__host_pool_alloc(pool, MIB / 2, "a", &a), FLEXDIAG_OK);
    assert_int_equal(flexdiag__host_pool_alloc(pool, MIB / 4, "b", &b), FLEXDIAG_OK);
    assert_int_equal(flexdiag__host_pool_alloc(pool, MIB / 4, "c", &c), FLEXDIAG_OK);
    flexdiag__err_clear();
    assert_int_equal(flexdiag__host_pool_alloc(pool, 1, "layer 3 KV", &x), FLEXDIAG_ERR_OOM_PINNED);
    assert_null(x);
    const char *m = flexdiag__err_msg();
    printf("  refusal: %s\n", m);
    assert_non_null(strstr(m, "kv staging"));
    assert_non_null(strstr(m, "layer 3 KV"));
    assert_non_null(strstr(m, "needs 1 bytes"));
    assert_non_null(strstr(m, "runtime_params.cpu_mem"));
    flexdiag__host_pool_free(pool, a, MIB / 2);
    flexdiag__host_pool_free(pool, c, MIB / 4);
    flexdiag__err_clear();
    assert_int_equal(flexdiag__host_pool_alloc(pool, 3 * MIB / 4, "big", &x), FLEXDIAG_ERR_OOM_PINNED);
    assert_non_null(strstr(flexdiag__err_msg(), "fragmented"));
    assert_int_equal(flexdiag__host_pool_alloc(pool, MIB / 2, "fits", &x), FLEXDIAG_OK);
    assert_ptr_equal(x, a); /* first fit */
    assert_int_equal(flexdiag__host_pool_alloc(pool, 0, "zero", &x), FLEXDIAG_ERR_INVALID_ARG);
    flexdiag__host_pool_destroy(pool);
    /* a budget below one page */
    p.budget = 100;
    assert_int_equal(flexdiag__host_pool_create(&p, &pool), FLEXDIAG_ERR_INVALID_ARG);
    assert_null(pool);
}

/* Random alloc/free against a page bitmap: no overlap, exact counters, full coalescing. */
static void test_ranges_random(void **state) {
    (void)state;
    enum { PAGES = 1024, LIVE = 200 };
    flexdiag_ranges r;
    assert_int_equal(flexdiag__ranges_init(&r, (uint64_t)PAGES * KIB + 100, KIB), FLEXDIAG_OK);
    assert_int_equal(r.size, (uint64_t)PAGES * KIB);
    unsigned char map[PAGES] = {0};
    uint64_t off[LIVE], len[LIVE];
    int live = 0;
    uint64_t used = 0, req = 0;
    tu_rng g;
    tu_rng_seed(&g, 99);
    for (int it = 0; it < 20000; it++) {
        if (live < LIVE && (live == 0 || tu_rng_int(&g, 0, 1))) {
            const uint64_t bytes = (uint64_t)tu_rng_int(&g, 1, 24 * KIB);
            uint64_t o;
            const int ok = flexdiag__ranges_alloc(&r, bytes, &o);
            assert_true(ok >= 0);
            if (!ok) {
                assert_true(flexdiag__ranges_largest(&r) < flexdiag__ranges_round(bytes, KIB));
                continue;
            }
            assert_int_equal(o % KIB, 0);
            for (uint64_t p = o / KIB; p < (o + bytes + KIB - 1) / KIB; p++) {
                assert_int_equal(map[p], 0);
                map[p] = 1;
            }
            off[live] = o;
            len[live++] = bytes;
            used += flexdiag__ranges_round(bytes, KIB);
            req += bytes;
        } else {
            const int k = (int)tu_rng_int(&g, 0, live - 1);
            flexdiag__ranges_free(&r, off[k], len[k]);
            for (uint64_t p = off[k] / KIB; p < (off[k] + len[k] + KIB - 1) / KIB; p++) map[p] = 0;
            used -= flexdiag__ranges_round(len[k], KIB);
            req -= len[k];
            off[k] = off[--live];
            len[k] = len[live];
        }
        assert_int_equal(r.used, used);
        assert_int_equal(r.requested, req);
        assert_true(r.n_free <= r.live + 1);
    }
    while (live) {
        live--;
        flexdiag__ranges_free(&r, off[live], len[live]);
    }
    assert_int_equal(r.used, 0);
    assert_int_equal(r.n_free, 1);
    assert_int_equal(flexdiag__ranges_largest(&r), (uint64_t)PAGES * KIB);
    flexdiag__ranges_fini(&r);
}

static void *hammer(void *arg) {
    flexdiag_host_pool *pool = arg;
    tu_rng g;
    tu_rng_seed(&g, (uint64_t)(uintptr_t)&g);
    for (int i = 0; i < 500; i++) {
        const size_t n = (size_t)tu_rng_int(&g, 1, 64 * 1024);
        void *p;
        if (flexdiag__host_pool_alloc(pool, n, "thread", &p) != FLEXDIAG_OK) continue;
        memset(p, 0x11, n);
        flexdiag__host_pool_free(pool, p, n);
    }
    return NULL;
}

static void test_threads(void **state) {
    (void)state;
    flexdiag_host_pool *pool = mk(8 * MIB, NULL);
    pthread_t th[4];
    for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&th[i], NULL, hammer, pool), 0);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    flexdiag_host_pool_stats st;
    flexdiag__host_pool_stats(pool, &st);
    assert_int_equal(st.used, 0);
    assert_true(st.peak > 0 && st.peak <= 8 * MIB);
    flexdiag__host_pool_destroy(pool);
}

/* ---- pinning ---- */

static int reg_calls, unreg_calls;
static flexdiag_status reg_refuse(void *p, size_t n) {
    (void)p;
    reg_calls++;
    return flexdiag__err(FLEXDIAG_ERR_OOM_PINNED, "fake: cannot pin %zu bytes: raise ulimit -l",
                         n);
}
static flexdiag_status reg_ok(void *p, size_t n) {
    (void)p, (void)n;
    reg_calls++;
    return FLEXDIAG_OK;
}
static flexdiag_status unreg(void *p) {
    (void)p;
    unreg_calls++;
    return FLEXDIAG_OK;
}
static flexdiag_status fake_host_alloc(size_t n, void **out) {
    (void)n;
    *out = NULL;
    return FLEXDIAG_ERR_UNSUPPORTED;
}

static void test_pinning(void **state) {
    (void)state;
    flexdiag_host_pool_stats st;
    /* the CPU tables have no device: plain memory, said so */
    flexdiag_host_pool *pool = mk(MIB, flexdiag__kernels_cpu());
    flexdiag__host_pool_stats(pool, &st);
    assert_int_equal(st.pinned, 0);
    assert_non_null(strstr(flexdiag__host_pool_note(pool), "not pinned"));
    assert_non_null(strstr(flexdiag__host_pool_note(pool), "cpu"));
    flexdiag__host_pool_destroy(pool);
    pool = mk(MIB, NULL);
    assert_non_null(strstr(flexdiag__host_pool_note(pool), "no device backend"));
    flexdiag__host_pool_destroy(pool);
    /* a device backend whose host_register refuses (RLIMIT_MEMLOCK): unpinned, usable, noted */
    flexdiag_kernels fake = *flexdiag__kernels_cpu_ref();
    fake.name = "fake-gpu";
    fake.host_alloc = fake_host_alloc;
    fake.host_register = reg_refuse;
    fake.host_unregister = unreg;
    reg_calls = unreg_calls = 0;
    flexdiag__err_clear();
    pool = mk(2 * MIB, &fake);
    assert_string_equal(flexdiag__err_msg(), ""); /* the fallback leaves no pending error */
    flexdiag__host_pool_stats(pool, &st);
    assert_int_equal(st.pinned, 0);
    assert_int_equal(reg_calls, 1);
    printf("  refused: %s\n", flexdiag__host_pool_note(pool));
    assert_non_null(strstr(flexdiag__host_pool_note(pool), "ulimit -l"));
    void *b;
    assert_int_equal(flexdiag__host_pool_alloc(pool, MIB, "staging", &b), FLEXDIAG_OK);
    memset(b, 1, MIB);
    flexdiag__host_pool_destroy(pool);
    assert_int_equal(unreg_calls, 0); /* nothing was pinned */
    /* a backend that pins: registered once, unregistered at destroy */
    fake.host_register = reg_ok;
    pool = mk(2 * MIB, &fake);
    flexdiag__host_pool_stats(pool, &st);
    assert_int_equal(st.pinned, 1);
    assert_non_null(strstr(flexdiag__host_pool_note(pool), "pinned by the fake-gpu backend"));
    flexdiag__host_pool_destroy(pool);
    assert_int_equal(unreg_calls, 1);
    /* the real CUDA table where this build has one: pinned on a GPU host, plain memory with the
     * driver's reason where there is no device */
    const flexdiag_kernels *cuda = flexdiag__kernels_cuda();
    if (cuda) {
        flexdiag__err_clear();
        pool = mk(2 * MIB, cuda);
        flexdiag__host_pool_stats(pool, &st);
        printf("  cuda: %s\n", flexdiag__host_pool_note(pool));
        assert_int_equal(st.pinned, strstr(flexdiag__host_pool_note(pool), "not pinned") == NULL);
        assert_string_equal(flexdiag__err_msg(), "");
        assert_int_equal(flexdiag__host_pool_alloc(pool, MIB, "staging", &b), FLEXDIAG_OK);
        memset(b, 2, MIB);
        flexdiag__host_pool_destroy(pool);
    }
    /* pinning turned off */
    flexdiag_host_pool_params p;
    flexdiag__host_pool_params_init(&p);
    p.budget = MIB;
    p.k = &fake;
    p.pin = 0;
    assert_int_equal(flexdiag__host_pool_create(&p, &pool), FLEXDIAG_OK);
    assert_int_equal(reg_calls, 2);
    assert_non_null(strstr(flexdiag__host_pool_note(pool), "turned off"));
    flexdiag__host_pool_destroy(pool);
}

/* The sysfs cpulist parser the CPU attention binds its threads with. */
static void test_cpulist(void **state) {
    (void)state;
    cpu_set_t set;
    assert_int_equal(flexdiag__cpulist_parse("0-3,8,10-11\n", &set), 0);
    assert_int_equal(CPU_COUNT(&set), 7);
    assert_true(CPU_ISSET(8, &set) && CPU_ISSET(11, &set) && !CPU_ISSET(4, &set));
    assert_int_equal(flexdiag__cpulist_parse("5", &set), 0);
    assert_int_equal(CPU_COUNT(&set), 1);
    const char *bad[] = {"", "\n", "3-1", "a", "1,,2", "0-", "-1", "1;2"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (flexdiag__cpulist_parse(bad[i], &set) != 1) fail_msg("cpulist \"%s\" accepted", bad[i]);
    assert_int_equal(flexdiag__numa_node_cpus(-1, &set), 1);
    assert_int_equal(flexdiag__numa_node_cpus(1 << 20, &set), 1);
}

/* NUMA answers: unknown device or no bus id -> -1 with a reason; a real bus id is answered
 * (-1 on a one-node machine). */
static void test_numa(void **state) {
    (void)state;
    char why[256];
    assert_int_equal(flexdiag__numa_node_near_pci(NULL, why, sizeof why), -1);
    assert_true(why[0] != 0);
    assert_int_equal(flexdiag__numa_node_near_pci("0000:ff:1f.7", why, sizeof why), -1);
    printf("  bogus bus id: %s\n", why);
    flexdiag_host_pool_params p;
    flexdiag__host_pool_params_init(&p);
    p.budget = MIB;
    p.pci_bus_id = "0000:ff:1f.7";
    flexdiag_host_pool *pool = NULL;
    assert_int_equal(flexdiag__host_pool_create(&p, &pool), FLEXDIAG_OK);
    flexdiag_host_pool_stats st;
    flexdiag__host_pool_stats(pool, &st);
    assert_int_equal(st.numa_node, -1);
    assert_non_null(strstr(flexdiag__host_pool_note(pool), "NUMA:"));
    flexdiag__host_pool_destroy(pool);
    /* the first PCI device of this machine, if any */
    FILE *f = popen("ls /sys/bus/pci/devices 2>/dev/null | head -n 1", "r");
    char bus[64] = "";
    if (f) {
        if (!fgets(bus, sizeof bus, f)) bus[0] = 0;
        pclose(f);
    }
    bus[strcspn(bus, "\n")] = 0;
    if (bus[0]) {
        const int node = flexdiag__numa_node_near_pci(bus, why, sizeof why);
        printf("  %s: node %d (%s)\n", bus, node, why);
        assert_true(node >= -1);
    }
}

int main(void) {
    flexdiag__log_level = FLEXDIAG_LOG_ERROR;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accounting), cmocka_unit_test(test_refusal),
        cmocka_unit_test(test_ranges_random), cmocka_unit_test(test_threads),
        cmocka_unit_test(test_pinning), cmocka_unit_test(test_numa),
        cmocka_unit_test(test_cpulist),
    };
    return cmocka_run_group_tests_name("host_pool", tests, NULL, NULL);
}
