/*
 * prompt.c - text prompt -> conditional prompt ids for a model: Janus (BOS .. <begin_of_image>),
 * Lumina-mGPT images (BOS, the generation template, end of turn, image start, size twice) or a
 * text model's [BOS] + encoding.
 *
 * Models loaded from a folder with tokenizer.json use its byte-level BPE tokenizer
 * (runtime/text/tokenizer.c). The builtin shapes have no tokenizer file, so they carry byte
 * tokenizers of their own: tiny-janus and micro-janus take ids 0..255 for bytes and the
 * specials below; the builtin Lumina shapes take the last 256 ids of their vocabulary. These
 * ids are part of the builtin models' definition (config.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/core.h"
#include "runtime/engine/engine.h"
#include "runtime/text/prompt.h"
#include "runtime/text/tokenizer.h"

enum { /* builtin byte tokenizer specials (tiny-janus and micro-janus, vocab 512) */
    BYTE_BOS = 256,
    BYTE_USER = 259,
    BYTE_ASSISTANT = 260,
    BYTE_BOI = 261,
};

static int is_space(unsigned char ch) { return ch == ' ' || (ch >= '\t' && ch <= '\r'); }

static flexdiag_status byte_prompt(const char *text, int32_t **ids, int64_t *n) {
    size_t len = strlen(text), a = 0, b = len;
    while (a < b && is_space((unsigned char)text[a])) a++;
    while (b > a && is_space((unsigned char)text[b - 1])) b--;
    int32_t *out = malloc((b - a + 16) * sizeof *out);
    if (!out) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "prompt: no memory");
    int64_t k = 0;
    out[k++] = BYTE_BOS;
    out[k++] = BYTE_USER;
    out[k++] = ':';
    out[k++] = ' ';
    for (size_t i = a; i < b; i++) out[k++] = (unsigned char)text[i];
    out[k++] = '\n';
    out[k++] = '\n';
    out[k++] = BYTE_ASSISTANT;
    out[k++] = ':';
    out[k++] = BYTE_BOI;
    *ids = out;
    *n = k;
    return FLEXDIAG_OK;
}

/* A text model's prompt: [BOS] + encode(text) (the BOS the model's tokenizer adds: </s> for
 * OPT, <s> for Llama; none when the config names none). */
static flexdiag_status text_prompt_ids(const flexdiag_model *m, const char *text, int32_t **ids,
                                       int64_t *n) {
    if (!m->tok)
        return flexdiag__err(FLEXDIAG_ERR_NOT_FOUND,
                             "model has no tokenizer.json: pass prompt token ids");
    int32_t *body = NULL;
    int64_t k = 0;
    FLEXDIAG_TRY(flexdiag__tok_encode(m->tok, text, strlen(text), &body, &k));
    int bos = m->cfg.bos_id >= 0;
    int32_t *out = malloc((size_t)(k + bos + 1) * sizeof *out);
    if (!out) {
        free(body);
        return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "prompt: out of host memory");
    }
    if (bos) out[0] = m->cfg.bos_id;
    memcpy(out + bos, body, (size_t)k * sizeof *out);
    free(body);
    *ids = out;
    *n = k + bos;
    return FLEXDIAG_OK;
}

/* Lumina-mGPT's image prompt: [BOS] + encode("Generate an image of PxP according to the
 * following prompt:\n" + caption) + <reserved08706>, then the image start and the size token
 * twice, which flexdiag prefills rather than samples (P = 16 pixels per code). */
static flexdiag_status lumina_prompt_ids(const flexdiag_model *m, const char *caption,
                                         int32_t **ids, int64_t *n) {
    const flexdiag_model_config *c = &m->cfg;
    size_t cap = strlen(caption) + 96;
    char *text = malloc(cap);
    if (!text) return flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "prompt: no host memory");
    int len = snprintf(text, cap, "Generate an image of %dx%d according to the following "
                       "prompt:\n%s", 16 * c->grid, 16 * c->grid, caption);
    int32_t *body = NULL;
    int64_t k = len;
    flexdiag_status st = FLEXDIAG_OK;
    if (m->tok) {
        st = flexdiag__tok_encode(m->tok, text, (size_t)len, &body, &k);
    } else if ((body = malloc((size_t)len * sizeof *body)) != NULL) { /* builtin bytes */
        for (int i = 0; i < len; i++) body[i] = c->lm.vocab - 256 + (unsigned char)text[i];
    } else {
        st = flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "prompt: no host memory");
    }
    free(text);
    int32_t *out = st == FLEXDIAG_OK ? malloc((size_t)(k + 5) * sizeof *out) : NULL;
    if (st == FLEXDIAG_OK && !out) st = flexdiag__err(FLEXDIAG_ERR_OOM_HOST, "prompt: no memory");
    if (st == FLEXDIAG_OK) {
        out[0] = c->bos_id;
        memcpy(out + 1, body, (size_t)k * sizeof *out);
        const int32_t tail[4] = {c->eot_id, c->boi_id, c->size_id, c->size_id};
        memcpy(out + 1 + k, tail, sizeof tail);
        *ids = out;
        *n = k + 5;
    }
    free(body);
    return st;
}

flexdiag_status flexdiag__prompt_ids(const flexdiag_model *m, const char *text, int image,
                                     int32_t **ids, int64_t *n) {
    *ids = NULL;
    *n = 0;
    if (m->cfg.arch == FLEXDIAG_ARCH_CHAMELEON && image) return lumina_prompt_ids(m, text, ids, n);
    if (m->cfg.arch != FLEXDIAG_ARCH_JANUS) return text_prompt_ids(m, text, ids, n);
    if (m->tok) return flexdiag__janus_prompt_ids(m->tok, text, ids, n);
    if (!m->dir) return byte_prompt(text, ids, n);
    return flexdiag__err(FLEXDIAG_ERR_NOT_FOUND,
                         "%s has no tokenizer.json: text prompts need it (or pass token ids)",
                         m->dir);
}

flexdiag_status flexdiag__special_ids(flexdiag_model *m) {
    if (!m->tok) return FLEXDIAG_OK;
    static const char *names[3] = {"<｜begin▁of▁sentence｜>", "<｜▁pad▁｜>", "<begin_of_image>"};
    int32_t *dst[3] = {&m->cfg.bos_id, &m->cfg.pad_id, &m->cfg.boi_id};
    for (int i = 0; i < 3; i++)
        if (*dst[i] < 0) *dst[i] = flexdiag__tok_id(m->tok, names[i]);
    return FLEXDIAG_OK;
}
