/*
 * fast_matmul.c - multi-threaded, cache-blocked Linear for the "cpu" table:
 * out (n, m) (+)= x (n, k) · W (m, k)ᵀ + b, W bf16.
 *
 * Work is split into output tiles of TILE_N rows × TILE_M columns, one task each, so every
 * output element is owned by exactly one task. A task walks k in blocks of BLOCK_K: it widens
 * the W block to fp32 once into a packed panel (STRIP columns interleaved per k, zero-padded past
 * m) and reuses it for all rows of the tile; micro-kernels then update an ROWS × STRIP block of
 * fp32 accumulators held in registers, with the column loop innermost so the compiler vectorises
 * it without reassociating anything. Each accumulator therefore sums x[i][c]·w[j][c] for
 * c = 0, 1, ..., k-1 in order, starting from 0, then adds the bias and the old output exactly as
 * ref_matmul.c does: results are bit-identical for any thread count (and to the reference).
 *
 * On x86-64 the task is also compiled for AVX2 (cpu_ops.h FLEXDIAG_CPU_CLONES): the same
 * multiplies and adds on 8 lanes instead of 4, the same bits (release build, 2-core AMD EPYC VM,
 * `flexdiag-bench profile --cpu`, five alternated runs: 4096-row GEMM 58-70 GFLOP/s against
 * 32-49; the built-in `generate`, 8 rows a decode step, shows no difference beyond its noise).
 * Rejected: a dot-product inner loop over k (vectorising it needs reassociation, which breaks
 * the fixed order); split-k across threads (needs a reduction whose order depends on the split).
 * Scratch per worker: the packed panel plus the tile's accumulators (80 KiB).
 */
#include <string.h>

#include "base/core.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_stream.h"

#define STRIP 16    /* columns per micro-kernel: 4 SSE / 2 AVX vectors */
#define ROWS 4      /* rows per micro-kernel: 4 × STRIP accumulators = 16 SSE registers */
#define TILE_M 64   /* columns per task: a multiple of STRIP; 64 tasks for m = 4096 */
#define TILE_N 64   /* rows per task: amortises widening a W block over up to 64 rows */
#define BLOCK_K 256 /* k per panel: TILE_M·BLOCK_K fp32 = 64 KiB, stays in L2 */

/* Arguments of one matmul job, shared by its tasks. */
typedef struct mm_job {
    float *out;        /* (n, m) */
    const float *x;    /* (n, k) */
    const uint16_t *w; /* (m, k) bf16 */
    const uint16_t *b; /* (m) bf16 or NULL */
    int64_t n, k, m;   /* sizes */
    int64_t tiles_m;   /* tasks along m */
    int accum;         /* add to the existing output */
} mm_job;

/* ---- packing ---- */

/* panel[s][c][j] = W[m0 + s·STRIP + j][k0 + c] as fp32 for c < kb, zero past column m. */
FLEXDIAG_CPU_INLINE void pack_panel(float *panel, const mm_job *jb, int64_t m0, int64_t mt, int64_t k0,
                       int64_t kb) {
    for (int64_t s = 0; s < TILE_M / STRIP; s++) {
        float *ps = panel + s * BLOCK_K * STRIP;
        for (int64_t j = 0; j < STRIP; j++) {
            int64_t col = s * STRIP + j;
            if (col >= mt) {
                for (int64_t c = 0; c < kb; c++) ps[c * STRIP + j] = 0.0f;
                continue;
            }
            const uint16_t *wr = jb->w + (m0 + col) * jb->k + k0;
            for (int64_t c = 0; c < kb; c++) ps[c * STRIP + j] = flexdiag__bf16_to_f32(wr[c]);
        }
    }
}

/* ---- micro-kernels ---- */

/* acc (ROWS, STRIP; row stride TILE_M) += x (ROWS, kb; row stride ldx) · p (kb, STRIP). */
FLEXDIAG_CPU_INLINE void kernel_rows4(float *acc, const float *x, int64_t ldx, const float *p, int64_t kb) {
    float c0[STRIP], c1[STRIP], c2[STRIP], c3[STRIP];
    memcpy(c0, acc, sizeof c0);
    memcpy(c1, acc + TILE_M, sizeof c1);
    memcpy(c2, acc + 2 * TILE_M, sizeof c2);
    memcpy(c3, acc + 3 * TILE_M, sizeof c3);
    for (int64_t c = 0; c < kb; c++) {
        const float *w = p + c * STRIP;
        float x0 = x[c], x1 = x[ldx + c], x2 = x[2 * ldx + c], x3 = x[3 * ldx + c];
        for (int j = 0; j < STRIP; j++) {
            c0[j] += x0 * w[j];
            c1[j] += x1 * w[j];
            c2[j] += x2 * w[j];
            c3[j] += x3 * w[j];
        }
    }
    memcpy(acc, c0, sizeof c0);
    memcpy(acc + TILE_M, c1, sizeof c1);
    memcpy(acc + 2 * TILE_M, c2, sizeof c2);
    memcpy(acc + 3 * TILE_M, c3, sizeof c3);
}

/* Four fp32 lanes: GCC/clang vector extension (plain C arithmetic, no intrinsics). */
typedef float vf4 __attribute__((vector_size(16)));

/* The one-row version of kernel_rows4 for the rows left over. Written with explicit vectors
 * because GCC otherwise vectorises this loop nest across c with shuffles (5× the instructions);
 * the arithmetic per element is the same multiply-then-add. */
FLEXDIAG_CPU_INLINE void kernel_row1(float *acc, const float *x, const float *p, int64_t kb) {
    vf4 c0[STRIP / 4];
    memcpy(c0, acc, sizeof c0);
    for (int64_t c = 0; c < kb; c++) {
        vf4 w[STRIP / 4];
        memcpy(w, p + c * STRIP, sizeof w);
        float x0 = x[c];
        for (int j = 0; j < STRIP / 4; j++) c0[j] += x0 * w[j];
    }
    memcpy(acc, c0, sizeof c0);
}

/* ---- tiles ---- */

/* acc (nt, TILE_M) += x rows n0..n0+nt, columns k0..k0+kb, times the packed panel. */
FLEXDIAG_CPU_INLINE void tile_update(float *acc, const float *panel, const mm_job *jb, int64_t n0, int64_t nt,
                        int64_t k0, int64_t kb) {
    for (int64_t s = 0; s < TILE_M / STRIP; s++) {
        const float *ps = panel + s * BLOCK_K * STRIP;
        int64_t i = 0;
        for (; i + ROWS <= nt; i += ROWS)
            kernel_rows4(acc + i * TILE_M + s * STRIP, jb->x + (n0 + i) * jb->k + k0, jb->k, ps,
                         kb);
        for (; i < nt; i++)
            kernel_row1(acc + i * TILE_M + s * STRIP, jb->x + (n0 + i) * jb->k + k0, ps, kb);
    }
}

/* out tile = acc + b (+ old out), in ref_matmul.c's order. */
FLEXDIAG_CPU_INLINE void tile_store(const float *acc, const mm_job *jb, int64_t n0, int64_t nt, int64_t m0,
                       int64_t mt) {
    for (int64_t i = 0; i < nt; i++)
        for (int64_t j = 0; j < mt; j++) {
            float y = acc[i * TILE_M + j];
            if (jb->b) y += flexdiag__bf16_to_f32(jb->b[m0 + j]);
            float *o = jb->out + (n0 + i) * jb->m + m0 + j;
            *o = jb->accum ? *o + y : y;
        }
}

/* Task t: output tile (t / tiles_m, t % tiles_m). */
FLEXDIAG_CPU_CLONES static void mm_task(void *ctx, int64_t t, void *scratch) {
    const mm_job *jb = ctx;
    int64_t n0 = (t / jb->tiles_m) * TILE_N, m0 = (t % jb->tiles_m) * TILE_M;
    int64_t nt = jb->n - n0 < TILE_N ? jb->n - n0 : TILE_N;
    int64_t mt = jb->m - m0 < TILE_M ? jb->m - m0 : TILE_M;
    float *panel = scratch, *acc = panel + (TILE_M / STRIP) * BLOCK_K * STRIP;
    memset(acc, 0, (size_t)(nt * TILE_M) * sizeof(float));
    for (int64_t k0 = 0; k0 < jb->k; k0 += BLOCK_K) {
        int64_t kb = jb->k - k0 < BLOCK_K ? jb->k - k0 : BLOCK_K;
        pack_panel(panel, jb, m0, mt, k0, kb);
        tile_update(acc, panel, jb, n0, nt, k0, kb);
    }
    tile_store(acc, jb, n0, nt, m0, mt);
}

flexdiag_status flexdiag__cpu_fast_matmul(void *out, const void *x, const uint16_t *w,
                                          const uint16_t *b, int64_t n, int64_t k, int64_t m,
                                          unsigned flags, flexdiag_stream *s) {
    FLEXDIAG_TRY(flexdiag__cpu_matmul_check("matmul", out, x, w, n, k, m, flags));
    if (n == 0 || m == 0) return FLEXDIAG_OK;
    mm_job jb = {
        out, x, w, b, n, k, m, (m + TILE_M - 1) / TILE_M, (flags & FLEXDIAG_MM_ACCUM) != 0};
    int64_t tiles = ((n + TILE_N - 1) / TILE_N) * jb.tiles_m;
    size_t scratch = ((size_t)TILE_M * BLOCK_K + (size_t)TILE_N * TILE_M) * sizeof(float);
    return flexdiag__cpu_parallel_for(s, tiles, scratch, mm_task, &jb);
}
