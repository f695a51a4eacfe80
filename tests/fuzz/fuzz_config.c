/*
 * fuzz_config.c - libFuzzer target for the model config reader (runtime/model/config.c).
 *
 * The input is written into a private temp folder as config.json; when it holds a NUL byte, the
 * bytes before it are config.json and those after it generation_config.json (which the reader
 * also opens), so one input can reach both files. flexdiag__config_load then reads the folder
 * exactly as for a user's model (every layout: multi_modality, janus, llama, opt, chameleon).
 *
 * Properties checked beyond "no crash, no sanitizer report": a failed load returns one of the
 * documented statuses with a message; a successful load yields a config that passes
 * flexdiag__config_validate again and whose fields hold what the engine relies on, checked here
 * independently: known arch, a name, positive sizes, heads a multiple of kv_heads, an even
 * head_dim <= 256, positive epsilon and RoPE base, special ids >= -1, and for Janus an aligner as
 * wide as the model, 1..4 aligner layers and image_tokens = grid² computed without overflow;
 * for Chameleon image codes inside the vocabulary, an even grid and every structural id.
 *
 * The same entry point is replayed over tests/fuzz/corpus/config by replay.c in the 'format'
 * suite.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/core.h"
#include "fuzz_util.h"
#include "runtime/model/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char *dir, *config_path, *gen_path; /* temp folder and its two files */

static void setup_once(void) {
    dir = fuzz_tempdir("fuzz-config");
    config_path = fuzz_path(dir, "config.json");
    gen_path = fuzz_path(dir, "generation_config.json");
    flexdiag_log_set(NULL, FLEXDIAG_LOG_ERROR, NULL);
}

static void check_lm(const flexdiag_lm_config *l, const char *msg) {
    FUZZ_CHECK(l->hidden > 0 && l->layers > 0 && l->heads > 0 && l->kv_heads > 0, msg);
    FUZZ_CHECK(l->ffn > 0 && l->vocab > 0, msg);
    FUZZ_CHECK(l->heads % l->kv_heads == 0, msg);
    FUZZ_CHECK(l->head_dim > 0 && l->head_dim % 2 == 0 && l->head_dim <= 256, msg);
    FUZZ_CHECK(l->rms_eps > 0 && l->rope_theta > 0, msg);
}

static void check_janus(const flexdiag_model_config *c, const char *msg) {
    FUZZ_CHECK(c->image_vocab > 0 && c->image_embed > 0 && c->head_dim_mid > 0, msg);
    FUZZ_CHECK(c->aligner_depth >= 1 && c->aligner_depth <= 4, msg);
    FUZZ_CHECK(c->aligner_dim == c->lm.hidden, msg);
    FUZZ_CHECK(c->grid > 0 && (int64_t)c->grid * c->grid == c->image_tokens, msg);
}

/* id in [0, vocab) */
static int in_vocab(const flexdiag_model_config *c, int32_t id) {
    return id >= 0 && id < c->lm.vocab;
}

/* Chameleon with image codes: one contiguous range of ids inside the vocabulary, an even grid,
 * every structural id named. */
static void check_chameleon(const flexdiag_model_config *c, const char *msg) {
    FUZZ_CHECK(c->image_vocab >= 0, msg);
    if (c->image_vocab == 0) return; /* text only */
    FUZZ_CHECK(in_vocab(c, c->img_id0) && (int64_t)c->img_id0 + c->image_vocab <= c->lm.vocab,
               msg);
    FUZZ_CHECK(c->grid >= 2 && c->grid % 2 == 0 && (int64_t)c->grid * c->grid == c->image_tokens,
               msg);
    FUZZ_CHECK(in_vocab(c, c->boi_id) && in_vocab(c, c->eoi_id) && in_vocab(c, c->row_end_id) &&
                   in_vocab(c, c->size_id) && in_vocab(c, c->eot_id),
               msg);
}

/* A config the loader accepted must hold what the engine relies on. */
static void check_config(const flexdiag_model_config *c) {
    const char *msg = "accepted config";
    FUZZ_CHECK(c->arch == FLEXDIAG_ARCH_JANUS || c->arch == FLEXDIAG_ARCH_LLAMA ||
                   c->arch == FLEXDIAG_ARCH_OPT || c->arch == FLEXDIAG_ARCH_CHAMELEON,
               msg);
    FUZZ_CHECK(memchr(c->name, 0, sizeof c->name) != NULL && c->name[0] != 0, msg);
    FUZZ_CHECK(c->bos_id >= -1 && c->pad_id >= -1 && c->boi_id >= -1, msg);
    check_lm(&c->lm, msg);
    if (c->arch == FLEXDIAG_ARCH_JANUS) check_janus(c, msg);
    if (c->arch == FLEXDIAG_ARCH_CHAMELEON) check_chameleon(c, msg);
    FUZZ_CHECK(flexdiag__config_validate(c) == FLEXDIAG_OK, flexdiag__err_msg());
}

/* config.json = data up to the first NUL; generation_config.json = the rest, if any. */
static void write_inputs(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t n = nul ? (size_t)(nul - data) : size;
    fuzz_write(config_path, data, n);
    if (nul)
        fuzz_write(gen_path, nul + 1, size - n - 1);
    else
        unlink(gen_path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir) setup_once();
    write_inputs(data, size);
    flexdiag_model_config c;
    flexdiag__err_clear();
    flexdiag_status st = flexdiag__config_load(dir, &c);
    if (st != FLEXDIAG_OK) {
        FUZZ_CHECK(st == FLEXDIAG_ERR_NOT_FOUND || st == FLEXDIAG_ERR_CORRUPT_MODEL ||
                       st == FLEXDIAG_ERR_UNSUPPORTED,
                   flexdiag__err_msg());
        FUZZ_CHECK(flexdiag__err_msg()[0] != 0, "failed load without a message");
        return 0;
    }
    check_config(&c);
    return 0;
}
