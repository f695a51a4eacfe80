/*
 * names.c - one rule table that rewrites checkpoint tensor names onto each architecture's
 * canonical scheme (docs/formats.md §2.6).
 *
 * Janus: canonical = the original deepseek-ai names (`language_model.model.layers.N...`,
 * `gen_head...`, `gen_vision_model.decoder.conv_blocks.N.res.M...`); the transformers port
 * (`model.language_model...`, `model.generation_head...`, `model.vqmodel.decoder.up.N.block.M`)
 * is rewritten by prefix rules, then by segment rules inside the VQ decoder. Llama: the HF names
 * are canonical. Rules are data, not code, so adding a naming scheme is adding rows.
 */
#include <stdio.h>
#include <string.h>

#include "runtime/model/model.h"

typedef struct prefix_rule {
    const char *from; /* prefix of the checkpoint name */
    const char *to;   /* canonical replacement */
} prefix_rule;

/* transformers `janus` -> original deepseek-ai names; first match wins, so longer first. */
static const prefix_rule janus_prefix[] = {
    {"model.language_model.", "language_model.model."},
    {"lm_head.", "language_model.lm_head."},
    {"model.generation_embeddings.", "gen_embed."},
    {"model.generation_aligner.fc1.", "gen_aligner.layers.0."},
    {"model.generation_head.proj_out.", "gen_head.output_mlp_projector."},
    {"model.generation_head.vision_head.", "gen_head.vision_head."},
    {"model.vqmodel.", "gen_vision_model."},
    {"model.vision_model.", "vision_model."},
    {"model.aligner.", "aligner."},
};

/* VQ decoder segments, applied after the prefix rules to `...decoder.` names. */
static const prefix_rule vq_segment[] = {
    {"mid.block_1.", "mid.0."},
    {"mid.attn_1.", "mid.1."},
    {"mid.block_2.", "mid.2."},
};

static int copy_out(const char *s, char *out, size_t n) {
    size_t len = strlen(s);
    if (len + 1 > n) return -1;
    memcpy(out, s, len + 1);
    return 0;
}

/* `model.generation_aligner.hidden_layers.I.` -> `gen_aligner.layers.(2I+2).` (Linear layers
 * sit at even indices of the original nn.Sequential, GELUs at odd ones). */
static int rewrite_aligner_hidden(const char *name, char *buf, size_t n) {
    static const char pre[] = "model.generation_aligner.hidden_layers.";
    int idx = 0, used = 0;
    if (strncmp(name, pre, sizeof pre - 1)) return 0;
    if (sscanf(name + sizeof pre - 1, "%d.%n", &idx, &used) != 1 || used == 0) return 0;
    int w = snprintf(buf, n, "gen_aligner.layers.%d.%s", 2 * idx + 2, name + sizeof pre - 1 + used);
    return (w < 0 || (size_t)w >= n) ? -1 : 1;
}

/* `...decoder.up.N.block.M.` -> `...decoder.conv_blocks.N.res.M.`; `up.N.attn.` and
 * `up.N.upsample.` keep their tail; mid blocks by the segment table. */
static int rewrite_vq_decoder(char *buf, size_t n) {
    char *d = strstr(buf, "decoder.");
    if (!d || strncmp(buf, "gen_vision_model.", 17)) return 0;
    char tail[512], *seg = d + 8;
    int lvl = 0, used = 0, w;
    if (sscanf(seg, "up.%d.%n", &lvl, &used) == 1 && used > 0) {
        const char *rest = seg + used;
        if (!strncmp(rest, "block.", 6)) w = snprintf(tail, sizeof tail, "conv_blocks.%d.res.%s",
                                                      lvl, rest + 6);
        else w = snprintf(tail, sizeof tail, "conv_blocks.%d.%s", lvl, rest);
    } else {
        size_t i = 0;
        for (; i < sizeof vq_segment / sizeof vq_segment[0]; i++)
            if (!strncmp(seg, vq_segment[i].from, strlen(vq_segment[i].from))) break;
        if (i == sizeof vq_segment / sizeof vq_segment[0]) return 0;
        w = snprintf(tail, sizeof tail, "%s%s", vq_segment[i].to,
                     seg + strlen(vq_segment[i].from));
    }
    if (w < 0 || (size_t)w >= sizeof tail || (size_t)(seg - buf) + strlen(tail) + 1 > n) return -1;
    memcpy(seg, tail, strlen(tail) + 1);
    return 1;
}

static int janus_canonical(const char *name, char *out, size_t n) {
    int r = rewrite_aligner_hidden(name, out, n);
    if (r != 0) return r;
    r = 0;
    for (size_t i = 0; i < sizeof janus_prefix / sizeof janus_prefix[0]; i++) {
        size_t lf = strlen(janus_prefix[i].from);
        if (strncmp(name, janus_prefix[i].from, lf)) continue;
        int w = snprintf(out, n, "%s%s", janus_prefix[i].to, name + lf);
        if (w < 0 || (size_t)w >= n) return -1;
        r = 1;
        break;
    }
    if (!r && copy_out(name, out, n)) return -1;
    int v = rewrite_vq_decoder(out, n);
    return v < 0 ? -1 : (r || v);
}

/* OPT checkpoints name the decoder `model.decoder.` (OPTForCausalLM) or `decoder.` (OPTModel,
 * FlexGen's converter input). */
static int opt_canonical(const char *name, char *out, size_t n) {
    if (strncmp(name, "decoder.", 8)) return copy_out(name, out, n) ? -1 : 0;
    int w = snprintf(out, n, "model.%s", name);
    return w < 0 || (size_t)w >= n ? -1 : 1;
}

int flexdiag__name_canonical(flexdiag_arch arch, const char *name, char *out, size_t out_size) {
    if (arch == FLEXDIAG_ARCH_JANUS) return janus_canonical(name, out, out_size);
    if (arch == FLEXDIAG_ARCH_OPT) return opt_canonical(name, out, out_size);
    return copy_out(name, out, out_size) ? -1 : 0;
}
