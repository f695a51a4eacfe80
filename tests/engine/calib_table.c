/*
 * calib_table.c - the engine tests' calibration table (calib_table.h).
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
#include "calib_table.h"
#include "policy/kvp_calib.h"
#include "runtime/engine/ctx_calib.h"
#include "runtime/engine/engine.h"

char *ct_calib_file(flexdiag_model *m, const char *dir, const char *name) {
    flexdiag_context_params cp;
    flexdiag_context_params_init(&cp);
    cp.max_images = 2;
    cp.max_prompt_len = 16;
    cp.policy.kind = FLEXDIAG__POLICY_CALIBRATE;
    flexdiag_context *c = NULL;
    assert_int_equal(flexdiag_context_create(m, &cp, &c), FLEXDIAG_OK);
    static const int32_t a[6] = {256, 259, 'h', 'i', 260, 261}, b[4] = {256, 259, 'z', 261};
    const int32_t *pp[2] = {a, b}, pl[2] = {6, 4};
    int32_t *tokens = malloc((size_t)2 * (size_t)c->geo.l_dec * 4);
    flexdiag_block blk = {.n_img = 2, .prompt = pp, .prompt_len = pl, .n_steps = c->geo.l_dec,
                          .sp = {1.0f, 0, 1.0f, 5, 0}, .cfg_weight = 3.0f, .tokens = tokens};
    assert_int_equal(flexdiag__engine_run(c, &blk), FLEXDIAG_OK);
    flexdiag_kvp_calib *t = NULL;
    assert_int_equal(flexdiag__kvp_calib_export(c->pd.kvp, &t), FLEXDIAG_OK);
    t->config_hash = flexdiag__model_config_hash(&m->cfg);
    t->n_cal = 2, t->seed = 5;
    snprintf(t->backend, sizeof t->backend, "cpu");
    char *path = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(path, "%s/%s", dir, name);
    assert_int_equal(flexdiag__kvp_calib_write(path, t), FLEXDIAG_OK);
    flexdiag__kvp_calib_free(t);
    free(tokens);
    flexdiag_context_destroy(c);
    return path;
}
