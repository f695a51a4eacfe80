/*
 * test_policy_steps.c - the CPU policy ops (ref_policy.c: diag_slots with and without sinks,
 * evict_plan / evict_update for H2O and TOVA, alisa_plan / alisa_update) with the sequences of
 * one call at their own decode steps (kernels.h flexdiag_list_steps). Lists are laid out
 * (layers, sequences, lists per sequence); sequence 0 starts at step 0, sequence 1 five
 * iterations later (its step is -1 until then) and sequence 2 is a free slot (-1) for three
 * iterations in the middle of its run. After every call each sequence's lists (every per-list
 * state and output of the ops: slots, counts, lags, cache rows, positions, scores, victims,
 * records) must equal, bit for bit, those of a run of that sequence alone (one-sequence steps)
 * that has made the same steps, so a list whose step is negative keeps every value even though
 * the probabilities it would read change; the single runs are checked against the policies'
 * closed forms (Diagonal's slot list while its lag list builds up, the cache row of token t of
 * H2O / TOVA, ALISA's count and recent positions). ALISA's plan leaves the lists at steps >=
 * l_dec as they are. Steps without the step array, or with n_seq or per_seq below 1, are
 * INVALID_ARG naming the op. Both CPU tables point at these ops.
 */
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
#include "util.h"

enum { L = 2, NS = 3, HKV = 2, G = 2, HQ = HKV * G, ITERS = 16, MAXB = 8, FILL = 0xA5 };
enum { DA = 4, DNR = 7 };                    /* Diagonal: lag list, ring */
enum { NATT = 5, EMS = NATT + 2, PCAP = 7 }; /* H2O / TOVA / ALISA: slots, stride, prompt */
enum { AW = NATT - NATT / 2, LDEC = ITERS }; /* ALISA: records, decode length */

static const flexdiag_kernels *K(void) { return flexdiag__kernels_cpu_ref(); }

#define OK(x) assert_int_equal((x), FLEXDIAG_OK)

/* The step of sequence s at iteration k (see top). */
static int32_t step_of(int32_t s, int32_t k) {
    if (s == 1) return k - 5;
    if (s == 2) return k < 6 ? k : k < 9 ? -1 : k - 3;
    return k;
}

typedef enum { OUT, IN, SCRATCH } buf_kind;

/* One buffer of a policy's op calls, per list: compared (OUT), probabilities filled before
 * each call (IN), or scratch. */
typedef struct buf_desc {
    const char *name;
    size_t elem;      /* bytes of an element */
    int64_t per_list; /* elements per list */
    buf_kind kind;
} buf_desc;

typedef struct pol_case pol_case;
/* The ops of one step on the n lists of buffers b; the check of a one-sequence run at step t. */
typedef void step_fn(const pol_case *c, void *const *b, int64_t n, flexdiag_list_steps st);
typedef void check_fn(const pol_case *c, void *const *b, int64_t n, int32_t t);

struct pol_case {
    const char *name;
    int32_t per_seq; /* lists per sequence in one layer */
    int32_t base;    /* Diagonal: sink slots */
    int32_t rpl;     /* H2O / TOVA: cache rows per list */
    int nb;
    buf_desc b[MAXB];
    step_fn *step;
    check_fn *check;
    step_fn *past; /* (optional) called with steps >= l_dec: must leave every list as it is */
};

/* ---- Diagonal ---- */

static void diag_step(const pol_case *c, void *const *b, int64_t n, flexdiag_list_steps st) {
    OK(K()->diag_slots(b[0], b[1], b[2], b[3], n, c->base + DA, DA, st, DNR, c->base, NULL));
}

/* Without the fused update the lag list is 0, 1, .., cnt - 1: entry e at column
 * base + cnt - 1 - e holds ring slot base + (ti - e) mod n_r, after the sinks 0..base-1. */
static void diag_check(const pol_case *c, void *const *b, int64_t n, int32_t t) {
    const int32_t *sl = b[0], *ns = b[1];
    int32_t base = c->base, ms = base + DA, ti = t - base;
    int32_t cnt = ti < 0 ? 0 : ti + 1 < DA ? ti + 1 : DA;
    for (int64_t i = 0; i < n; i++) {
        const int32_t *li = sl + i * ms;
        assert_int_equal(ns[i], ti < 0 ? t + 1 : base + cnt);
        for (int32_t j = 0; j < (ti < 0 ? t + 1 : base); j++) assert_int_equal(li[j], j);
        for (int32_t e = 0; e < cnt; e++)
            assert_int_equal(li[base + cnt - 1 - e], base + (ti - e) % DNR);
    }
}

/* ---- H2O / TOVA ---- */

static void h2o_step(const pol_case *c, void *const *b, int64_t n, flexdiag_list_steps st) {
    (void)c;
    OK(K()->evict_plan(b[0], b[1], b[2], b[3], n, 1, NATT, st, PCAP, NULL));
    OK(K()->evict_update(b[3], b[2], b[1], b[4], n, G, EMS, NATT, st, NULL));
}

static void tova_step(const pol_case *c, void *const *b, int64_t n, flexdiag_list_steps st) {
    OK(K()->evict_plan(b[0], b[1], NULL, b[2], n, c->rpl, NATT, st, PCAP, NULL));
    OK(K()->evict_update(b[2], NULL, b[1], b[3], n, HQ, EMS, NATT, st, NULL));
}

/* Token t sits in exactly one slot f of every list (f = t while slots are free) and each of
 * the list's rows is the cache row p_cap + f. */
static void evict_check(const pol_case *c, void *const *b, int64_t n, int32_t t) {
    const int32_t *rows = b[0], *pos = b[1];
    for (int64_t i = 0; i < n; i++) {
        int32_t f = -1, hits = 0;
        for (int32_t j = 0; j < NATT; j++)
            if (pos[i * NATT + j] == t) f = j, hits++;
        assert_int_equal(hits, 1);
        if (t < NATT) assert_int_equal(f, t);
        for (int32_t r = 0; r < c->rpl; r++) assert_int_equal(rows[i * c->rpl + r], PCAP + f);
    }
}

/* ---- ALISA ---- */

static void alisa_plan(void *const *b, int64_t n, flexdiag_list_steps st) {
    OK(K()->alisa_plan(b[0], b[1], b[2], b[3], b[4], b[5], b[6], n, HKV, EMS, NATT, LDEC, st,
                       NULL));
}

static void alisa_step(const pol_case *c, void *const *b, int64_t n, flexdiag_list_steps st) {
    (void)c;
    alisa_plan(b, n, st);
    OK(K()->alisa_update(b[3], b[4], b[7], n, HQ, EMS, NATT, st, NULL));
}

static void alisa_past(const pol_case *c, void *const *b, int64_t n, flexdiag_list_steps st) {
    (void)c;
    alisa_plan(b, n, st);
}

/* min(t + 1, n_att) positions in every copy, the last of them the recent t-w+1..t. */
static void alisa_check(const pol_case *c, void *const *b, int64_t n, int32_t t) {
    (void)c;
    const int32_t *sl = b[0], *ns = b[1];
    int32_t want = t + 1 < NATT ? t + 1 : NATT, recent = t + 1 < AW ? t + 1 : AW;
    for (int64_t i = 0; i < n * HKV; i++) {
        assert_int_equal(ns[i], want);
        assert_memory_equal(sl + i * EMS, sl + (i - i % HKV) * EMS, (size_t)want * 4);
        for (int32_t j = 0; j < recent; j++)
            assert_int_equal(sl[i * EMS + want - recent + j], t - recent + 1 + j);
    }
}

/* ---- cases ---- */

static const pol_case cases[] = {
    {"diagonal", HKV, 0, 0, 4,
     {{"slots", 4, DA, OUT}, {"n_slots", 4, 1, OUT}, {"lag", 2, DA, OUT}, {"cnt", 2, 1, OUT}},
     diag_step, diag_check, NULL},
    {"diagonal-sink4", HKV, 4, 0, 4,
     {{"slots", 4, 4 + DA, OUT}, {"n_slots", 4, 1, OUT}, {"lag", 2, DA, OUT}, {"cnt", 2, 1, OUT}},
     diag_step, diag_check, NULL},
    {"h2o", HKV, 0, 1, 5,
     {{"rows", 4, 1, OUT}, {"pos", 4, NATT, OUT}, {"acc", 4, NATT, OUT}, {"free_slot", 4, 1, OUT},
      {"probs", 4, G * EMS, IN}},
     h2o_step, evict_check, NULL},
    {"tova", 1, 0, HKV, 4,
     {{"rows", 4, HKV, OUT}, {"pos", 4, NATT, OUT}, {"free_slot", 4, 1, OUT},
      {"probs", 4, HQ * EMS, IN}},
     tova_step, evict_check, NULL},
    {"alisa", 1, 0, 0, 8,
     {{"slots", 4, HKV * EMS, OUT}, {"n_slots", 4, HKV, OUT}, {"rec_pos", 4, AW * NATT, OUT},
      {"rec_p", 4, AW * NATT, OUT}, {"rec_n", 4, AW, OUT}, {"score", 4, LDEC, SCRATCH},
      {"keys", 8, LDEC, SCRATCH}, {"probs", 4, HQ * EMS, IN}},
     alisa_step, alisa_check, alisa_past},
};

/* ---- driver ---- */

/* Bytes of list data of buffer d. */
static size_t list_bytes(const buf_desc *d) { return d->elem * (size_t)d->per_list; }

/* c's buffers for n lists, every byte FILL. */
static void bufs_alloc(const pol_case *c, int64_t n, void **b) {
    for (int i = 0; i < c->nb; i++) {
        b[i] = malloc(list_bytes(&c->b[i]) * (size_t)n);
        assert_non_null(b[i]);
        memset(b[i], FILL, list_bytes(&c->b[i]) * (size_t)n);
    }
}

static void bufs_free(const pol_case *c, void **b) {
    for (int i = 0; i < c->nb; i++) free(b[i]);
}

/* Probabilities of 8 levels (k / 8: sums and scores tie often) into the n floats at p. */
static void fill_probs(tu_rng *r, float *p, int64_t n) {
    for (int64_t i = 0; i < n; i++) p[i] = (float)tu_rng_int(r, 0, 7) * 0.125f;
}

/* List j of layer l of sequence s: its index in the multi-sequence and the one-sequence run. */
static int64_t multi_list(const pol_case *c, int32_t l, int32_t s, int32_t j) {
    return ((int64_t)l * NS + s) * c->per_seq + j;
}

static int64_t single_list(const pol_case *c, int32_t l, int32_t j) {
    return (int64_t)l * c->per_seq + j;
}

/* Copy (to_multi) or compare the lists of sequence s between multi and single, buffers of
 * kind k; a difference fails the test, naming iteration it. */
static void sync_lists(const pol_case *c, void *const *multi, void *const *single, int32_t s,
                       buf_kind k, int to_multi, int32_t it) {
    for (int bi = 0; bi < c->nb; bi++) {
        if (c->b[bi].kind != k) continue;
        size_t nb = list_bytes(&c->b[bi]);
        for (int32_t l = 0; l < L; l++)
            for (int32_t j = 0; j < c->per_seq; j++) {
                char *m = (char *)multi[bi] + (size_t)multi_list(c, l, s, j) * nb;
                const char *o = (const char *)single[bi] + (size_t)single_list(c, l, j) * nb;
                if (to_multi)
                    memcpy(m, o, nb);
                else if (memcmp(m, o, nb) != 0)
                    fail_msg("%s: iteration %d, sequence %d (step %d): %s of layer %d list %d "
                             "differs from the sequence's run alone",
                             c->name, it, s, step_of(s, it), c->b[bi].name, l, j);
            }
    }
}

static void run_case(const pol_case *c, uint64_t seed) {
    int64_t nm = (int64_t)L * NS * c->per_seq, n1 = (int64_t)L * c->per_seq;
    void *multi[MAXB], *single[NS][MAXB];
    bufs_alloc(c, nm, multi);
    for (int32_t s = 0; s < NS; s++) bufs_alloc(c, n1, single[s]);
    tu_rng r;
    tu_rng_seed(&r, seed);
    for (int32_t it = 0; it < ITERS; it++) {
        int32_t steps[NS];
        for (int32_t s = 0; s < NS; s++) steps[s] = step_of(s, it);
        /* inputs: other values everywhere, then each running sequence's own */
        for (int bi = 0; bi < c->nb; bi++)
            if (c->b[bi].kind == IN) fill_probs(&r, multi[bi], nm * c->b[bi].per_list);
        for (int32_t s = 0; s < NS; s++) {
            if (steps[s] < 0) continue;
            for (int bi = 0; bi < c->nb; bi++)
                if (c->b[bi].kind == IN) fill_probs(&r, single[s][bi], n1 * c->b[bi].per_list);
            sync_lists(c, multi, single[s], s, IN, 1, it);
        }
        c->step(c, multi, nm, (flexdiag_list_steps){steps, NS, c->per_seq});
        for (int32_t s = 0; s < NS; s++) {
            if (steps[s] >= 0) {
                c->step(c, single[s], n1, (flexdiag_list_steps){&steps[s], 1, c->per_seq});
                c->check(c, single[s], n1, steps[s]);
            }
            sync_lists(c, multi, single[s], s, OUT, 0, it);
        }
    }
    if (c->past) { /* steps at or past l_dec: nothing written */
        int32_t past[NS] = {LDEC, LDEC + 1, INT32_MAX};
        void *before[MAXB];
        bufs_alloc(c, nm, before);
        for (int bi = 0; bi < c->nb; bi++)
            memcpy(before[bi], multi[bi], list_bytes(&c->b[bi]) * (size_t)nm);
        c->past(c, multi, nm, (flexdiag_list_steps){past, NS, c->per_seq});
        for (int bi = 0; bi < c->nb; bi++)
            if (c->b[bi].kind == OUT)
                assert_memory_equal(multi[bi], before[bi], list_bytes(&c->b[bi]) * (size_t)nm);
        bufs_free(c, before);
    }
    bufs_free(c, multi);
    for (int32_t s = 0; s < NS; s++) bufs_free(c, single[s]);
}

static void test_own_steps(void **state) {
    (void)state;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) run_case(&cases[ci], 40 + ci);
}

/* ---- arguments ---- */

/* Assert st is INVALID_ARG and the message names the op. */
static void expect_invalid(flexdiag_status st, const char *op) {
    assert_int_equal(st, FLEXDIAG_ERR_INVALID_ARG);
    char want[64];
    snprintf(want, sizeof want, "cpu %s", op);
    if (!strstr(flexdiag__err_msg(), want))
        fail_msg("message \"%s\" does not name \"%s\"", flexdiag__err_msg(), want);
    flexdiag__err_clear();
}

/* Op i of the five on n lists with steps st (buffers for one list; none read when n is 0). */
static flexdiag_status call_op(int i, flexdiag_list_steps st, int64_t n) {
    int32_t sl[EMS * HKV], ns[HKV], rows[1], pos[NATT], fr[1] = {0}, rp[AW * NATT], rn[AW] = {0};
    int16_t lag[DA], cnt[1];
    float acc[NATT], pr[HQ * EMS] = {0}, rv[AW * NATT], sc[LDEC];
    uint64_t keys[LDEC];
    const flexdiag_kernels *k = K();
    switch (i) {
    case 0: return k->diag_slots(sl, ns, lag, cnt, n, DA, DA, st, DNR, 0, NULL);
    case 1: return k->evict_plan(rows, pos, acc, fr, n, 1, NATT, st, PCAP, NULL);
    case 2: return k->evict_update(fr, acc, pos, pr, n, G, EMS, NATT, st, NULL);
    case 3: return k->alisa_plan(sl, ns, rp, rv, rn, sc, keys, n, HKV, EMS, NATT, LDEC, st, NULL);
    default: return k->alisa_update(rv, rn, pr, n, HQ, EMS, NATT, st, NULL);
    }
}

static void test_errors(void **state) {
    (void)state;
    static const char *const ops[] = {"diag_slots", "evict_plan", "evict_update", "alisa_plan",
                                      "alisa_update"};
    int32_t t = 0;
    for (int i = 0; i < 5; i++) {
        expect_invalid(call_op(i, (flexdiag_list_steps){NULL, 1, 1}, 1), ops[i]);
        expect_invalid(call_op(i, (flexdiag_list_steps){&t, 0, 1}, 1), ops[i]);
        expect_invalid(call_op(i, (flexdiag_list_steps){&t, 1, 0}, 1), ops[i]);
        /* no lists: no step to read */
        assert_int_equal(call_op(i, (flexdiag_list_steps){NULL, 1, 1}, 0), FLEXDIAG_OK);
    }
    /* both CPU tables point at these ops */
    const flexdiag_kernels *R = flexdiag__kernels_cpu_ref(), *F = flexdiag__kernels_cpu();
    assert_true(R->diag_slots == F->diag_slots && R->evict_plan == F->evict_plan &&
                R->evict_update == F->evict_update && R->alisa_plan == F->alisa_plan &&
                R->alisa_update == F->alisa_update);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_own_steps),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
