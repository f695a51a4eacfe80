/*
 * attn_decode.cu - the CUDA attn_decode op: one query token per sequence (a window pass: win of
 * them, kernels.h win) attends its prompt rows and the ring rows its KV policy selected
 * (docs/policies.md §4.3), the hot kernel of decoding.
 *
 * One CTA per (query row, KV head) (× ceil(g / 8) head chunks) runs all query heads of the
 * group, so each K/V row is read once and used g times. Query row q is query q % win of
 * sequence s = q / win: it reads s's block, lp[s] and prefix[s], and everything else (qkv and
 * out rows, its slot list, the policy outputs) as row q. Key list: j < lp are prompt rows
 * (contiguous: in the block, or with shared prompt KV in the sequence's prefix block of the
 * prompt-only store, which the sequences of one prompt read through L2), j >= lp ring rows
 * p_cap + slots[q][h][j - lp] (token-granular gather; the list of (q, h), of row q or one
 * for all as shared_slots says: dec_list), the CTA's slots staged in shared memory first
 * (short lists excepted) so key loads never wait on a slot load. A row of d_h bf16 is split over
 * L = d_h / 8 lanes
 * with 16-byte loads; each such row group takes every NG-th key, U per iteration, all loads
 * issued before use, and keeps its own fp32 online-softmax state (m, l, acc) per head; groups
 * merge by shuffles, warps through shared memory.
 * Policy scores, fused (§4.3): all g logits of a key sit in the row group's registers, so
 * Diagonal's build-up update folds max-over-the-group, then a lexicographic (score, -lag)
 * minimum, into per-thread registers as keys pass; shuffles and shared memory reduce it and one
 * thread rewrites the lag with the sequence's diag_next[s], unless that is negative (no extra
 * pass over K, no logits written). H2O/TOVA/ALISA get
 * probabilities: the ring logits go to probs_out during the pass and the epilogue, once lse is
 * known, turns them into expf(logit - lse) in place (same CTA, after a barrier).
 * Small batches (< 2 CTAs per multiprocessor) split each list over up to 16 CTAs that write
 * (acc, m, l) to the stream's workspace (stream-ordered scratch), merged by a second kernel.
 * Cascade (opt-in, FLEXDIAG_CASCADE=1; shared prompt KV with the caller's plan, prompts read
 * by >= 2 sequences on average): a first kernel attends each prompt-only block once per tile
 * of the query rows that share it (its K / V in shared memory, one key per lane) and leaves
 * each row's (acc, m, l) in the workspace; the decode kernel then walks the ring keys only and
 * folds that partial into its result by the log-sum-exp rule, so the prompt rows are read once
 * per group instead of once per sequence.
 * Head-major order (shared prompt KV without the cascade; FLEXDIAG_DEC_HEAD_MAJOR=0 turns it
 * off): CTA x attends (sequence x mod n_seq, KV head x / n_seq), so the CTAs resident together
 * share a head's few prompt blocks and find their rows in L1 (decode_head_major).
 * lp, slots, n_slots are device data (no host sync to check them): lp and n_slots are clamped
 * and a slot outside the ring masks its key (logit -inf, no load), so bad metadata never
 * reads outside its block. Rejected: a CTA per query head (g re-reads), staging K/V in shared
 * memory (each row feeds one row group only); for short single-head lists, copying all K/V
 * rows to shared memory by cp.async after one metadata round trip (two round trips instead of
 * one per chunk, but 5 instead of 8 CTAs per multiprocessor: H100, 872 sequences of 79 keys,
 * 313 against 222 us a layer).
 */
#include "kernels/cuda/attn.cuh"
#include "kernels/cuda/cuda_common.cuh"

/* Threads per CTA: 4 warps; a (sequence, KV head) of a few hundred keys fills them, and several
 * CTAs per multiprocessor keep enough loads in flight for HBM. */
#define DEC_THREADS 128
#define DEC_WARPS (DEC_THREADS / 32)
/* Query heads one CTA serves at most (register budget: 16 fp32 values per head per lane). */
#define DEC_MAX_G FLEXDIAG__CUDA_DEC_MAX_G
/* CTAs per multiprocessor asked of the register allocator for groups of <= 4 heads: without the
 * hint ptxas spills a few bytes at g = 1 (seen with nvcc 13.0); 4 keeps <= 128 registers and
 * no spills for every instantiation. g = 8 needs ~255 registers and gets no hint. */
#define DEC_MIN_CTAS 4
/* The short-list instantiation (g = 1, U = 2) is latency-bound: ask for 8 CTAs (64 registers,
 * no spills with nvcc 13.0) so twice the loads are in flight per multiprocessor. */
#define DEC_SHORT_CTAS 8
/* Split-K: at most this many CTAs per key list, each with at least DEC_SPLIT_KEYS keys (two
 * iterations of the widest row-group layout, so a split never runs mostly empty). */
#define DEC_MAX_SPLITS 16
/* Key lists up to this long count as short (decode_launch). */
#define DEC_SHORT_KEYS 128
#define DEC_SPLIT_KEYS 64

/* Ring slots of a CTA's key range staged in shared memory up front (one coalesced load, in
 * flight together with the query), so no key load waits on its slot index; longer ranges read
 * the slot list from global memory as they go, and so do short lists (the U = 2 kernel): their
 * prompt keys come first, so the slot loads overlap them, and the barrier costs more than it
 * saves (H200, 64 sequences, 50 + 29 keys: 32.8 us without staging, 34.0 us with). */
#define DEC_SMEM_SLOTS 1024

/* Floats per split-K partial: D outputs, m, l, and 2 more (16-byte alignment) that carry a
 * split's Diagonal candidate (score, entry as int bits) in the group's first head row. */
#define DEC_PART(D) ((D) + 4)

#define DEC_LOG2E 1.4426950408889634f

/* Launch-time constants of one call (kernels.h flexdiag_attn_args, device pointers). */
typedef struct decode_params {
    int32_t h_q, h_kv, g;         /* heads; g = h_q / h_kv */
    int32_t p_cap, ring;          /* rows per (seq, KV head) block: p_cap prompt + ring */
    int32_t max_slots;            /* stride of slots and logits_out */
    int32_t splits;               /* CTAs per key list (grid z); 1 = no split */
    float scale;                  /* logit scale */
    const int32_t *lp;            /* (n_seq) prompt rows */
    const int32_t *slots;         /* (n_seq·win, h_kv, max_slots) ring rows */
    const int32_t *n_slots;       /* (n_seq·win, h_kv) valid slots */
    int32_t shared;               /* FLEXDIAG_SLOTS_*: lists per (seq, KV head), one for all
                                     or per sequence (dec_list) */
    float *logits_out;            /* (n_seq·win, h_q, max_slots) or NULL */
    float *lse_out;               /* (n_seq·win, h_q) or NULL */
    float *probs_out;             /* (n_seq·win, h_q, max_slots) or NULL */
    int16_t *diag_lag;            /* (n_seq, h_kv, diag_a) lag lists or NULL (kernels.h) */
    int32_t diag_a, diag_base;
    const int32_t *diag_next;     /* (n_seq) the new lag of each sequence, < 0: none */
    float *part;                  /* splits > 1: (n_seq·win·h_q, splits, DEC_PART(d_h)) acc|m|l,
                                     Diagonal's partial (score, entry) in the first head's pad */
    const int32_t *prefix;        /* (n_seq) shared prompt block of each sequence, or NULL */
    const uint4 *kpre, *vpre;     /* the prompt-only stores (n_pre, h_kv, pre_cap, d_h) */
    int32_t n_pre, pre_cap;
    int32_t n_seq;
    int32_t win;                  /* query rows per sequence (kernels.h win, >= 1): row q reads
                                     sequence q / win's block */
    const int32_t *casc_seq, *casc_tile; /* the cascade plan (kernels.h): every sequence in
                                            one tile, or its prompt part is undefined */
    float *pre_part;              /* cascade: (n_seq·h_q, DEC_PART(d_h)) prompt partials acc|m|l,
                                     the decode kernel then skips the prompt keys; or NULL */
    int32_t head_major;           /* 1: CTA x = h·n_seq·win + q, else q·h_kv + h (query row q;
                                     decode_head_major) */
} decode_params;

/* ---- small device helpers ---- */

/* The slot list (index into n_slots; times max_slots into slots) of query row q, KV head h under
 * p.shared: kernels.h flexdiag__slot_list on the device (lists are per row, kernels.h win). */
static __device__ __forceinline__ int64_t dec_list(const decode_params &p, int64_t q, int h) {
    return p.shared == FLEXDIAG_SLOTS_ONE ? 0
           : p.shared == FLEXDIAG_SLOTS_PER_SEQ ? q
                                                : q * p.h_kv + h;
}

/* The query row q (of n_seq·win) and KV head h this CTA attends for: CTA x = q·h_kv + h, or
 * head-major x = h·n_seq·win + q (decode_head_major). */
static __device__ __forceinline__ void dec_cta(const decode_params &p, int &q, int &h) {
    const int x = (int)blockIdx.x, rows = p.n_seq * p.win;
    h = p.head_major ? x / rows : x % p.h_kv;
    q = p.head_major ? x - h * rows : x / p.h_kv;
}

/* 8 bf16 of a 16-byte vector to fp32 (element 0 in the low half of word 0). */
static __device__ __forceinline__ void bf16x8_to_f32(uint4 w, float f[8]) {
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(u[i] << 16);
        f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
}

/* 8 fp32 to 8 bf16 (round to nearest even) in a 16-byte vector. */
static __device__ __forceinline__ uint4 f32_to_bf16x8(const float f[8]) {
    uint32_t u[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        __nv_bfloat162 b = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
        memcpy(&u[i], &b, 4);
    }
    return make_uint4(u[0], u[1], u[2], u[3]);
}

/* exp(x - m) with the -inf guard: m == -inf (no key seen yet) gives exp(x) of a -inf x = 0. */
static __device__ __forceinline__ float exp_shift(float x, float m) {
    return exp2f((x - (m == -INFINITY ? 0.0f : m)) * DEC_LOG2E);
}

/* Diagonal's candidate of a key range: lowest group score, larger lag on ties (docs/policies.md
 * §2.3 step 4); e < 0 = none yet. */
struct dec_amin {
    float s;
    int e;
};

/* Whether list entry e with score sc beats the candidate b (lags read only on exact ties: the
 * lags of a list are distinct, so (score, -lag) is a total order). */
static __device__ __forceinline__ bool amin_beats(float sc, int e, dec_amin b,
                                                  const int16_t *lag) {
    if (e < 0) return false;
    if (b.e < 0 || sc < b.s) return true;
    return sc == b.s && lag[e] > lag[b.e];
}

static __device__ __forceinline__ void amin_fold(dec_amin &b, float sc, int e,
                                                 const int16_t *lag) {
    if (amin_beats(sc, e, b, lag)) b = {sc, e};
}

/* expf(z - lse), 0 when the row attended nothing (lse = -inf): the CPU backend's formula. */
static __device__ __forceinline__ float dec_prob(float z, float lse) {
    return lse == -INFINITY ? 0.0f : expf(z - lse);
}

/* ---- per-CTA pieces ---- */

/* One lane's online-softmax state for G query heads: max logit, normaliser, and the lane's 8
 * elements of the unnormalised output. */
template <int G> struct dec_state {
    float m[G], l[G], acc[G][8];
};

/* The keys of one CTA: cache block of its (sequence, KV head), offset to the lane's 16 bytes. */
struct dec_keys {
    const uint4 *kb, *vb; /* K / V row 0 of the block, + the lane's chunk */
    const uint4 *kp, *vp; /* K / V prompt row 0: the block's, or its shared prefix block's */
    const int32_t *sl;    /* slot list of the block, indexed by list entry - lp */
    float *lg;            /* logits_out of the first query head, or NULL */
    float *pg;            /* probs_out of the first query head (logits until the epilogue) */
    int16_t *dl;          /* Diagonal: this list's lags, or NULL (no update this call) */
    int lp;               /* prompt keys: list entries 0..lp-1 */
    int n;                /* list length lp + n_slots */
    int jb, je;           /* this CTA's part of the list (split-K) */
};

/* One row group's U keys of an iteration in flight: validity and the K / V vectors. */
template <int U> struct dec_chunk {
    bool ok[U];
    uint4 kr[U], vr[U];
};

/* Issue the loads of the chunk at j0: key j0 + u·NG + grp for u < U; an invalid slot index
 * (or a key past je) masks its key and loads nothing. */
template <int D, int U>
static __device__ __forceinline__ void dec_fetch(dec_chunk<U> &c, const dec_keys &k,
                                                 const decode_params &p, int j0, int grp) {
    constexpr int L = D / 8, NG = DEC_WARPS * (32 / L);
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int j = j0 + u * NG + grp;
        int32_t row = j;
        const uint4 *kb = k.kp, *vb = k.vp;
        c.ok[u] = j < k.je;
        if (c.ok[u] && j >= k.lp) {
            const int32_t slot = k.sl[j - k.lp];
            c.ok[u] = (uint32_t)slot < (uint32_t)p.ring;
            row = p.p_cap + slot;
            kb = k.kb, vb = k.vb;
        }
        c.kr[u] = c.vr[u] = make_uint4(0, 0, 0, 0);
        if (c.ok[u]) {
            c.kr[u] = __ldg(kb + (int64_t)row * L);
            c.vr[u] = __ldg(vb + (int64_t)row * L);
        }
    }
}

/* Fold the chunk at j0 into the online-softmax state; POL: also write its ring logits and fold
 * Diagonal's candidates (the policy outputs the call asked for). */
template <int D, int G, int U, bool POL>
static __device__ __forceinline__ void dec_consume(dec_state<G> &st, dec_amin &am,
                                                   const float (&q)[G][8],
                                                   const dec_chunk<U> &c, const dec_keys &k,
                                                   const decode_params &p, int j0, int grp,
                                                   int sub, int ng) {
    constexpr int L = D / 8, NG = DEC_WARPS * (32 / L);
    /* per-key logits z[u][i] = scale·(q_i·k_u), complete in every lane of the group */
    float z[U][G];
#pragma unroll
    for (int u = 0; u < U; u++) {
        float kf[8];
        bf16x8_to_f32(c.kr[u], kf);
#pragma unroll
        for (int i = 0; i < G; i++) {
            float d = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; e++) d = fmaf(q[i][e], kf[e], d);
            z[u][i] = d;
        }
    }
#pragma unroll
    for (int o = L / 2; o > 0; o >>= 1)
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int i = 0; i < G; i++) z[u][i] += __shfl_xor_sync(0xffffffffu, z[u][i], o);
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int i = 0; i < G; i++) z[u][i] = c.ok[u] ? z[u][i] * p.scale : -INFINITY;
    if (POL && (k.lg || k.pg) && sub == 0) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = j0 + u * NG + grp;
            if (j >= k.lp && j < k.je)
#pragma unroll
                for (int i = 0; i < G; i++) {
                    if (i >= ng) continue;
                    const int64_t o = (int64_t)i * p.max_slots + (j - k.lp);
                    if (k.lg) k.lg[o] = z[u][i];
                    if (k.pg) k.pg[o] = z[u][i];
                }
        }
    }
    if (POL && k.dl) { /* Diagonal build-up: ring column c holds list entry n - 1 - j */
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = j0 + u * NG + grp;
            const int e = k.n - 1 - j; /* < diag_a also for bad n_slots: no write outside */
            if (j - k.lp < p.diag_base || j >= k.je || e >= p.diag_a) continue;
            float sc = z[u][0];
#pragma unroll
            for (int i = 1; i < G; i++)
                if (i < ng) sc = fmaxf(sc, z[u][i]);
            amin_fold(am, sc, e, k.dl);
        }
    }
    /* online softmax: one rescale per iteration and head */
    float vf[U][8];
#pragma unroll
    for (int u = 0; u < U; u++) bf16x8_to_f32(c.vr[u], vf[u]);
#pragma unroll
    for (int i = 0; i < G; i++) {
        float mx = z[0][i];
#pragma unroll
        for (int u = 1; u < U; u++) mx = fmaxf(mx, z[u][i]);
        const float mn = fmaxf(st.m[i], mx);
        const float corr = exp_shift(st.m[i], mn);
        float pu[U], sum = 0.0f;
#pragma unroll
        for (int u = 0; u < U; u++) {
            pu[u] = exp_shift(z[u][i], mn);
            sum += pu[u];
        }
        st.l[i] = st.l[i] * corr + sum;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            float a = st.acc[i][e] * corr;
#pragma unroll
            for (int u = 0; u < U; u++) a = fmaf(pu[u], vf[u][e], a);
            st.acc[i][e] = a;
        }
        st.m[i] = mn;
    }
}

/* Walk keys jb..je-1: row group grp takes keys jb + grp, jb + grp + NG, ..., U per iteration;
 * the next iteration's loads are issued before this one's math (one chunk of prefetch), so a
 * short list costs about one memory round trip rather than one per iteration. */
template <int D, int G, int U, bool POL>
static __device__ __forceinline__ void dec_attend(dec_state<G> &st, dec_amin &am,
                                                  const float (&q)[G][8],
                                                  const dec_keys &k, const decode_params &p,
                                                  int grp, int sub, int ng) {
    constexpr int L = D / 8, NG = DEC_WARPS * (32 / L);
    if (k.jb >= k.je) return;
    dec_chunk<U> cur, nxt;
    dec_fetch<D, U>(cur, k, p, k.jb, grp);
    for (int j0 = k.jb; j0 < k.je; j0 += NG * U) {
        const bool more = j0 + NG * U < k.je;
        if (more) dec_fetch<D, U>(nxt, k, p, j0 + NG * U, grp);
        dec_consume<D, G, U, POL>(st, am, q, cur, k, p, j0, grp, sub, ng);
        if (more) cur = nxt;
    }
}

/* Merge the row groups of a warp: lanes L, 2L, ... apart hold the same output elements. */
template <int D, int G>
static __device__ __forceinline__ void dec_merge_warp(dec_state<G> &st) {
#pragma unroll
    for (int o = D / 8; o < 32; o <<= 1) {
#pragma unroll
        for (int i = 0; i < G; i++) {
            const float mo = __shfl_xor_sync(0xffffffffu, st.m[i], o);
            const float lo = __shfl_xor_sync(0xffffffffu, st.l[i], o);
            const float mn = fmaxf(st.m[i], mo);
            const float ca = exp_shift(st.m[i], mn), cb = exp_shift(mo, mn);
            st.l[i] = st.l[i] * ca + lo * cb;
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const float ao = __shfl_xor_sync(0xffffffffu, st.acc[i][e], o);
                st.acc[i][e] = st.acc[i][e] * ca + ao * cb;
            }
            st.m[i] = mn;
        }
    }
}

/* Fold a partial (acc | m | l, DEC_PART(D) floats: the cascade's prompt part) into the state
 * (o = output elements 8c..8c+7, mx, lsum) by the log-sum-exp rule. */
template <int D>
static __device__ __forceinline__ void dec_fold(const float *pp, int c, float o[8], float &mx,
                                                float &lsum) {
    const float mp = pp[D], mn = fmaxf(mx, mp);
    const float a = exp_shift(mx, mn), b = exp_shift(mp, mn);
    lsum = lsum * a + pp[D + 1] * b;
#pragma unroll
    for (int e = 0; e < 8; e++) o[e] = fmaf(pp[c * 8 + e], b, o[e] * a);
    mx = mn;
}

/* Final (acc, m, l) of query head row sq (= s·h_q + hq), 8 elements from chunk c: bf16 output
 * and lse, or (split-K) the unnormalised partial of split z. */
template <int D>
static __device__ __forceinline__ void dec_write(uint4 *out, const decode_params &p, int64_t sq,
                                                 int c, float o[8], float mx, float lsum) {
    if (p.splits > 1) {
        float *dst = p.part + (sq * p.splits + blockIdx.z) * DEC_PART(D);
        reinterpret_cast<float4 *>(dst)[2 * c] = make_float4(o[0], o[1], o[2], o[3]);
        reinterpret_cast<float4 *>(dst)[2 * c + 1] = make_float4(o[4], o[5], o[6], o[7]);
        if (c == 0) {
            dst[D] = mx;
            dst[D + 1] = lsum;
        }
        return;
    }
    /* no attended key (lp = 0, no slots): zeros and lse = -inf. __frcp_rn: a correctly rounded
     * reciprocal without the division slow-path call (and its stack frame). */
    const float inv = lsum == 0.0f ? 0.0f : __frcp_rn(lsum);
#pragma unroll
    for (int e = 0; e < 8; e++) o[e] *= inv;
    out[sq * (D / 8) + c] = f32_to_bf16x8(o);
    if (c == 0 && p.lse_out) p.lse_out[sq] = lsum == 0.0f ? -INFINITY : mx + logf(lsum);
}

/* Reduce the CTA's Diagonal candidates (row groups by shuffles, warps through shared memory);
 * thread 0 rewrites the winning lag with diag_next[s] of the CTA's sequence s (its query row:
 * the update comes with win 1 only; nothing when it is negative), or under split-K leaves the
 * split's candidate in the pad of the first head's partial for attn_decode_merge. s is found
 * again from the CTA index rather than kept live through the key loop (one register less: no
 * spills at g = 1, d_h 128). */
template <int D>
static __device__ void dec_diag_finish(dec_amin am, const dec_keys &k, const decode_params &p,
                                       int64_t sq0, float *sm_s, int *sm_e) {
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
#pragma unroll
    for (int o = D / 8; o < 32; o <<= 1) {
        const float so = __shfl_xor_sync(0xffffffffu, am.s, o);
        const int eo = __shfl_xor_sync(0xffffffffu, am.e, o);
        amin_fold(am, so, eo, k.dl);
    }
    if (lane == 0) {
        sm_s[warp] = am.s;
        sm_e[warp] = am.e;
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int w = 1; w < DEC_WARPS; w++) amin_fold(am, sm_s[w], sm_e[w], k.dl);
    if (p.splits > 1) {
        float *dst = p.part + (sq0 * p.splits + blockIdx.z) * DEC_PART(D);
        dst[D + 2] = am.s;
        dst[D + 3] = __int_as_float(am.e);
    } else if (am.e >= 0) {
        int s, h;
        dec_cta(p, s, h);
        const int32_t next = __ldg(p.diag_next + s);
        if (next >= 0) k.dl[am.e] = (int16_t)next;
    }
}

/* Shared memory of the merge across warps: each warp's state, and each head row's lse for the
 * probability epilogue. */
template <int D, int G> struct dec_merge_smem {
    float acc[DEC_WARPS][G][D];
    float m[DEC_WARPS][G], l[DEC_WARPS][G];
    float lse[G];
};

/* Merge the row groups (shuffles) and the warps (shared memory) of the CTA's state and write its
 * ng head rows from sq0 on, the cascade's prompt partial folded in; LSE: also leave each row's
 * lse in sm.lse (visible after a barrier). */
template <int D, int G, bool LSE>
static __device__ __forceinline__ void dec_finish(dec_state<G> &st, uint4 *out,
                                                  const decode_params &p, int64_t sq0, int ng,
                                                  dec_merge_smem<D, G> &sm) {
    constexpr int L = D / 8;
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5, sub = lane % L;
    dec_merge_warp<D, G>(st);
    if (lane < L) {
#pragma unroll
        for (int i = 0; i < G; i++) {
#pragma unroll
            for (int e = 0; e < 8; e++) sm.acc[warp][i][sub * 8 + e] = st.acc[i][e];
            if (sub == 0) {
                sm.m[warp][i] = st.m[i];
                sm.l[warp][i] = st.l[i];
            }
        }
    }
    __syncthreads();
    for (int t = (int)threadIdx.x; t < G * L; t += DEC_THREADS) {
        const int i = t / L, c = t % L;
        if (i >= ng) continue;
        float mx = sm.m[0][i];
#pragma unroll
        for (int w = 1; w < DEC_WARPS; w++) mx = fmaxf(mx, sm.m[w][i]);
        float lsum = 0.0f, o[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
        for (int w = 0; w < DEC_WARPS; w++) {
            const float f = exp_shift(sm.m[w][i], mx);
            lsum += sm.l[w][i] * f;
#pragma unroll
            for (int e = 0; e < 8; e++) o[e] = fmaf(sm.acc[w][i][c * 8 + e], f, o[e]);
        }
        if (p.pre_part && p.splits == 1)
            dec_fold<D>(p.pre_part + (sq0 + i) * DEC_PART(D), c, o, mx, lsum);
        dec_write<D>(out, p, sq0 + i, c, o, mx, lsum);
        if (LSE && c == 0) sm.lse[i] = lsum == 0.0f ? -INFINITY : mx + logf(lsum);
    }
}

/* ---- kernels ---- */

/* out (n_seq·win, h_q·D) bf16; qkv (n_seq·win, (h_q + 2·h_kv)·D) bf16; kc, vc caches; all as
 * 16-byte vectors. G query heads per CTA (ng <= G of them live), U keys per row group per
 * iteration. POL: the call asked for policy outputs (logits, probabilities or the Diagonal
 * update); the plain instantiation carries none of their code in its key loop. */
template <int D, int G, int U, bool POL, bool SHORT = G == 1 && U == 2>
static __global__ void __launch_bounds__(DEC_THREADS, SHORT ? DEC_SHORT_CTAS
                                                   : G <= 4 ? DEC_MIN_CTAS : 1)
attn_decode_kernel(uint4 *__restrict__ out, const uint4 *__restrict__ qkv,
                   const uint4 *__restrict__ kc, const uint4 *__restrict__ vc, decode_params p) {
    constexpr int L = D / 8;              /* lanes per key row */
    constexpr int RPW = 32 / L;           /* row groups per warp */
    __shared__ dec_merge_smem<D, G> sm;
    __shared__ int32_t sm_slot[DEC_SMEM_SLOTS];
    __shared__ float sm_am_s[DEC_WARPS];
    __shared__ int sm_am_e[DEC_WARPS];

    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
    const int sub = lane % L, grp = warp * RPW + lane / L;
    int qrow, h;
    dec_cta(p, qrow, h);
    const int s = qrow / p.win;    /* the sequence whose block the row reads (kernels.h win) */
    const int bh = s * p.h_kv + h; /* the index of the (s, h) cache block */
    const int hq0 = h * p.g + (int)blockIdx.y * G;
    const int ng = min(G, p.g - (int)blockIdx.y * G);

    /* this lane's 8 elements of each query head */
    float q[G][8];
    const int64_t qkv_w = (int64_t)(p.h_q + 2 * p.h_kv) * L;
#pragma unroll
    for (int i = 0; i < G; i++) {
        uint4 w = make_uint4(0, 0, 0, 0);
        if (i < ng) w = __ldg(qkv + qrow * qkv_w + (int64_t)(hq0 + i) * L + sub);
        bf16x8_to_f32(w, q[i]);
    }

    /* key list: lp prompt rows, then ns ring slots (clamped: file comment); this CTA's part */
    dec_keys k;
    k.lp = p.pre_part ? 0 : min(max(__ldg(p.lp + s), 0), p.prefix ? p.pre_cap : p.p_cap);
    const int64_t li = dec_list(p, qrow, h); /* slot list of this (query row, KV head) */
    k.n = k.lp + (p.max_slots > 0 ? min(max(__ldg(p.n_slots + li), 0), p.max_slots) : 0);
    const int per = (k.n + p.splits - 1) / p.splits;
    k.jb = min(k.n, (int)blockIdx.z * per);
    k.je = min(k.n, k.jb + per);
    const int64_t blk = (int64_t)bh * (p.p_cap + p.ring) * L + sub;
    k.kb = k.kp = kc + blk;
    k.vb = k.vp = vc + blk;
    if (p.prefix) { /* a prefix index out of range is clamped: its rows stay in the store */
        const int64_t pid = min(max(__ldg(p.prefix + s), 0), p.n_pre - 1);
        const int64_t pre = (pid * p.h_kv + h) * p.pre_cap * L + sub;
        k.kp = p.kpre + pre;
        k.vp = p.vpre + pre;
    }
    k.sl = p.slots + li * p.max_slots;
    const int s0 = max(k.jb - k.lp, 0), ns = max(k.je - k.lp, 0) - s0;
    if (!SHORT && ns > 0 && ns <= DEC_SMEM_SLOTS) {
        for (int t = (int)threadIdx.x; t < ns; t += DEC_THREADS) sm_slot[t] = __ldg(k.sl + s0 + t);
        k.sl = sm_slot - s0;
        __syncthreads();
    }
    const int64_t sq0 = (int64_t)qrow * p.h_q + hq0; /* first query head row of the CTA */
    k.lg = p.logits_out ? p.logits_out + sq0 * p.max_slots : nullptr;
    k.pg = p.probs_out ? p.probs_out + sq0 * p.max_slots : nullptr;
    k.dl = p.diag_lag ? p.diag_lag + (int64_t)bh * p.diag_a : nullptr; /* one chunk: launcher */

    dec_state<G> st;
#pragma unroll
    for (int i = 0; i < G; i++) {
        st.m[i] = -INFINITY;
        st.l[i] = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) st.acc[i][e] = 0.0f;
    }
    dec_amin am = {0.0f, -1};
    dec_attend<D, G, U, POL>(st, am, q, k, p, grp, sub, ng);
    if (POL && k.dl) dec_diag_finish<D>(am, k, p, sq0, sm_am_s, sm_am_e);

    dec_finish<D, G, POL>(st, out, p, sq0, ng, sm);
    if (POL && k.pg && p.splits == 1) { /* probability epilogue (split-K: the merge) */
        __syncthreads();
        const int ns = k.n - k.lp;
        for (int t = (int)threadIdx.x; t < ng * ns; t += DEC_THREADS) {
            const int i = t / ns, c = t - i * ns;
            float *pr = k.pg + (int64_t)i * p.max_slots + c;
            *pr = dec_prob(*pr, sm.lse[i]);
        }
    }
}

/* Split-K merge: one warp per query head row sq; out (n_seq·win·h_q, D) bf16, lse
 * (n_seq·win·h_q); the row's probabilities (probs_out) and, in a group's first head row,
 * Diagonal's update from the splits' candidates. */
template <int D>
static __global__ void __launch_bounds__(32)
attn_decode_merge(__nv_bfloat16 *__restrict__ out, const decode_params p) {
    const int64_t sq = blockIdx.x;
    const float *pp = p.part + sq * p.splits * DEC_PART(D);
    /* the cascade's prompt partial is one more split */
    const float *pre = p.pre_part ? p.pre_part + sq * DEC_PART(D) : nullptr;
    float mx = pre ? pre[D] : -INFINITY, lsum = 0.0f;
    for (int z = 0; z < p.splits; z++) mx = fmaxf(mx, pp[z * DEC_PART(D) + D]);
    if (pre) lsum = pre[D + 1] * exp_shift(pre[D], mx);
    for (int z = 0; z < p.splits; z++)
        lsum += pp[z * DEC_PART(D) + D + 1] * exp_shift(pp[z * DEC_PART(D) + D], mx);
    const float inv = lsum == 0.0f ? 0.0f : __frcp_rn(lsum);
    for (int e = (int)threadIdx.x; e < D; e += 32) {
        float o = pre ? pre[e] * exp_shift(pre[D], mx) : 0.0f;
        for (int z = 0; z < p.splits; z++)
            o = fmaf(pp[z * DEC_PART(D) + e], exp_shift(pp[z * DEC_PART(D) + D], mx), o);
        out[sq * D + e] = __float2bfloat16_rn(o * inv);
    }
    const float lse = lsum == 0.0f ? -INFINITY : mx + logf(lsum);
    if (threadIdx.x == 0 && p.lse_out) p.lse_out[sq] = lse;
    if (!p.probs_out && !p.diag_lag) return;
    /* query row q (its sequence too under the Diagonal update, which comes with win 1 only) */
    const int q = (int)(sq / p.h_q), hq = (int)(sq - (int64_t)q * p.h_q);
    const int64_t li = dec_list(p, q, hq / p.g);
    const int ns = p.max_slots > 0 ? min(max(__ldg(p.n_slots + li), 0), p.max_slots) : 0;
    if (p.probs_out)
        for (int c = (int)threadIdx.x; c < ns; c += 32) {
            float *pr = p.probs_out + sq * p.max_slots + c;
            *pr = dec_prob(*pr, lse);
        }
    if (p.diag_lag && hq % p.g == 0 && threadIdx.x == 0) {
        const int32_t next = __ldg(p.diag_next + q); /* < 0: q keeps its lags */
        if (next < 0) return;
        int16_t *dl = p.diag_lag + ((int64_t)q * p.h_kv + hq / p.g) * p.diag_a;
        dec_amin am = {0.0f, -1};
        for (int z = 0; z < p.splits; z++)
            amin_fold(am, pp[z * DEC_PART(D) + D + 2], __float_as_int(pp[z * DEC_PART(D) + D + 3]),
                      dl);
        if (am.e >= 0) dl[am.e] = (int16_t)next;
    }
}

/* ---- cascade: the shared prompt rows, once per group ---- */

/* Query head rows per prefix CTA (4 per warp) and prompt keys per shared-memory chunk (one per
 * lane). */
#define PFX_ROWS FLEXDIAG_CASCADE_ROWS
#define PFX_KEYS 32

/* One CTA per (cascade tile, KV head): the tile's prefix block's prompt keys go through
 * shared memory in chunks of PFX_KEYS (K rows padded by one word, so the lanes' rows sit in
 * distinct banks), each warp scores its query rows' keys (lane = key), folds them into the
 * rows' online softmax and leaves (acc, m, l) in p.pre_part. Padding tiles return at once. */
template <int D>
static __global__ void __launch_bounds__(DEC_THREADS)
attn_prefix_kernel(const uint4 *__restrict__ qkv, decode_params p) {
    constexpr int L = D / 8, KW = D / 2 + 1, DL = (D + 31) / 32, RW = PFX_ROWS / DEC_WARPS;
    __shared__ uint32_t sk[PFX_KEYS * KW];
    __shared__ __align__(16) __nv_bfloat16 sv[PFX_KEYS * D];
    __shared__ float sq[PFX_ROWS][D];
    __shared__ int32_t srow[PFX_ROWS], slp[PFX_ROWS];
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
    const int32_t *tl = p.casc_tile + 3 * (int64_t)blockIdx.x;
    const int pid = min(max(__ldg(tl), 0), p.n_pre - 1), first = __ldg(tl + 1);
    const int n = min(max(__ldg(tl + 2), 0) * p.g, PFX_ROWS), h = (int)blockIdx.y;
    if (n == 0) return;
    if ((int)threadIdx.x < n) {
        const int r = (int)threadIdx.x;
        const int s = min(max(__ldg(p.casc_seq + min(max(first + r / p.g, 0), p.n_seq - 1)), 0),
                          p.n_seq - 1);
        srow[r] = s * p.h_q + h * p.g + r % p.g;
        slp[r] = min(max(__ldg(p.lp + s), 0), p.pre_cap);
    }
    __syncthreads();
    const int64_t qkv_w = (int64_t)(p.h_q + 2 * p.h_kv) * L;
    int lmax = 0;
    for (int r = 0; r < n; r++) lmax = max(lmax, slp[r]);
    for (int t = (int)threadIdx.x; t < n * L; t += DEC_THREADS) {
        const int r = t / L, c = t - r * L, s = srow[r] / p.h_q, hq = srow[r] - s * p.h_q;
        float f[8];
        bf16x8_to_f32(__ldg(qkv + s * qkv_w + (int64_t)hq * L + c), f);
#pragma unroll
        for (int e = 0; e < 8; e++) sq[r][c * 8 + e] = f[e] * p.scale;
    }
    float m[RW], l[RW], acc[RW][DL];
#pragma unroll
    for (int rr = 0; rr < RW; rr++) {
        m[rr] = -INFINITY;
        l[rr] = 0.0f;
#pragma unroll
        for (int k = 0; k < DL; k++) acc[rr][k] = 0.0f;
    }
    const int64_t blk = ((int64_t)pid * p.h_kv + h) * p.pre_cap * L;
    for (int j0 = 0; j0 < lmax; j0 += PFX_KEYS) {
        __syncthreads(); /* the previous chunk is consumed (and sq written, first time) */
        for (int t = (int)threadIdx.x; t < PFX_KEYS * L; t += DEC_THREADS) {
            const int j = t / L, c = t - j * L;
            uint4 kw = make_uint4(0, 0, 0, 0), vw = kw;
            if (j0 + j < lmax) {
                kw = __ldg(p.kpre + blk + (int64_t)(j0 + j) * L + c);
                vw = __ldg(p.vpre + blk + (int64_t)(j0 + j) * L + c);
            }
            uint32_t *kr = sk + j * KW + c * 4;
            kr[0] = kw.x, kr[1] = kw.y, kr[2] = kw.z, kr[3] = kw.w;
            reinterpret_cast<uint4 *>(sv)[j * L + c] = vw;
        }
        __syncthreads();
        const int nk = min(PFX_KEYS, lmax - j0);
#pragma unroll
        for (int rr = 0; rr < RW; rr++) {
            const int r = warp * RW + rr;
            if (r >= n) break; /* warp-uniform */
            float z = 0.0f;
#pragma unroll 8
            for (int w = 0; w < D / 2; w++) {
                const uint32_t kw = sk[lane * KW + w];
                z = fmaf(sq[r][2 * w], __uint_as_float(kw << 16), z);
                z = fmaf(sq[r][2 * w + 1], __uint_as_float(kw & 0xffff0000u), z);
            }
            if (j0 + lane >= slp[r]) z = -INFINITY;
            float cm = z;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, o));
            const float mn = fmaxf(m[rr], cm), corr = exp_shift(m[rr], mn);
            const float pz = z == -INFINITY ? 0.0f : exp_shift(z, mn);
            float ps = pz;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
            l[rr] = l[rr] * corr + ps;
#pragma unroll
            for (int k = 0; k < DL; k++) acc[rr][k] *= corr;
            for (int j = 0; j < nk; j++) {
                const float pj = __shfl_sync(0xffffffffu, pz, j);
#pragma unroll
                for (int k = 0; k < DL; k++) {
                    const int d = lane + 32 * k;
                    if (d < D) acc[rr][k] = fmaf(pj, __bfloat162float(sv[j * D + d]), acc[rr][k]);
                }
            }
            m[rr] = mn;
        }
    }
#pragma unroll
    for (int rr = 0; rr < RW; rr++) {
        const int r = warp * RW + rr;
        if (r >= n) break;
        float *dst = p.pre_part + (int64_t)srow[r] * DEC_PART(D);
#pragma unroll
        for (int k = 0; k < DL; k++)
            if (lane + 32 * k < D) dst[lane + 32 * k] = acc[rr][k];
        if (lane == 0) {
            dst[D] = m[rr];
            dst[D + 1] = l[rr];
        }
    }
}

/* ---- launcher ---- */

/* Launch the instantiation for D and the CTA head count G (+ the split-K merge); keys = the
 * longest key list one CTA walks. */
template <int D, int G>
static void decode_launch(dim3 grid, cudaStream_t st, void *out, const void *qkv, const void *k,
                          const void *v, const decode_params &p, int64_t n_rows, int64_t keys) {
    /* keys in flight per row group: fewer for wide groups to stay clear of spills, and for
     * single-head CTAs on short (sparse) lists, where the smaller register file buys more CTAs
     * per multiprocessor (H200, 64 sequences, 79 keys: 35.2 us at U = 2, 36.9 us at U = 4; 576
     * keys: 170.5 us and 166.3 us) */
    constexpr int U = G <= 2 ? 4 : 2;
    /* The policy code is compiled out of calls without policy outputs (dense: 116 instead of
     * 122 registers at d_h 128), except on short lists: their plain instantiation spills at the
     * 64-register bound (nvcc 13.0), so they always run the one with policy code. */
    const bool pol = p.logits_out || p.probs_out || p.diag_lag;
    uint4 *o = (uint4 *)out;
    const uint4 *x = (const uint4 *)qkv, *kc = (const uint4 *)k, *vc = (const uint4 *)v;
    const unsigned T = DEC_THREADS;
    if (G == 1 && keys <= DEC_SHORT_KEYS)
        attn_decode_kernel<D, G, 2, true><<<grid, T, 0, st>>>(o, x, kc, vc, p);
    else if (pol)
        attn_decode_kernel<D, G, U, true><<<grid, T, 0, st>>>(o, x, kc, vc, p);
    else
        attn_decode_kernel<D, G, U, false><<<grid, T, 0, st>>>(o, x, kc, vc, p);
    if (p.splits > 1)
        attn_decode_merge<D><<<(unsigned)n_rows, 32, 0, st>>>((__nv_bfloat16 *)out, p);
}

template <int D>
static void decode_launch_g(int G, dim3 grid, cudaStream_t st, void *out, const void *qkv,
                            const void *k, const void *v, const decode_params &p,
                            int64_t n_rows, int64_t keys) {
    switch (G) {
    case 1: decode_launch<D, 1>(grid, st, out, qkv, k, v, p, n_rows, keys); break;
    case 2: decode_launch<D, 2>(grid, st, out, qkv, k, v, p, n_rows, keys); break;
    case 4: decode_launch<D, 4>(grid, st, out, qkv, k, v, p, n_rows, keys); break;
    default: decode_launch<D, 8>(grid, st, out, qkv, k, v, p, n_rows, keys); break;
    }
}

/* Prompt rows a sequence may attend: its block's, or with shared prompt KV its prefix block's. */
static int32_t prompt_cap(const flexdiag_attn_args *a) { return a->prefix ? a->pre_cap : a->p_cap; }

/* Query rows of a decode call: n_seq·win (kernels.h win). */
static int64_t query_rows(const flexdiag_attn_args *a) {
    return (int64_t)a->n_seq * flexdiag__attn_win(a);
}

/* Workspace bytes of per_row partials per query head row (split-K, cascade). */
static size_t part_bytes(const flexdiag_attn_args *a, int64_t per_row) {
    return (size_t)query_rows(a) * (size_t)a->h_q * (size_t)per_row * DEC_PART(a->d_h) *
           sizeof(float);
}

/* Cascade when FLEXDIAG_CASCADE=1, the caller gave a plan, the prompts are shared by two
 * sequences or more on average (n_pre bounds the distinct prompts) and the stream's workspace
 * holds the partials: the prompt-only store is then read once per group of rows. Off by
 * default: on the H200 at Janus-Pro-7B shapes (docs/results-history.md, session 13) it made the
 * decode step 2-6 % slower, the prompt rows of a prompt's sequences being L2 hits already and
 * the short ring-only lists as latency-bound as the longer ones. */
static bool decode_cascade(const flexdiag_attn_args *a, const flexdiag_stream *s) {
    const char *env = getenv("FLEXDIAG_CASCADE");
    return env && !strcmp(env, "1") && a->prefix && a->casc_seq && a->casc_tile &&
           a->pre_cap > 0 &&
           a->n_casc_tiles == flexdiag__cascade_tiles(a->n_seq, a->n_pre, a->h_q / a->h_kv) &&
           a->n_casc_tiles > 0 && a->n_seq >= 2 * (int64_t)a->n_pre && s->workspace &&
           flexdiag__round256(part_bytes(a, 1)) <= s->workspace_bytes;
}

/* Head-major CTA order when prompt KV is shared (not as a cascade): consecutive CTAs are one KV
 * head of consecutive sequences, so the CTAs in flight on a multiprocessor read one or a few
 * prompt blocks of one head and their prompt rows come from L1 instead of each CTA pulling them
 * through L2 (sequence-major, the CTAs in flight read 32 heads' blocks). Every CTA computes what
 * it did before: the same bits. 2.6-3.1 % less time a layer on an H100
 * (docs/results-history.md, session 24); FLEXDIAG_DEC_HEAD_MAJOR=0 keeps sequence-major order. */
static bool decode_head_major(const flexdiag_attn_args *a, bool cascade) {
    const char *env = getenv("FLEXDIAG_DEC_HEAD_MAJOR");
    return !(env && !strcmp(env, "0")) && a->prefix && !cascade;
}

/* CTAs per key list (keys: the longest list): 1 unless the grid leaves multiprocessors idle
 * (fewer than two CTAs each) and the lists are long enough to share; limited by the
 * workspace left (avail bytes). */
static int decode_splits(const flexdiag_attn_args *a, const flexdiag_stream *s, int64_t ctas,
                         int64_t keys, size_t avail) {
    const int64_t want = 2 * (int64_t)s->sm_count;
    if (ctas >= want || keys < 2 * DEC_SPLIT_KEYS) return 1;
    int64_t splits = (want + ctas - 1) / ctas;
    if (splits > keys / DEC_SPLIT_KEYS) splits = keys / DEC_SPLIT_KEYS;
    if (splits > DEC_MAX_SPLITS) splits = DEC_MAX_SPLITS;
    if (!s->workspace || part_bytes(a, splits) > avail) return 1;
    return (int)splits;
}

/* The calls of head size D: the cascade's prompt kernel first (when p.pre_part is set), then
 * the decode kernel (+ merge). */
template <int D>
static void decode_launch_d(const flexdiag_attn_args *a, int G, dim3 grid, cudaStream_t st,
                            void *out, const void *qkv, const void *k, const void *v,
                            const decode_params &p, int64_t n_rows, int64_t keys) {
    if (p.pre_part) {
        const dim3 pg((unsigned)a->n_casc_tiles, (unsigned)a->h_kv);
        attn_prefix_kernel<D><<<pg, DEC_THREADS, 0, st>>>((const uint4 *)qkv, p);
    }
    decode_launch_g<D>(G, grid, st, out, qkv, k, v, p, n_rows, keys);
}

/* kernels.h win: 0 or 1 (one query a sequence) or more (a window pass), the latter with neither
 * the fused Diagonal update nor a cascade plan. The CPU backends check the same. */
static flexdiag_status check_win(const flexdiag_attn_args *a) {
    if (a->win < 0)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "attn_decode: win = %d: need 0 or 1 (one query a sequence) or more",
                             (int)a->win);
    if (a->win > 1 && (a->diag_lag || a->n_casc_tiles))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "attn_decode: win = %d with %s: a window pass takes neither the "
                             "fused Diagonal update nor a cascade plan",
                             (int)a->win,
                             a->diag_lag ? "diag_lag" : "a cascade plan (n_casc_tiles)");
    return FLEXDIAG_OK;
}

/* out (n_seq·win, h_q·d_h) bf16; qkv (n_seq·win, (h_q + 2·h_kv)·d_h) bf16; k, v caches
 * (kernels.h); slots (n_seq·win, h_kv, max_slots), n_slots (n_seq·win, h_kv) int32 (or per
 * shared_slots); logits_out, lse_out, probs_out optional */
extern "C" flexdiag_status flexdiag__cuda_attn_decode(void *out, const void *qkv, const void *k,
                                                      const void *v, const flexdiag_attn_args *a,
                                                      flexdiag_stream *s) {
    FLEXDIAG_TRY(flexdiag__cuda_attn_check("attn_decode", a, s, 1, out, qkv, k, v));
    FLEXDIAG_TRY(check_win(a));
    if (a->n_seq == 0) return FLEXDIAG_OK;
    if (!out || !qkv || !k || !v)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "attn_decode: NULL out, qkv, k or v");
    if (a->max_slots < 0 || (a->max_slots > 0 && (!a->slots || !a->n_slots)))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "attn_decode: max_slots = %d needs >= 0 and, when > 0, the slots "
                             "and n_slots arrays", (int)a->max_slots);
    if (a->shared_slots < FLEXDIAG_SLOTS_PER_HEAD || a->shared_slots > FLEXDIAG_SLOTS_PER_SEQ)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "attn_decode: shared_slots = %d is none of FLEXDIAG_SLOTS_PER_HEAD "
                             "(0), _ONE (1) and _PER_SEQ (2)", (int)a->shared_slots);
    if (a->prefix && (!a->k_pre || !a->v_pre || a->p_cap != 0 || a->n_pre < 1 || a->pre_cap < 0))
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "attn_decode: prefix is set with k_pre %s, v_pre %s, p_cap = %d, "
                             "n_pre = %d, pre_cap = %d: shared prompt rows need both stores, "
                             "ring-only blocks (p_cap 0), n_pre >= 1 and pre_cap >= 0",
                             a->k_pre ? "set" : "NULL", a->v_pre ? "set" : "NULL", (int)a->p_cap,
                             (int)a->n_pre, (int)a->pre_cap);
    const int64_t rows = query_rows(a); /* < 2^62: no overflow times h_q once <= 2^31 - 1 */
    if (rows > INT32_MAX || rows * a->h_q > INT32_MAX ||
        (int64_t)prompt_cap(a) + a->max_slots > INT32_MAX)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "attn_decode: %lld query rows (n_seq·win) times h_q = %d, or the "
                             "prompt rows + max_slots, exceed 2^31 - 1",
                             (long long)rows, (int)a->h_q);
    const int64_t n_rows = rows * a->h_q; /* query head rows */
    const int g = a->h_q / a->h_kv;
    const int G = g > 4 ? DEC_MAX_G : g > 2 ? 4 : g; /* 1, 2, 4 or 8: the smallest >= g */
    const int chunks = (g + G - 1) / G;
    if (chunks > 65535)
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                             "attn_decode: group size h_q / h_kv = %d exceeds %d", g,
                             65535 * DEC_MAX_G);
    if (a->diag_lag && (a->shared_slots != FLEXDIAG_SLOTS_PER_HEAD || a->diag_a < 1 ||
                        a->diag_base < 0 || !a->diag_next || chunks > 1))
        return flexdiag__err(chunks > 1 ? FLEXDIAG_ERR_UNSUPPORTED : FLEXDIAG_ERR_INVALID_ARG,
                             "attn_decode: the fused Diagonal update needs per-(sequence, KV "
                             "head) slot lists, diag_a >= 1, diag_base >= 0, diag_next and a "
                             "group h_q / h_kv <= %d (got shared_slots %d, diag_a %d, diag_base "
                             "%d, group %d)",
                             DEC_MAX_G, (int)a->shared_slots, (int)a->diag_a, (int)a->diag_base,
                             g);
    const int64_t ctas = rows * a->h_kv * chunks;
    /* workspace: the cascade's prompt partials first, then the split-K partials */
    const bool cascade = decode_cascade(a, s);
    const size_t pre = cascade ? flexdiag__round256(part_bytes(a, 1)) : 0;
    const int64_t list = (cascade ? 0 : (int64_t)prompt_cap(a)) + a->max_slots;
    const int splits = decode_splits(a, s, ctas, list, s->workspace_bytes - pre);
    decode_params p = {a->h_q, a->h_kv, g, a->p_cap, a->ring, a->max_slots, splits, a->scale,
                       a->lp, a->slots, a->n_slots, a->shared_slots, a->logits_out,
                       a->lse_out, a->probs_out, a->diag_lag, a->diag_a, a->diag_base,
                       a->diag_next, (float *)((char *)s->workspace + pre), a->prefix,
                       (const uint4 *)a->k_pre, (const uint4 *)a->v_pre, a->n_pre, a->pre_cap,
                       a->n_seq, flexdiag__attn_win(a), a->casc_seq, a->casc_tile,
                       cascade ? (float *)s->workspace : nullptr,
                       decode_head_major(a, cascade) ? 1 : 0};
    const dim3 grid((unsigned)(rows * a->h_kv), (unsigned)chunks, (unsigned)splits);
    const int64_t keys = (list + splits - 1) / splits;
    switch (a->d_h) {
    case 16: decode_launch_d<16>(a, G, grid, s->stream, out, qkv, k, v, p, n_rows, keys); break;
    case 32: decode_launch_d<32>(a, G, grid, s->stream, out, qkv, k, v, p, n_rows, keys); break;
    case 64: decode_launch_d<64>(a, G, grid, s->stream, out, qkv, k, v, p, n_rows, keys); break;
    default: decode_launch_d<128>(a, G, grid, s->stream, out, qkv, k, v, p, n_rows, keys); break;
    }
    FLEXDIAG_CUDA_LAUNCH_CHECK(s->stream);
    return FLEXDIAG_OK;
}
