/*
 * cpu_harness.c - guarded buffers, streams and the random attention fixture of the CPU kernel
 * tests (see cpu_harness.h).
 */
#include "cpu_harness.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

/* ---- guarded buffers ---- */

/* The known value of guard float i (distinct, non-zero, never a plausible kernel output). */
static float guard_value(int64_t i) { return -7777.0f - (float)i * 0.5f; }

float *ch_guarded(int64_t n, float fill) {
    float *base = malloc((size_t)(n + 2 * CH_GUARD) * sizeof(float));
    assert_non_null(base);
    for (int64_t i = 0; i < CH_GUARD; i++) {
        base[i] = guard_value(i);
        base[CH_GUARD + n + i] = guard_value(CH_GUARD + i);
    }
    for (int64_t i = 0; i < n; i++) base[CH_GUARD + i] = fill;
    return base + CH_GUARD;
}

void ch_guard_check(const float *p, int64_t n, const char *label) {
    const float *base = p - CH_GUARD;
    for (int64_t i = 0; i < CH_GUARD; i++) {
        float lo = guard_value(i), hi = guard_value(CH_GUARD + i);
        if (memcmp(&base[i], &lo, 4) != 0 || memcmp(&p[n + i], &hi, 4) != 0)
            fail_msg("%s: guard region overwritten at offset %lld", label, (long long)i);
    }
}

void ch_guarded_free(float *p) {
    if (p) free(p - CH_GUARD);
}

/* ---- streams ---- */

flexdiag_stream *ch_stream(const flexdiag_kernels *K, int threads) {
    if (threads < 0) return NULL;
    flexdiag_stream *s = NULL;
    assert_int_equal(K->stream_create(0, threads, &s), FLEXDIAG_OK);
    assert_non_null(s);
    return s;
}

/* ---- attention fixture ---- */

/* First n entries of a random permutation of 0..ring-1 into out. */
static void random_slots(tu_rng *r, int32_t *out, int32_t n, int32_t ring) {
    int32_t *perm = malloc((size_t)(ring > 0 ? ring : 1) * sizeof *perm);
    assert_non_null(perm);
    for (int32_t i = 0; i < ring; i++) perm[i] = i;
    for (int32_t i = ring - 1; i > 0; i--) {
        int32_t j = (int32_t)tu_rng_int(r, 0, i), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    memcpy(out, perm, (size_t)n * sizeof *out);
    free(perm);
}

void ch_attn_fix_init(ch_attn_fix *f, const ch_attn_case *c, uint64_t seed) {
    tu_rng r;
    tu_rng_seed(&r, seed);
    memset(f, 0, sizeof *f);
    f->width = ((int64_t)c->h_q + 2 * c->h_kv) * c->d_h;
    f->cache_n = (int64_t)c->n_seq * c->h_kv * (c->p_cap + c->ring) * c->d_h;
    f->qkv_dec = malloc((size_t)(c->n_seq * f->width) * sizeof(float));
    f->qkv_pre = malloc((size_t)(c->n_seq * c->p_cap * f->width + 1) * sizeof(float));
    f->k = malloc((size_t)f->cache_n * sizeof(float));
    f->v = malloc((size_t)f->cache_n * sizeof(float));
    f->lp = malloc((size_t)c->n_seq * sizeof(int32_t));
    f->n_slots = malloc((size_t)(c->n_seq * c->h_kv) * sizeof(int32_t));
    f->slots = calloc((size_t)(c->n_seq * c->h_kv * c->max_slots + 1), sizeof(int32_t));
    assert_true(f->qkv_dec && f->qkv_pre && f->k && f->v && f->lp && f->n_slots && f->slots);
    tu_fill_f32(&r, f->qkv_dec, c->n_seq * f->width, 1.0f);
    tu_fill_f32(&r, f->qkv_pre, c->n_seq * c->p_cap * f->width, 1.0f);
    tu_fill_f32(&r, f->k, f->cache_n, 1.0f);
    tu_fill_f32(&r, f->v, f->cache_n, 1.0f);
    for (int32_t s = 0; s < c->n_seq; s++) {
        f->lp[s] = s == 0 ? c->p_cap : s == 1 ? 0 : (int32_t)tu_rng_int(&r, 0, c->p_cap);
        for (int32_t h = 0; h < c->h_kv; h++) {
            int64_t sh = (int64_t)s * c->h_kv + h;
            int32_t ns = (s % 2 == 1 && h == 0) ? 0 : (int32_t)tu_rng_int(&r, 0, c->max_slots);
            if (s == 0 && h == c->h_kv - 1) ns = c->max_slots; /* one full slot list */
            f->n_slots[sh] = ns;
            random_slots(&r, f->slots + sh * c->max_slots, ns, c->ring);
        }
    }
    flexdiag_attn_args a = {.n_seq = c->n_seq,
                            .h_q = c->h_q,
                            .h_kv = c->h_kv,
                            .d_h = c->d_h,
                            .p_cap = c->p_cap,
                            .ring = c->ring,
                            .scale = 1.0f / sqrtf((float)c->d_h),
                            .lp = f->lp,
                            .slots = f->slots,
                            .n_slots = f->n_slots,
                            .max_slots = c->max_slots};
    f->a = a;
}

void ch_attn_fix_free(ch_attn_fix *f) {
    free(f->qkv_dec);
    free(f->qkv_pre);
    free(f->k);
    free(f->v);
    free(f->lp);
    free(f->slots);
    free(f->n_slots);
    memset(f, 0, sizeof *f);
}
