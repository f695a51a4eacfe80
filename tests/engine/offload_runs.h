/*
 * offload_runs.h - the weight-placement scenario shared by the CPU (tests/engine) and CUDA
 * (tests/gpu) tests: one prompt set generated (and one image scored) with every layer's weights
 * all on the device, then split over device, pinned host and disk by several --weights
 * placements; every placement must give the resident run's tokens and logits bit for bit (same
 * batch and micro-batch), with contexts run one after another, a run cancelled half way, and
 * two contexts on one split model.
 */
#ifndef FLEXDIAG_TEST_OFFLOAD_RUNS_H
#define FLEXDIAG_TEST_OFFLOAD_RUNS_H

#include <stdint.h>

/* Run the scenario on device (-1: the CPU engine) with builtin arch, the store in dir. cmocka
 * assertions fail the test on a mismatch. */
void to_run_placements(int device, const char *arch, int32_t batch, int32_t micro,
                       const char *dir);

#endif /* FLEXDIAG_TEST_OFFLOAD_RUNS_H */
