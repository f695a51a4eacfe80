/*
 * context.c - a context's geometry, sizing and memory: size first, allocate once, carve.
 *
 * ctx_geometry derives every size from the model and the params (batch, micro-batches, prefill
 * chunk, the policy driver's ring and slot lists) without allocating; ctx_layout walks the same
 * list of buffers twice, once to size the device block and once to carve it, so the bytes
 * --batch auto plans with are the bytes the context allocates. Creation then takes the block
 * from the arena, the context's own stream (its device workspace charged to the arena too),
 * the host mirrors, the policy driver's host state and the scheduler over the block.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "offload/kv_disk.h"
#include "runtime/engine/cpu_attn.h"
#include "runtime/engine/ctx_calib.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/sjd.h"
#include "runtime/image/vq.h"
#include "runtime/tiers.h"

#define BUF_ALIGN 256
/* Device weight slots of a split model: a layer's streamed part loads into one while the
 * layer before it computes from the other. */
#define WEIGHT_SLOTS 2
/* Prompt tokens one prefill chunk runs through a layer at most: GEMMs of this many rows are
 * compute-bound (the 7B qkv projection: 412 GFLOP), and the scratch (h, qkv, att, gate/up, mlp:
 * ~107 KB per token at 7B) stays ~0.44 GB however large the batch (a 218-sequence batch of
 * 50-token prompts held 1.17 GB; at 48 GB the difference is about two Diagonal images). */
#define PREFILL_TOKENS 4096
/* Limits of the user-given sizes (ctx_check_params): sequences (2 per image with CFG) and
 * positions stay far inside int32, and a context whose byte bound (ctx_bytes_bound) passes
 * 2^58 is refused before its layout sums any size_t. */
#define CTX_MAX_IMAGES (1 << 20)
#define CTX_MAX_POSITIONS (1 << 24)
#define CTX_MAX_BYTES 0x1p58

static size_t al(size_t x) { return (x + BUF_ALIGN - 1) / BUF_ALIGN * BUF_ALIGN; }

int32_t flexdiag__casc_tiles(const flexdiag_context *c, int32_t nb) {
    const flexdiag_lm_config *l = &c->m->cfg.lm;
    return c->geo.n_pre ? flexdiag__cascade_tiles(nb, c->geo.n_pre, l->heads / l->kv_heads) : 0;
}

/* Assign buffer pointers inside base (when non-NULL) and return the total size: the engine's
 * buffers, then the policy driver's. */
static size_t ctx_layout(flexdiag_context *c, size_t act, char *base) {
    const flexdiag_model_config *m = &c->m->cfg;
    const flexdiag_lm_config *l = &m->lm;
    flexdiag_ctx_bufs *b = &c->b;
    size_t d = (size_t)l->hidden, dh = (size_t)l->head_dim, hq = (size_t)l->heads;
    size_t hkv = (size_t)l->kv_heads, f = (size_t)l->ffn, S = (size_t)c->geo.n_seq;
    size_t qkvw = (hq + 2 * hkv) * dh, pft = (size_t)c->geo.pf_seq * (size_t)c->geo.p_cap;
    size_t W = (size_t)c->geo.win, SW = S * W, dec = (size_t)c->geo.mb_seq * W;
    size_t mbt = pft > dec ? pft : dec; /* prefill or decode rows of a micro-batch */
    size_t xrows = (size_t)c->geo.p_cap > W ? (size_t)c->geo.p_cap : W; /* x rows a sequence */
    size_t V = (size_t)c->geo.vocab_out;
    size_t dm = m->head_dim_mid > l->hidden ? (size_t)m->head_dim_mid : d;
    size_t e8 = m->image_embed > 0 ? (size_t)m->image_embed : 1, off = 0;
#define TAKE(field, bytes)                                                                         \
    do {                                                                                           \
        if (base) b->field = (void *)(base + off);                                                 \
        off += al(bytes);                                                                          \
    } while (0)
    TAKE(kv, (size_t)l->layers * 2 * (size_t)c->homes.s_host * c->geo.seq_bytes);
    if (c->geo.n_pre) TAKE(kv_pre, (size_t)l->layers * 2 * (size_t)c->geo.n_pre * c->geo.pre_bytes);
    if (c->geo.n_pre) TAKE(lp_pre, (size_t)c->geo.n_pre * 4);
    if (c->geo.n_pre) TAKE(prefix, S * 4);
    if (c->geo.n_pre) TAKE(casc_seq, S * 4);
    if (c->geo.n_pre)
        TAKE(casc_tile, (size_t)c->geo.n_mb * (size_t)flexdiag__casc_tiles(c, c->geo.mb_seq) * 12);
    if (c->homes.s_host < c->geo.n_seq) TAKE(kv_stage, flexdiag__sched_kv_staging_bytes(c->geo.mb_seq, c->geo.seq_bytes));
    if (c->m->w.homes)
        TAKE(wslots, WEIGHT_SLOTS * flexdiag__sched_tiered_slot_bytes(c->m->w.homes));
    TAKE(x, S * xrows * d * act);
    if (c->geo.n_pre) TAKE(xl_pre, (size_t)c->geo.n_pre * d * act);
    if (c->geo.n_pre) TAKE(last_pre, (size_t)c->geo.n_pre * 4);
    TAKE(h, mbt * d * act);
    TAKE(qkv, mbt * qkvw * act);
    TAKE(att, mbt * hq * dh * act);
    TAKE(gu, mbt * 2 * f * act);
    TAKE(mlp, mbt * f * act);
    TAKE(xl, SW * d * act);
    TAKE(hm, SW * dm * act);
    TAKE(emb, SW * e8 * act);
    TAKE(logits, SW * V * 4);
    TAKE(cfg, (size_t)c->geo.n_img * V * 4);
    TAKE(ids_in, S * (size_t)c->geo.p_cap * 4);
    TAKE(lp, S * 4);
    TAKE(pos_pf, pft * 4);
    TAKE(rows_pf, pft * hkv * 4);
    TAKE(pos, SW * 4);
    TAKE(last, S * 4);
    TAKE(ids, SW * 4);
    if (W > 1) TAKE(win_rows, SW * hkv * 4);
    if (W > 1) TAKE(win_slots, SW * (size_t)c->geo.win_lists * (size_t)c->pd.max_slots * 4);
    if (W > 1) TAKE(win_nslots, SW * (size_t)c->geo.win_lists * 4);
    TAKE(srows, (size_t)c->geo.n_img * sizeof(flexdiag_sample_row));
#undef TAKE
    return off + flexdiag__pd_layout(&c->pd, base ? base + off : NULL);
}

/* What a context of m generates: images (Janus; Chameleon unless text is asked for, or its
 * vocabulary cannot frame images: image_vocab 0, model load said why) with two CFG rows per
 * image, or text. Chameleon images are grid rows of grid codes, each row ended by the forced
 * row-end token; the head computes the image-code slice of lm_head. */
static void ctx_output(flexdiag_context *c) {
    const flexdiag_model_config *m = &c->m->cfg;
    int janus = m->arch == FLEXDIAG_ARCH_JANUS;
    int image = janus || (m->arch == FLEXDIAG_ARCH_CHAMELEON && !c->p.text && m->image_vocab > 0);
    c->geo.rows_per_img = image ? 2 : 1;
    c->geo.l_dec = !image ? c->p.max_new_tokens : janus ? m->image_tokens : m->grid * (m->grid + 1);
    c->geo.vocab_out = image ? m->image_vocab : m->lm.vocab;
    c->geo.id0 = image && !janus ? m->img_id0 : 0;
    c->geo.vocab_in = janus ? m->image_vocab : m->lm.vocab;
    c->geo.row_len = image && !janus ? m->grid + 1 : 0;
}

void flexdiag__kv_home_split(int32_t n_mb, const uint32_t pct[3], int32_t out[3]) {
    uint32_t g = pct[0] + pct[1] + pct[2] ? pct[0] : 100;
    out[0] = (int32_t)((int64_t)n_mb * g / 100);
    out[2] = pct[1] ? (int32_t)((int64_t)n_mb * pct[2] / 100) : n_mb - out[0];
    out[1] = n_mb - out[0] - out[2];
}

/* The host-homed micro-batches the host attends (params cpu_attention_pct of the n_host
 * there are, rounded up): sequences [s_host, s_ca). */
static flexdiag_status ctx_cpu_attn_share(flexdiag_context *c, int32_t n_host) {
    uint32_t pct = c->p.cpu_attention_pct ? c->p.cpu_attention_pct : 100;
    if (pct > 100)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "context_params.cpu_attention_pct %u: give a percent of the "
                             "CPU-homed micro-batches, 1..100 (0: all of them)", pct);
    int64_t n = c->p.cpu_attention ? ((int64_t)n_host * pct + 99) / 100 : 0;
    int64_t end = (int64_t)c->homes.s_host + n * c->geo.mb_seq;
    c->homes.s_ca = end < c->homes.s_disk ? (int32_t)end : c->homes.s_disk;
    return FLEXDIAG_OK;
}

/* KV homes (kv_pct: GPU, CPU, disk percent of the micro-batches, flexdiag__kv_home_split): the
 * first micro-batches keep their KV on the device, the next in pinned host memory, the last on
 * disk; s_host and s_disk are the first pinned- and disk-homed sequences (n_seq when none). */
static flexdiag_status ctx_kv_homes(flexdiag_context *c) {
    const uint32_t *k = c->p.kv_pct;
    uint32_t g = k[0], h = k[1], d = k[2];
    if (!g && !h && !d) g = 100;
    if (g > 100 || h > 100 || d > 100 || g + h + d != 100)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "context_params.kv_pct %u,%u,%u: three percentages of the "
                             "micro-batches on GPU, pinned CPU and disk that add up to 100",
                             g, h, d);
    int32_t n[3];
    flexdiag__kv_home_split(c->geo.n_mb, k, n);
    int64_t dev = (int64_t)n[0] * c->geo.mb_seq, disk = (int64_t)(n[0] + n[1]) * c->geo.mb_seq;
    c->homes.s_host = dev < c->geo.n_seq ? (int32_t)dev : c->geo.n_seq;
    c->homes.s_disk = disk < c->geo.n_seq ? (int32_t)disk : c->geo.n_seq;
    return ctx_cpu_attn_share(c, n[1]);
}

/* Shared prompt rows (params images_per_prompt > 1, every KV on the device): a block of
 * max_images images holds at most ceil(max_images / images_per_prompt) + 1 prompts side by
 * side (its first and last may be partial), each with rows_per_img distinct prompt rows. None
 * when that is no fewer than the sequences. */
static void ctx_shared_prompts(flexdiag_context *c) {
    int32_t ipp = c->p.images_per_prompt; /* 0 from an older caller's shorter params */
    int64_t n = ipp > 1 ? ((int64_t)c->geo.n_img + ipp - 1) / ipp + 1 : c->geo.n_img;
    n *= c->geo.rows_per_img;
    c->geo.n_pre = ipp > 1 && c->homes.s_host == c->geo.n_seq && n < c->geo.n_seq ? (int32_t)n : 0;
    c->geo.blk_p = c->geo.n_pre ? 0 : c->geo.p_cap;
}

/* "context_params.<field> is <v>: <need>" (FLEXDIAG_ERR_INVALID_ARG). */
static flexdiag_status bad_param(const char *field, int64_t v, const char *need) {
    return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "context_params.%s is %lld: %s", field,
                         (long long)v, need);
}

/* The params' own ranges, each refused naming its field, before any size is derived from them:
 * within these every count and position below fits int32 with room (CTX_MAX_*). */
static flexdiag_status ctx_check_params(const flexdiag_context *c) {
    const flexdiag_context_params *p = &c->p;
    if (p->max_images < 1 || p->max_images > CTX_MAX_IMAGES)
        return bad_param("max_images", p->max_images, "give 1 .. 1048576 images a block");
    if (p->max_prompt_len < 1 || p->max_prompt_len > CTX_MAX_POSITIONS)
        return bad_param("max_prompt_len", p->max_prompt_len,
                         "give 1 .. 16777216 tokens (BOS .. the last prompt token)");
    if (c->geo.rows_per_img == 1 && (c->geo.l_dec < 1 || c->geo.l_dec > CTX_MAX_POSITIONS))
        return bad_param("max_new_tokens", c->geo.l_dec, "give 1 .. 16777216 tokens a sequence");
    if ((int64_t)p->max_prompt_len + c->geo.l_dec > CTX_MAX_POSITIONS)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "context_params.max_prompt_len %d + %d decode tokens: a sequence "
                             "holds at most %d positions",
                             p->max_prompt_len, c->geo.l_dec, CTX_MAX_POSITIONS);
    if (p->micro_batch < 0)
        return bad_param("micro_batch", p->micro_batch, "give >= 0 (0 = max_images)");
    if (p->images_per_prompt < 0)
        return bad_param("images_per_prompt", p->images_per_prompt, "give >= 0 (0, 1 = no "
                         "shared prompt rows)");
    if (p->queue_images < 0)
        return bad_param("queue_images", p->queue_images, "give >= 0 (0 = the default)");
    if (p->batching < 0 || p->batching > 1)
        return bad_param("batching", p->batching, "give 0 (continuous) or 1 (blocks)");
    if (p->draft_len < 0 || p->draft_len > FLEXDIAG_MAX_DRAFT)
        return bad_param("draft_len", p->draft_len, "give 0 or 1 (sequential decoding) or 2 .. 64 "
                         "tokens a pass (speculative Jacobi decoding)");
    return FLEXDIAG_OK;
}

/* An upper bound of the bytes the context's buffers take (ctx_layout, the policy driver, the
 * host homes and workspaces), in double so that it cannot overflow: the KV rows, the per-token
 * and per-sequence buffers at the model's widest row, the policy driver's lists (ALiSA's grow
 * with n_att x n_att), with a factor 4 to spare. */
static double ctx_bytes_bound(const flexdiag_context *c) {
    const flexdiag_model_config *m = &c->m->cfg;
    const flexdiag_lm_config *l = &m->lm;
    double L = l->layers, S = c->geo.n_seq, n = c->geo.l_dec, dh = l->head_dim;
    double P = (double)c->geo.p_cap + c->geo.l_dec + c->pd.ring, H = l->heads + 2.0 * l->kv_heads;
    double V = l->vocab > m->image_vocab ? l->vocab : m->image_vocab;
    double width = l->hidden + 3.0 * l->ffn + 2 * H * dh + V + m->image_embed + m->head_dim_mid;
    double kv = L * 2 * S * l->kv_heads * dh * 4 * P;
    double rows = (S * P + PREFILL_TOKENS) * (width + 64) * 4;
    double policy = L * S * H * (P * 16 + 64) + L * S * n * n * 8;
    return 4 * (kv + rows + policy);
}

/* Refuse a context whose bound exceeds CTX_MAX_BYTES (no machine has it; the layout's size_t
 * sums stay exact below it), naming the fields that size it. */
static flexdiag_status ctx_check_bytes(const flexdiag_context *c) {
    double b = ctx_bytes_bound(c);
    if (b <= CTX_MAX_BYTES) return FLEXDIAG_OK;
    return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                         "context_params.max_images %d, context_params.max_prompt_len %d and "
                         "%d decode tokens would need about %.3g PiB of memory: lower them",
                         c->p.max_images, c->p.max_prompt_len, c->geo.l_dec,
                         b / 4 / (double)(1ull << 50));
}

/* Fill the geometry fields of c from its params (no allocation). */
/* Speculative Jacobi decoding (draft_len >= 2; geo.win rows a sequence in a decode pass): the
 * window pass (window.c) writes its rows where sequential decoding would and attends lists
 * planned position by position (kv_policy.h flexdiag__kvp_list_at / _plan_ahead; the ring
 * policies keep draft_len - 1 rows of slack, params slack), which this version does for the
 * policies that plan ahead (dense, window, streaming, the Diagonals past their build-up) with
 * every KV on the device. */
static flexdiag_status ctx_window_allowed(const flexdiag_context *c) {
    const char *why = c->geo.win < 2 ? NULL
                      : !flexdiag__kvp_plans_ahead(c->p.policy.kind)
                          ? "a policy whose lists depend on every step's attention scores"
                      : c->homes.s_host < c->geo.n_seq ? "KV homed below the device (kv_pct)"
                                                       : NULL;
    if (!why) return FLEXDIAG_OK;
    return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED,
                         "context_params.draft_len %d (speculative Jacobi decoding) with %s "
                         "(policy %s): this version runs it with dense, window, streaming, "
                         "diagonal and diagonal-sink4, every KV on the device "
                         "(docs/decoding.md); give draft_len 0 or change the other setting",
                         c->p.draft_len, why, flexdiag__kvp_name(c->p.policy.kind));
}

/* Grouped acceptance (params sjd_group > 0; sjd.h): codes grouped by their VQ codebook vectors,
 * so an SJD image context of a model with an image decoder, 2G + 1 codes at most its codebook. */
static flexdiag_status ctx_group_allowed(const flexdiag_context *c) {
    int32_t g = c->p.sjd_group;
    if (g < 0 || g > FLEXDIAG_MAX_GROUP)
        return bad_param("sjd_group", g, "give 0 (exact SJD) or 1 .. 64 codes either side of a "
                         "draft (grouped acceptance, lossy)");
    if (!g) return FLEXDIAG_OK;
    if (c->geo.rows_per_img == 1)
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED, "context_params.sjd_group %d (grouped "
                             "acceptance) with a text context: its tokens have no codebook to "
                             "group them by; give sjd_group 0", g);
    if (c->geo.win < 2)
        return bad_param("sjd_group", g, "grouped acceptance is an SJD rule: give "
                         "context_params.draft_len >= 2 too");
    if (2 * (int64_t)g + 1 > c->geo.vocab_out)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG, "context_params.sjd_group %d: a group "
                             "spans 2G + 1 = %d codes, more than the codebook's %d", g, 2 * g + 1,
                             c->geo.vocab_out);
    if (!c->m->vq)
        return flexdiag__err(FLEXDIAG_ERR_UNSUPPORTED, "context_params.sjd_group %d (grouped "
                             "acceptance) with a model without an image decoder, whose VQ "
                             "codebook groups the codes; give sjd_group 0", g);
    return FLEXDIAG_OK;
}

/* The groups' codebook table (params sjd_group > 0): the decoder's codebook read once. */
static flexdiag_status ctx_groups_open(flexdiag_context *c) {
    if (c->p.sjd_group < 1) return FLEXDIAG_OK;
    const flexdiag_model *m = c->m;
    const flexdiag_vq_config *vc = flexdiag__vq_get_config(m->vq);
    float *cb = malloc((size_t)vc->codebook_size * (size_t)vc->embed_dim * sizeof *cb);
    if (!cb) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "sjd_group: no host memory for the "
                                  "codebook (%d x %d)", vc->codebook_size, vc->embed_dim);
    pthread_mutex_lock(&m->rt->s_mu); /* image decodes share the decoder's stream */
    flexdiag_status st = flexdiag__vq_codebook(m->vq, m->vq_s, cb);
    pthread_mutex_unlock(&m->rt->s_mu);
    if (st == FLEXDIAG_OK)
        st = flexdiag__sjd_groups_make(cb, vc->codebook_size, vc->embed_dim, m->img_codes,
                                       c->geo.vocab_out, &c->groups);
    free(cb);
    return st;
}

/* Ring rows a window pass writes ahead (kv_policy.h params slack): draft_len - 1 for the ring
 * policies; dense's ring holds every position already. */
static int32_t ctx_slack(const flexdiag_context *c) {
    return c->p.policy.kind == FLEXDIAG_POLICY_DENSE ? 0 : c->geo.win - 1;
}

static flexdiag_status ctx_geometry(flexdiag_context *c) {
    const flexdiag_model_config *m = &c->m->cfg;
    const flexdiag_lm_config *l = &m->lm;
    ctx_output(c);
    FLEXDIAG_TRY(ctx_check_params(c));
    c->geo.n_img = c->p.max_images;
    c->geo.n_seq = c->geo.n_img * c->geo.rows_per_img;
    c->geo.mb_img = c->p.micro_batch > 0 && c->p.micro_batch < c->geo.n_img ? c->p.micro_batch : c->geo.n_img;
    c->geo.mb_seq = c->geo.mb_img * c->geo.rows_per_img;
    c->geo.n_mb = (c->geo.n_img + c->geo.mb_img - 1) / c->geo.mb_img;
    c->geo.p_cap = c->p.max_prompt_len;
    c->geo.win = c->p.draft_len > 1 ? c->p.draft_len : 1;
    if (l->pos_rows && (int64_t)c->geo.p_cap + c->geo.l_dec > l->max_pos)
        return flexdiag__err(FLEXDIAG_ERR_INVALID_ARG,
                             "context_params.max_prompt_len %d + %d decode tokens exceed the "
                             "model's %d learned positions (max_position_embeddings)",
                             c->geo.p_cap, c->geo.l_dec, l->max_pos);
    int32_t pf_cap = (c->pf_tokens > 0 ? c->pf_tokens : PREFILL_TOKENS) / c->geo.p_cap;
    c->geo.pf_seq = pf_cap < 1 ? 1 : pf_cap < c->geo.mb_seq ? pf_cap : c->geo.mb_seq;
    FLEXDIAG_TRY(ctx_kv_homes(c));
    while (c->homes.s_host < c->geo.n_seq && c->geo.mb_seq % c->geo.pf_seq) c->geo.pf_seq--; /* no chunk straddles */
    ctx_shared_prompts(c);
    int32_t w_s = c->geo.rows_per_img == 2 ? (c->geo.row_len ? c->geo.row_len : c->m->cfg.grid) : 0;
    int position = flexdiag__kvp_traits(c->p.policy.kind)->device == FLEXDIAG_KVP_DEV_POSITION;
    c->geo.win_lists = c->geo.win > 1 && !position ? l->layers * l->kv_heads : 1;
    FLEXDIAG_TRY(flexdiag__ctx_calib_open(c, w_s)); /* ssd, hack: the head plan */
    /* a window pass plans a stateful policy ahead from its host state machine */
    FLEXDIAG_TRY(flexdiag__pd_setup(&c->pd, &c->p.policy, c->m->rt->k, l->layers, l->heads,
                                    l->kv_heads, c->geo.n_seq, c->geo.blk_p, c->geo.l_dec, w_s,
                                    ctx_slack(c), c->heads,
                                    c->host_policy || c->geo.win_lists > 1));
    size_t row = (size_t)l->kv_heads * (size_t)l->head_dim * (size_t)c->m->rt->k->act_bytes;
    c->geo.seq_bytes = row * (size_t)(c->geo.blk_p + c->pd.ring);
    c->geo.pre_bytes = row * (size_t)c->geo.p_cap;
    FLEXDIAG_TRY(ctx_check_bytes(c));
    FLEXDIAG_TRY(ctx_window_allowed(c));
    FLEXDIAG_TRY(ctx_group_allowed(c));
    return flexdiag__cpu_attn_allowed(c);
}

/* Pinned host bytes of the KV home of the host-homed micro-batches (0: none). */
static size_t ctx_home_bytes(const flexdiag_context *c) {
    return (size_t)c->m->cfg.lm.layers * 2 * (size_t)(c->homes.s_disk - c->homes.s_host) * c->geo.seq_bytes;
}

/* Pinned host bytes of the disk home's staging regions (0: no disk home). */
static size_t ctx_disk_stage_bytes(const flexdiag_context *c) {
    return c->homes.s_disk < c->geo.n_seq ? flexdiag__kv_disk_stage_bytes(c->geo.mb_seq, c->geo.seq_bytes) : 0;
}

/* Store bytes of the disk home (0: none). */
static uint64_t ctx_disk_bytes(const flexdiag_context *c) {
    int32_t n_mb = (c->geo.n_seq - c->homes.s_disk + c->geo.mb_seq - 1) / c->geo.mb_seq;
    return n_mb ? flexdiag__kv_disk_bytes(c->m->cfg.lm.layers, n_mb, c->geo.mb_seq, c->geo.seq_bytes) : 0;
}

/* Pinned host bytes the context takes: the KV home, the disk home's staging and the CPU
 * attention's workspaces, in that order. */
static size_t ctx_host_bytes(const flexdiag_context *c) {
    return ctx_home_bytes(c) + ctx_disk_stage_bytes(c) + flexdiag__cpu_attn_host_bytes(c);
}

flexdiag_status flexdiag__context_sizes(const flexdiag_model *m, const flexdiag_context_params *p,
                                        size_t *dev, size_t *host) {
    flexdiag_context c;
    memset(&c, 0, sizeof c);
    c.m = (flexdiag_model *)m;
    c.p = *p;
    flexdiag_status st = ctx_geometry(&c);
    const flexdiag_kernels *k = m->rt->k;
    if (st == FLEXDIAG_OK) *dev = ctx_layout(&c, (size_t)k->act_bytes, NULL) + k->stream_bytes;
    if (st == FLEXDIAG_OK && host) *host = ctx_host_bytes(&c);
    flexdiag__ctx_calib_close(&c);
    return st;
}

flexdiag_status flexdiag__context_disk_bytes(const flexdiag_model *m,
                                             const flexdiag_context_params *p, uint64_t *out) {
    flexdiag_context c;
    memset(&c, 0, sizeof c);
    c.m = (flexdiag_model *)m;
    c.p = *p;
    flexdiag_status st = ctx_geometry(&c);
    if (st == FLEXDIAG_OK) *out = ctx_disk_bytes(&c);
    flexdiag__ctx_calib_close(&c);
    return st;
}

flexdiag_status flexdiag__context_bytes(const flexdiag_model *m, const flexdiag_context_params *p,
                                        size_t *out) {
    return flexdiag__context_sizes(m, p, out, NULL);
}

uint64_t flexdiag__context_host_avail(const flexdiag_model *m) {
    const flexdiag_runtime *rt = m->rt;
    if (rt->pool) {
        flexdiag_host_pool_stats ps;
        flexdiag__host_pool_stats(rt->pool, &ps);
        return ps.largest_free;
    }
    return rt->p.cpu_mem ? rt->p.cpu_mem : UINT64_MAX;
}

int32_t flexdiag__context_fit(const flexdiag_model *m, const flexdiag_context_params *p,
                              uint64_t avail) {
    flexdiag_context_params q = *p;
    uint64_t host_avail = flexdiag__context_host_avail(m);
    int32_t lo = 0, hi = 1 << 16; /* lo fits (0 = nothing), hi does not */
    while (hi - lo > 1) {
        int32_t mid = lo + (hi - lo) / 2;
        size_t dev = 0, host = 0;
        q.max_images = mid;
        if (flexdiag__context_sizes(m, &q, &dev, &host) == FLEXDIAG_OK && dev <= avail &&
            host <= host_avail)
            lo = mid;
        else
            hi = mid;
    }
    flexdiag__err_clear();
    return lo;
}

flexdiag_status flexdiag__context_pf_tables(flexdiag_context *c, int32_t q) {
    if (q == c->pf_table_q) return FLEXDIAG_OK;
    const flexdiag_kernels *k = c->m->rt->k;
    int32_t hkv = c->m->cfg.lm.kv_heads, mbt = c->geo.pf_seq * q;
    int32_t *pos = malloc((size_t)mbt * 4), *rows = malloc((size_t)mbt * (size_t)hkv * 4);
    flexdiag_status st = (pos && rows) ? FLEXDIAG_OK
                                       : flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "context: no memory");
    for (int32_t i = 0; st == FLEXDIAG_OK && i < mbt; i++) { /* row i: position i % q */
        pos[i] = i % q;
        for (int32_t h = 0; h < hkv; h++) rows[i * hkv + h] = i % q;
    }
    if (st == FLEXDIAG_OK) st = k->copy_h2d(c->b.pos_pf, pos, (size_t)mbt * 4, c->s);
    if (st == FLEXDIAG_OK)
        st = k->copy_h2d(c->b.rows_pf, rows, (size_t)mbt * (size_t)hkv * 4, c->s);
    if (st == FLEXDIAG_OK) st = k->stream_sync(c->s);
    free(pos);
    free(rows);
    c->pf_table_q = st == FLEXDIAG_OK ? q : 0;
    return st;
}

/* Host block of the sampled ids, step positions and draws (page-locked when the backend offers
 * it, so the per-step copies are asynchronous). */
static flexdiag_status host_alloc(flexdiag_context *c) {
    const flexdiag_kernels *k = c->m->rt->k;
    size_t each = al((size_t)c->geo.n_seq * (size_t)c->geo.win * 4);
    size_t total = 2 * each + al((size_t)c->geo.n_img * sizeof *c->up.srows);
    flexdiag_status st = k->host_alloc ? k->host_alloc(total, &c->up.block) : FLEXDIAG_OK;
    if (!k->host_alloc) c->up.block = malloc(total);
    if (st != FLEXDIAG_OK) return st;
    if (!c->up.block) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "context: no host memory");
    memset(c->up.block, 0, total);
    c->up.ids = c->up.block;
    c->up.pos = (int32_t *)((char *)c->up.block + each);
    c->up.srows = (flexdiag_sample_row *)((char *)c->up.block + 2 * each);
    return FLEXDIAG_OK;
}

/* The context's own stream, its device workspace charged to the arena. */
static flexdiag_status stream_open(flexdiag_context *c) {
    flexdiag_runtime *rt = c->m->rt;
    FLEXDIAG_TRY(flexdiag__arena_charge(&rt->arena, (int64_t)rt->k->stream_bytes,
                                        "a context's stream workspace"));
    c->stream_charge = rt->k->stream_bytes;
    FLEXDIAG_TRY(rt->k->stream_create(rt->p.device, rt->p.threads, &c->s));
    return rt->k->stream_sync(rt->s); /* the model's uploads are done before c->s reads them */
}

/* The scheduler over the carved block: all-device, or tiered when the model's layers are split
 * over device, pinned host and disk. */
/* The weights' scheduler over the carved block: all-device, or tiered when the model's layers
 * are split over device, pinned host and disk. */
static flexdiag_status sched_weights(flexdiag_context *c, size_t act, flexdiag_sched **out) {
    const flexdiag_runtime *rt = c->m->rt;
    const flexdiag_lm_config *l = &c->m->cfg.lm;
    flexdiag_sched_layout lay = {.n_layers = l->layers,
                                 .weights = c->m->w.layer0,
                                 .layer_bytes = c->m->w.layer_bytes,
                                 .kv = c->b.kv,
                                 .n_seq = c->homes.s_host,
                                 .seq_bytes = c->geo.seq_bytes,
                                 .act = c->b.x,
                                 .row_bytes = (size_t)l->hidden * act};
    if (!c->m->w.homes) return flexdiag__sched_resident_create(&lay, out);
    flexdiag_sched_tiered_params tp = {.lay = lay, .homes = c->m->w.homes, .k = rt->k,
                                       .device = rt->p.device, .compute = c->s,
                                       .slots = c->b.wslots, .n_slots = WEIGHT_SLOTS,
                                       .pool = rt->pool, .n_stage = FLEXDIAG_DISK_STAGE};
    return flexdiag__sched_tiered_create(&tp, out);
}

/* The context's scheduler: the weights' one, wrapped by the KV homes when the last
 * micro-batches keep their KV in pinned host memory or on disk (the pinned home and the disk
 * home's staging carved from the pool here, its extent from the store). */
static flexdiag_status sched_open(flexdiag_context *c, size_t act) {
    flexdiag_runtime *rt = c->m->rt;
    flexdiag_sched *inner = NULL;
    FLEXDIAG_TRY(sched_weights(c, act, &inner));
    if (c->homes.s_host == c->geo.n_seq) {
        c->sched = inner;
        return FLEXDIAG_OK;
    }
    c->homes.kv_host_bytes = ctx_host_bytes(c); /* the home, the disk staging, the workspaces */
    flexdiag_status st = flexdiag__tiers_pool_alloc(rt, c->homes.kv_host_bytes,
                                                    "the KV home of a context's host-homed "
                                                    "micro-batches (context_params.kv_pct, "
                                                    "context_params.cpu_attention)",
                                                    &c->homes.kv_host);
    if (st == FLEXDIAG_OK) memset(c->homes.kv_host, 0, c->homes.kv_host_bytes);
    uint64_t disk = ctx_disk_bytes(c);
    if (st == FLEXDIAG_OK && disk)
        st = flexdiag__tiers_store_alloc(rt, disk,
                                         "the KV home of a context's disk-homed micro-batches "
                                         "(context_params.kv_pct)",
                                         &c->homes.kv_disk);
    if (st != FLEXDIAG_OK) {
        flexdiag__sched_destroy(inner);
        return st;
    }
    flexdiag_sched_kv_params kp = {.k = rt->k, .device = rt->p.device, .compute = c->s,
                                   .n_layers = c->m->cfg.lm.layers, .n_seq = c->geo.n_seq,
                                   .s_host = c->homes.s_host, .s_disk = c->homes.s_disk, .mb_seq = c->geo.mb_seq,
                                   .store = disk ? rt->store : NULL, .disk_off = c->homes.kv_disk.off,
                                   .disk_stage = disk ? (char *)c->homes.kv_host + ctx_home_bytes(c)
                                                      : NULL,
                                   .seq_bytes = c->geo.seq_bytes, .heads = c->m->cfg.lm.kv_heads,
                                   .p_cap = c->geo.p_cap, .span_rows = c->geo.p_cap + c->pd.ring,
                                   .row_bytes = (size_t)c->m->cfg.lm.head_dim *
                                                (size_t)rt->k->act_bytes,
                                   .host = c->homes.kv_host, .staging = c->b.kv_stage};
    return flexdiag__sched_kv_create(inner, &kp, &c->sched);
}

flexdiag_status flexdiag__context_alloc(flexdiag_context *c) {
    flexdiag_runtime *rt = c->m->rt;
    size_t act = (size_t)rt->k->act_bytes;
    FLEXDIAG_TRY(ctx_geometry(c));
    c->block_bytes = ctx_layout(c, act, NULL);
    char what[96];
    snprintf(what, sizeof what, "the KV cache and scratch of %d image(s)", c->geo.n_img);
    FLEXDIAG_TRY(flexdiag__arena_alloc(&rt->arena, c->block_bytes, what, &c->block));
    ctx_layout(c, act, c->block);
    FLEXDIAG_TRY(stream_open(c));
    FLEXDIAG_TRY(rt->k->memset0(c->block, c->block_bytes, c->s));
    FLEXDIAG_TRY(host_alloc(c));
    FLEXDIAG_TRY(flexdiag__pd_start(&c->pd, rt->p.threads));
    FLEXDIAG_TRY(sched_open(c, act));
    if (c->homes.kv_host)
        FLEXDIAG_TRY(flexdiag__cpu_attn_open(
            c, (char *)c->homes.kv_host + ctx_home_bytes(c) + ctx_disk_stage_bytes(c)));
    FLEXDIAG_TRY(ctx_groups_open(c));
    return flexdiag__context_pf_tables(c, c->geo.p_cap);
}

void flexdiag__context_free(flexdiag_context *c) {
    flexdiag_runtime *rt = c->m->rt;
    const flexdiag_kernels *k = rt->k;
    for (int i = 0; i < 2; i++)
        if (c->graphs.step[i]) k->graph_destroy(c->graphs.step[i]);
    flexdiag__cpu_attn_close(c); /* its jobs write the home and the workspaces */
    flexdiag__sched_destroy(c->sched); /* drains its copies into the block and home first */
    if (c->homes.kv_host) flexdiag__host_pool_free(rt->pool, c->homes.kv_host, c->homes.kv_host_bytes);
    if (c->homes.kv_disk.bytes) flexdiag__store_free(rt->store, &c->homes.kv_disk);
    if (c->s) k->stream_destroy(c->s); /* waits for the stream's work */
    flexdiag__arena_charge(&rt->arena, -(int64_t)c->stream_charge, "a context's stream");
    flexdiag__arena_free(&rt->arena, c->block, c->block_bytes);
    flexdiag__pd_fini(&c->pd);
    flexdiag__ctx_calib_close(c);
    flexdiag__sjd_groups_free(c->groups);
    if (k->host_free) k->host_free(c->up.block);
    else free(c->up.block);
}
