/*
 * test_golden_cuda.c - the golden checks of test_golden on the CUDA backend (device 0): every
 * fixture's transformers logits and hidden states within relative L2 2e-2 (bf16 activations on
 * the GPU against fp32 references; the measured values are printed). What does not depend on
 * the backend (layouts, tokenizer, CLI runs, the Janus VQ pixels) stays in test_golden. Exits
 * 77 without a CUDA build or device, or without any fixture.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

#include "golden.h"

int main(void) {
    size_t free_b = 0, total_b = 0;
    if (!flexdiag__have_cuda()) {
        fprintf(stderr, "test_golden_cuda: built without CUDA\n");
        return 77;
    }
    if (flexdiag__kernels_cuda()->mem_info(&free_b, &total_b) != FLEXDIAG_OK || total_b == 0) {
        fprintf(stderr, "test_golden_cuda: no usable CUDA device\n");
        return 77;
    }
    gd_be = (gd_backend){.device = 0, .tol = 2e-2, .tag = "cuda"};
    const struct CMUnitTest janus[] = {
        cmocka_unit_test(test_janus_logits),
        cmocka_unit_test(test_janus_hidden),
    };
    const struct CMUnitTest llama[] = {cmocka_unit_test(test_llama)};
    const struct CMUnitTest opt[] = {cmocka_unit_test(test_opt)};
    const struct CMUnitTest opt_text[] = {cmocka_unit_test(test_opt_greedy_logits)};
    const struct CMUnitTest chameleon[] = {
        cmocka_unit_test(test_chameleon_text),
        cmocka_unit_test(test_chameleon_image),
    };
    int ran = 0, failed = GD_GROUP("janus (cuda)", "janus", NULL, janus, &ran);
    failed += GD_GROUP("llama (cuda)", "llama", NULL, llama, &ran);
    failed += GD_GROUP("opt (cuda)", "opt", NULL, opt, &ran);
    failed += GD_GROUP("opt text generation (cuda)", "opt", "greedy.json", opt_text, &ran);
    failed += GD_GROUP("chameleon (cuda)", "chameleon", NULL, chameleon, &ran);
    const struct CMUnitTest shapes[] = {cmocka_unit_test(test_shapes_logits)};
    failed += GD_GROUP("shapes-janus (trained, cuda)", "shapes", NULL, shapes, &ran);
    return failed ? 1 : ran ? 0 : 77;
}
