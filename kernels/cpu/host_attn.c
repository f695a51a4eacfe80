/*
 * host_attn.c - decode attention of host-homed sequences computed on the host
 * (kernels.h flexdiag__host_attn_decode): the CPU attention of an offloading run, where a
 * micro-batch's KV cache never crosses the bus; its q/k/v rows come down and its attention
 * output goes up.
 *
 * fp32 activations (the CPU backends) run the "cpu" table's kv_append and attn_decode as they
 * are, so a run with CPU attention equals the resident one bit for bit. bf16 (CUDA) works per
 * (sequence, KV head) pair, a few pairs per pool task: it rotates the g query heads of its
 * group and its key head (RoPE in fp32 from cos/sin computed once per sequence, or taken from
 * the caller's scratch when an earlier call had the same positions; one rounding to bf16, as
 * the CUDA kv_append), writes the new K and V row into the host cache, then attends prompt rows
 * and ring slots with an online softmax over CHUNK-row chunks. The chunk's keys are widened to
 * fp32 as they are read (one interleave with zeros per 8 values, in the lane order below), four
 * at a time so that their dot products are independent chains of 8 partial sums; its values
 * are summed into 64 output columns (then 32, 16) held in registers across the chunk's rows.
 * The next chunk's rows are prefetched a row at a time between the chunk's own (its keys during the
 * logits, its values during the sums), across pairs too (a pair's first rows during the
 * previous pair's last chunk). The output is rounded to bf16 once. The KV is read once per
 * pair from memory (again from L1 for the other queries of a group).
 * Pairs own disjoint outputs and compute them in a fixed order: results do not depend on the
 * thread count or on how pairs are grouped into tasks.
 */
#include <math.h>
#include <string.h>

#include "base/core.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_stream.h"

#define CHUNK 32    /* keys per online-softmax update */
#define PAIRS 4     /* (sequence, KV head) pairs per pool task */
#define MAX_DH 256  /* head dims the config allows */

typedef struct bf16_job {
    const flexdiag_host_attn *h;
    int64_t width; /* qkv row: (h_q + 2 h_kv) d_h */
    int64_t block; /* cache rows per (sequence, KV head): p_cap + ring */
} bf16_job;

/* Task s: the RoPE cos/sin pairs of sequence s into cs (n_seq, d_h): cos then sin per pair. */
static void angles_task(void *ctx, int64_t s, void *scratch) {
    (void)scratch;
    const flexdiag_host_attn *h = ((const bf16_job *)ctx)->h;
    int32_t d_h = h->a.d_h;
    float *cs = h->cs + s * d_h;
    for (int32_t j = 0; j < d_h / 2; j++)
        flexdiag__cpu_rope_cos_sin(h->a.pos[s], j, d_h, h->a.rope_theta, &cs[2 * j], &cs[2 * j + 1]);
}

/* Rotate-half RoPE of one bf16 head x (d_h values) in place: fp32 rotation, one rounding. */
static void rope_head(uint16_t *x, const float *cs, int32_t d_h) {
    int32_t half = d_h / 2;
    for (int32_t j = 0; j < half; j++) {
        float a = flexdiag__bf16_to_f32(x[j]), b = flexdiag__bf16_to_f32(x[j + half]);
        float c = cs[2 * j], sn = cs[2 * j + 1];
        float lo = a * c, lo2 = b * sn, hi = b * c, hi2 = a * sn; /* no contraction */
        x[j] = flexdiag__f32_to_bf16(lo - lo2);
        x[j + half] = flexdiag__f32_to_bf16(hi + hi2);
    }
}

/* Scratch floats of a task with group g: q, acc (g, d_h), z (g, CHUNK), m, l (g). */
static size_t task_floats(int32_t g, int32_t d_h) {
    return 2 * (size_t)g * d_h + (size_t)g * CHUNK + 2 * (size_t)g;
}

/* Append the new K/V row of (sequence s, KV head kh), whose cache block starts at element blk,
 * and rotate its queries. */
static void append_row(const bf16_job *jb, int64_t s, int32_t kh, int64_t blk) {
    const flexdiag_host_attn *h = jb->h;
    const flexdiag_attn_args *a = &h->a;
    int32_t d_h = a->d_h, g = a->h_q / a->h_kv;
    uint16_t *row = (uint16_t *)h->qkv + s * jb->width;
    uint16_t *kq = row + ((int64_t)a->h_q + kh) * d_h, *vq = kq + (int64_t)a->h_kv * d_h;
    if (a->pos) {
        const float *cs = h->cs + s * d_h;
        for (int32_t q = 0; q < g; q++) rope_head(row + ((int64_t)kh * g + q) * d_h, cs, d_h);
        rope_head(kq, cs, d_h);
    }
    int64_t dst = blk + (int64_t)h->rows[s * a->h_kv + kh] * d_h;
    memcpy((uint16_t *)h->k + dst, kq, (size_t)d_h * 2);
    memcpy((uint16_t *)h->v + dst, vq, (size_t)d_h * 2);
}

/* Eight lanes of fp32 (GCC/Clang vector extensions: one AVX register, two SSE ones, or the
 * target's equivalent). The helpers are always inlined, so the calling convention of a 32-byte
 * vector on a target without AVX (-Wpsabi) never applies. */
#if defined(__clang__)
#if __has_warning("-Wpsabi")
#pragma clang diagnostic ignored "-Wpsabi"
#endif
#elif defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
typedef float v8f __attribute__((vector_size(32)));
typedef uint16_t v16h __attribute__((vector_size(32)));

/* Lane order: sixteen bf16 widen to fp32 by interleaving them with zeros, which AVX2 does per
 * 128-bit half (vpunpcklwd / vpunpckhwd): the first vector holds elements 0-3 and 8-11, the
 * second 4-7 and 12-15. q and the output accumulators are kept in that order within each
 * 16-element block (PERM16[i]: the element at position i), so K and V rows are used as read. */
static const int8_t PERM16[16] = {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15};

/* Lanes of a and b picked by index (0-15 a's, 16-31 b's): GCC before 12 spells it differently. */
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#define PICK16(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define PICK16(a, b, ...) __builtin_shuffle(a, b, (v16h){__VA_ARGS__})
#endif

FLEXDIAG_CPU_INLINE v8f load8(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

FLEXDIAG_CPU_INLINE void store8(float *p, v8f v) { memcpy(p, &v, sizeof v); }

/* The 16 bf16 at p as fp32 in lane order: *lo positions 0-7, *hi positions 8-15. */
FLEXDIAG_CPU_INLINE void widen16(const uint16_t *p, v8f *lo, v8f *hi) {
    v16h x, z = {0};
    memcpy(&x, p, sizeof x);
    v16h l = PICK16(z, x, 0, 16, 1, 17, 2, 18, 3, 19, 8, 24, 9, 25, 10, 26, 11, 27);
    v16h h = PICK16(z, x, 4, 20, 5, 21, 6, 22, 7, 23, 12, 28, 13, 29, 14, 30, 15, 31);
    memcpy(lo, &l, sizeof l);
    memcpy(hi, &h, sizeof h);
}

/* The 8 partial sums of a dot product into one value, in a fixed order. */
FLEXDIAG_CPU_INLINE float sum8(v8f p) {
    float s = 0.0f;
    for (int l = 0; l < 8; l++) s += p[l];
    return s;
}

/* The rows to prefetch while a chunk computes: the next chunk's (of this pair or the next). The
 * hardware prefetchers follow one sequential stream well but not a task's two (K and V), so
 * without them the loads would wait on the memory's latency one line at a time. */
typedef struct ahead {
    const uint16_t *k, *v; /* the K and V block the rows are in */
    const int64_t *off;    /* their offsets */
    int64_t n;             /* how many (0: none) */
} ahead;

/* Prefetch row c of the ahead list from block b (K or V), if there is one: a row at a time,
 * spread through the chunk's arithmetic, so that the loads in flight stay within what the
 * core can track instead of a burst of a chunk's lines that stalls it. */
FLEXDIAG_CPU_INLINE void prefetch_row(const uint16_t *b, const ahead *nx, int64_t c, int32_t d_h) {
    if (c < nx->n)
        for (int32_t e = 0; e < d_h; e += 32) /* 64-byte lines of bf16 */
            __builtin_prefetch(b + nx->off[c] + e);
}

/* Prefetch the ahead rows from c0 on, K and V: those a shorter chunk had no arithmetic for. */
FLEXDIAG_CPU_INLINE void prefetch_rest(const ahead *nx, int64_t c0, int32_t d_h) {
    for (int64_t c = c0; c < nx->n; c++) {
        prefetch_row(nx->k, nx, c, d_h);
        prefetch_row(nx->v, nx, c, d_h);
    }
}

/* z[i·CHUNK + c] = scale · q_i · K row c of the chunk (rows at kc + off[c]), for the g queries
 * (q in lane order): KEYS keys at a time so that their sums are independent chains, each key's
 * sum 8 partial sums over the lane-ordered products, the keys widened as they are read. */
#define KEYS 4
FLEXDIAG_CPU_INLINE void chunk_logits(const float *q, int32_t g, int32_t d_h, float scale,
                                const uint16_t *kc, const int64_t *off, int64_t nc, float *z,
                                const ahead *nx) {
    for (int32_t i = 0; i < g; i++) {
        const float *qi = q + (int64_t)i * d_h;
        int64_t c = 0;
        for (; c + KEYS <= nc; c += KEYS) {
            v8f p[KEYS], lo, hi;
            if (i == 0)
                for (int r = 0; r < KEYS; r++) prefetch_row(nx->k, nx, c + r, d_h);
            for (int r = 0; r < KEYS; r++) p[r] = (v8f){0};
            for (int32_t e = 0; e < d_h; e += 16) {
                v8f q0 = load8(qi + e), q1 = load8(qi + e + 8);
                for (int r = 0; r < KEYS; r++) {
                    widen16(kc + off[c + r] + e, &lo, &hi);
                    p[r] += q0 * lo;
                    p[r] += q1 * hi;
                }
            }
            for (int r = 0; r < KEYS; r++) z[i * CHUNK + c + r] = scale * sum8(p[r]);
        }
        for (; c < nc; c++) {
            v8f p = {0}, lo, hi;
            if (i == 0) prefetch_row(nx->k, nx, c, d_h);
            for (int32_t e = 0; e < d_h; e += 16) {
                widen16(kc + off[c] + e, &lo, &hi);
                p += load8(qi + e) * lo;
                p += load8(qi + e + 8) * hi;
            }
            z[i * CHUNK + c] = scale * sum8(p);
        }
    }
}

/* (a0, a1, a2, a3) += p · the 32 bf16 at vr, widened in lane order. */
FLEXDIAG_CPU_INLINE void add32(v8f *a0, v8f *a1, v8f *a2, v8f *a3, const uint16_t *vr, float p) {
    v8f l0, h0, l1, h1;
    widen16(vr, &l0, &h0);
    widen16(vr + 16, &l1, &h1);
    *a0 += p * l0, *a1 += p * h0, *a2 += p * l1, *a3 += p * h1;
}

/* acc_i += Σ_c p_ic · V row c for the g queries (acc in lane order), 64 columns (then 32, 16)
 * at a time held in registers over the chunk's rows (each element sums its rows in order c = 0,
 * 1, ...). 64 rather than 32 halves the passes over the chunk's rows; the same bits (this VM,
 * AMD EPYC, one thread, `tests/cpu/bench_host_attn 1`, five alternated runs, kernel rate over
 * the plain sum's of the same run at 82 / 338 / 626 rows: 0.53 / 0.77 / 0.80 against 0.46 /
 * 0.64 / 0.65 with 32). */
FLEXDIAG_CPU_INLINE void chunk_values(float *acc, int32_t g, int32_t d_h, const float *z,
                                const uint16_t *vc, const int64_t *off, int64_t nc,
                                const ahead *nx) {
    int32_t wide = d_h - d_h % 32, wide64 = d_h - d_h % 64;
    for (int32_t i = 0; i < g; i++) {
        for (int32_t e = 0; e < wide64; e += 64) {
            float *ai = acc + (int64_t)i * d_h + e;
            v8f a0 = load8(ai), a1 = load8(ai + 8), a2 = load8(ai + 16), a3 = load8(ai + 24);
            v8f a4 = load8(ai + 32), a5 = load8(ai + 40), a6 = load8(ai + 48), a7 = load8(ai + 56);
            for (int64_t c = 0; c < nc; c++) {
                if (i == 0 && e == 0) prefetch_row(nx->v, nx, c, d_h);
                const uint16_t *vr = vc + off[c] + e;
                float p = z[i * CHUNK + c];
                add32(&a0, &a1, &a2, &a3, vr, p);
                add32(&a4, &a5, &a6, &a7, vr + 32, p);
            }
            store8(ai, a0), store8(ai + 8, a1), store8(ai + 16, a2), store8(ai + 24, a3);
            store8(ai + 32, a4), store8(ai + 40, a5), store8(ai + 48, a6), store8(ai + 56, a7);
        }
        for (int32_t e = wide64; e < wide; e += 32) {
            float *ai = acc + (int64_t)i * d_h + e;
            v8f a0 = load8(ai), a1 = load8(ai + 8), a2 = load8(ai + 16), a3 = load8(ai + 24);
            for (int64_t c = 0; c < nc; c++) {
                if (i == 0 && e == 0) prefetch_row(nx->v, nx, c, d_h);
                add32(&a0, &a1, &a2, &a3, vc + off[c] + e, z[i * CHUNK + c]);
            }
            store8(ai, a0), store8(ai + 8, a1), store8(ai + 16, a2), store8(ai + 24, a3);
        }
        if (wide < d_h) { /* one 16-element block left */
            float *ai = acc + (int64_t)i * d_h + wide;
            v8f a0 = load8(ai), a1 = load8(ai + 8), lo, hi;
            for (int64_t c = 0; c < nc; c++) {
                if (i == 0 && wide == 0) prefetch_row(nx->v, nx, c, d_h);
                widen16(vc + off[c] + wide, &lo, &hi);
                a0 += z[i * CHUNK + c] * lo, a1 += z[i * CHUNK + c] * hi;
            }
            store8(ai, a0), store8(ai + 8, a1);
        }
    }
}

/* n bf16 at src (n a multiple of 16) into dst as fp32 in lane order. */
static void widen_ordered(float *dst, const uint16_t *src, int32_t n) {
    for (int32_t b = 0; b < n; b += 16)
        for (int i = 0; i < 16; i++) dst[b + i] = flexdiag__bf16_to_f32(src[b + PERM16[i]]);
}

/* The cache offsets (elements) of rows [j0, j0 + CHUNK) ∩ [0, n) of a (sequence, KV head)
 * block: prompt rows, then the ring slots of its list; returns how many. */
static int64_t chunk_offsets(const flexdiag_attn_args *a, const int32_t *slots, int64_t n_prompt,
                             int64_t n, int64_t j0, int64_t *off) {
    int64_t nc = n - j0 < CHUNK ? n - j0 : CHUNK;
    for (int64_t c = 0; c < nc; c++) {
        int64_t j = j0 + c;
        off[c] = (j < n_prompt ? j : a->p_cap + slots[j - n_prompt]) * a->d_h;
    }
    return nc;
}

/* One (sequence, KV head) pair of a job: its cache block and the rows it attends. */
typedef struct pair {
    int64_t s, blk;            /* sequence; first element of its block in K and V */
    int32_t kh;                /* KV head */
    const uint16_t *kc, *vc;   /* its K and V block */
    const int32_t *slots;      /* its ring slot list (NULL: none) */
    int64_t n_prompt, n;       /* prompt rows; rows attended */
} pair;

static pair pair_at(const bf16_job *jb, int64_t t) {
    const flexdiag_attn_args *a = &jb->h->a;
    pair p = {.s = t / a->h_kv, .kh = (int32_t)(t % a->h_kv)};
    p.blk = (p.s * a->h_kv + p.kh) * jb->block * a->d_h;
    p.kc = (const uint16_t *)jb->h->k + p.blk;
    p.vc = (const uint16_t *)jb->h->v + p.blk;
    int64_t li = flexdiag__slot_list(a, p.s, p.kh);
    p.slots = a->slots ? a->slots + li * a->max_slots : NULL;
    p.n_prompt = a->lp[p.s];
    p.n = p.n_prompt + a->n_slots[li];
    return p;
}

/* Pair p's rows [j0, j0 + CHUNK) as an ahead list, their offsets written into off. */
FLEXDIAG_CPU_INLINE ahead chunk_ahead(const flexdiag_attn_args *a, const pair *p, int64_t j0,
                                int64_t *off) {
    return (ahead){p->kc, p->vc, off, chunk_offsets(a, p->slots, p->n_prompt, p->n, j0, off)};
}

/* Attend pair p, the g query heads of its group; offs[x] holds its first chunk's offsets (rows
 * prefetched). Each chunk prefetches the next one's rows as it computes and, in p's last
 * chunk, next's first rows (offsets into offs[x'] for the chunk after p's last: *x on return). */
FLEXDIAG_CPU_INLINE void attend_pair(const bf16_job *jb, const pair *p, const pair *next,
                               int64_t (*offs)[CHUNK], int64_t *x, float *scratch) {
    const flexdiag_attn_args *a = &jb->h->a;
    int32_t g = a->h_q / a->h_kv, d_h = a->d_h;
    append_row(jb, p->s, p->kh, p->blk);
    float *q = scratch, *acc = q + (int64_t)g * d_h, *z = acc + (int64_t)g * d_h;
    float *m = z + (int64_t)g * CHUNK, *l = m + g;
    widen_ordered(q, (const uint16_t *)jb->h->qkv + p->s * jb->width + (int64_t)p->kh * g * d_h,
                  g * d_h);
    memset(acc, 0, (size_t)g * d_h * sizeof(float));
    for (int32_t i = 0; i < g; i++) m[i] = -INFINITY, l[i] = 0.0f;
    int64_t n = p->n;
    for (int64_t j0 = 0; j0 < n; j0 += CHUNK, *x ^= 1) {
        int64_t nc = n - j0 < CHUNK ? n - j0 : CHUNK, *off = offs[*x];
        ahead nx = {0};
        if (j0 + CHUNK < n) nx = chunk_ahead(a, p, j0 + CHUNK, offs[*x ^ 1]);
        else if (next) nx = chunk_ahead(a, next, 0, offs[*x ^ 1]);
        chunk_logits(q, g, d_h, a->scale, p->kc, off, nc, z, &nx);
        flexdiag__cpu_softmax_chunk(z, CHUNK, nc, m, l, acc, g, d_h);
        chunk_values(acc, g, d_h, z, p->vc, off, nc, &nx);
        prefetch_rest(&nx, nc, d_h);
    }
    if (n == 0 && next) { /* no chunk of p to overlap: next's first rows asked for now */
        ahead nx = chunk_ahead(a, next, 0, offs[*x ^ 1]);
        prefetch_rest(&nx, 0, d_h);
        *x ^= 1;
    }
    uint16_t *out = (uint16_t *)jb->h->out + (p->s * a->h_q + (int64_t)p->kh * g) * d_h;
    for (int32_t i = 0; i < g; i++) {
        float inv = n > 0 ? 1.0f / l[i] : 0.0f;
        for (int32_t e = 0; e < d_h; e++) /* from lane order */
            out[(int64_t)i * d_h + (e & ~15) + PERM16[e & 15]] =
                flexdiag__f32_to_bf16(acc[(int64_t)i * d_h + e] * inv);
    }
}

/* Task t: pairs [t·PAIRS, (t + 1)·PAIRS) ∩ [0, n_seq·h_kv) in turn (pair i: sequence i / h_kv,
 * KV head i % h_kv), one prefetch stream running through them, so a pair's first rows arrive
 * while the previous pair computes rather than at its own start. Also compiled for AVX2
 * (cpu_ops.h FLEXDIAG_CPU_CLONES); the dot products keep their 8 fixed partial sums, so both
 * versions give the same bits. */
FLEXDIAG_CPU_CLONES static void bf16_task(void *ctx, int64_t t, void *scratch) {
    const bf16_job *jb = ctx;
    const flexdiag_attn_args *a = &jb->h->a;
    int64_t i0 = t * PAIRS, i1 = (int64_t)a->n_seq * a->h_kv;
    if (i1 > i0 + PAIRS) i1 = i0 + PAIRS;
    int64_t offs[2][CHUNK], x = 0;
    pair p = pair_at(jb, i0);
    /* the first chunk's rows are on their way while the queries are rotated and widened */
    ahead first = chunk_ahead(a, &p, 0, offs[0]);
    prefetch_rest(&first, 0, a->d_h);
    for (int64_t i = i0; i < i1; i++) {
        int more = i + 1 < i1;
        pair next = more ? pair_at(jb, i + 1) : p;
        attend_pair(jb, &p, more ? &next : NULL, offs, &x, scratch);
        p = next;
    }
}

/* What the bf16 path needs beyond the attention checks: rows inside the block, RoPE scratch. */
static flexdiag_status check_bf16(const flexdiag_host_attn *h) {
    const flexdiag_attn_args *a = &h->a;
    if (a->d_h > MAX_DH || a->d_h % 16 || (a->pos && (!(a->rope_theta > 0.0f) || !h->cs)))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "host attn_decode: d_h = %d, rope_theta = %g, cs %s: need a d_h that "
                             "is a multiple of 16 up to %d and, with positions, theta > 0 and the "
                             "cs scratch",
                             a->d_h, (double)a->rope_theta, h->cs ? "set" : "NULL", MAX_DH);
    if (a->logits_out || a->lse_out || a->probs_out || a->diag_lag || a->prefix)
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "host attn_decode: no score outputs, Diagonal update or shared "
                             "prompt rows on bf16 data (position-only policies, per-sequence "
                             "prompt rows)");
    int64_t block = (int64_t)a->p_cap + a->ring;
    for (int64_t i = 0; i < (int64_t)a->n_seq * a->h_kv; i++)
        if (!h->rows || h->rows[i] < 0 || h->rows[i] >= block)
            return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                                 "host attn_decode: rows[%lld] outside the cache block [0, %lld)",
                                 (long long)i, (long long)block);
    return FLEXDIAG_OK;
}

flexdiag_status flexdiag__host_attn_decode(const flexdiag_host_attn *h, flexdiag_stream *cpu) {
    const flexdiag_attn_args *a = &h->a;
    if (h->act_bytes == 4) {
        const flexdiag_kernels *k = flexdiag__kernels_cpu();
        FLEXDIAG_TRY(k->kv_append(h->k, h->v, h->qkv, h->rows, a->n_seq, 1, a, cpu));
        return k->attn_decode(h->out, h->qkv, h->k, h->v, a, cpu);
    }
    if (h->act_bytes != 2)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "host attn_decode: act_bytes %d (need 4 for fp32 or 2 for bf16)",
                             h->act_bytes);
    FLEXDIAG_TRY(flexdiag__cpu_attn_check("host attn_decode", h->out, h->qkv, h->k, h->v, a, 1));
    FLEXDIAG_TRY(check_bf16(h));
    if (a->n_seq == 0) return FLEXDIAG_OK;
    bf16_job jb = {h, ((int64_t)a->h_q + 2 * a->h_kv) * a->d_h, (int64_t)a->p_cap + a->ring};
    if (a->pos && !h->cs_ready)
        FLEXDIAG_TRY(flexdiag__cpu_parallel_for(cpu, a->n_seq, 0, angles_task, &jb));
    int64_t pairs = (int64_t)a->n_seq * a->h_kv;
    return flexdiag__cpu_parallel_for(cpu, (pairs + PAIRS - 1) / PAIRS,
                                      task_floats(a->h_q / a->h_kv, a->d_h) * sizeof(float),
                                      bf16_task, &jb);
}
