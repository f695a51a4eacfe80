/*
 * test_golden.c - the CPU engine against transformers (fixtures from
 * tools/golden/make_fixtures.py: tiny random models saved in bf16 and run by transformers in
 * float32), relative L2 error <= 1e-4 everywhere (the engine computes in fp32 from the same bf16
 * weights; the remaining difference is summation order), plus what does not depend on the
 * backend: alternative checkpoint and config layouts (bit-identical logits), the tokenizer, and
 * the CLI run as a process (`flexdiag score`, `flexdiag generate`). One group per fixture
 * (golden_*.c); a missing fixture skips its group, all missing gives 77; a wrong magic/version
 * fails naming the generator script. test_golden_cuda runs the logits checks on CUDA.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "golden.h"

int main(void) {
    gd_be = (gd_backend){.device = -1, .tol = 1e-4, .tag = "cpu"};
    const struct CMUnitTest janus[] = {
        cmocka_unit_test(test_janus_logits),
        cmocka_unit_test(test_janus_hidden),
        cmocka_unit_test(test_janus_original_names),
        cmocka_unit_test(test_janus_score_cli),
    };
    const struct CMUnitTest llama[] = {cmocka_unit_test(test_llama)};
    const struct CMUnitTest opt[] = {cmocka_unit_test(test_opt)};
    const struct CMUnitTest opt_text[] = {
        cmocka_unit_test(test_opt_tokenizer),
        cmocka_unit_test(test_opt_prompt_ids),
        cmocka_unit_test(test_opt_greedy_logits),
        cmocka_unit_test(test_opt_generate_cli),
    };
    const struct CMUnitTest chameleon[] = {
        cmocka_unit_test(test_chameleon_text),
        cmocka_unit_test(test_chameleon_qk_layouts),
        cmocka_unit_test(test_chameleon_image),
        cmocka_unit_test(test_chameleon_vqgan),
    };
    int ran = 0, failed = GD_GROUP("janus", "janus", NULL, janus, &ran);
    failed += GD_GROUP("llama", "llama", NULL, llama, &ran);
    failed += GD_GROUP("opt", "opt", NULL, opt, &ran);
    failed += GD_GROUP("opt text generation", "opt", "greedy.json", opt_text, &ran);
    failed += GD_GROUP("chameleon", "chameleon", NULL, chameleon, &ran);
    const struct CMUnitTest shapes[] = {cmocka_unit_test(test_shapes_logits)};
    failed += GD_GROUP("shapes-janus (trained)", "shapes", NULL, shapes, &ran);
    return failed ? 1 : ran ? 0 : 77;
}
