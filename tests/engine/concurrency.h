/*
 * concurrency.h - the independent-contexts scenario shared by the CPU (tests/engine) and CUDA
 * (tests/gpu) tests: one runtime, one model, several contexts with different policies and batch
 * sizes, run first one after another and then from one thread each at the same time; every
 * concurrent run must give the sequential run's tokens bit for bit.
 */
#ifndef FLEXDIAG_TEST_CONCURRENCY_H
#define FLEXDIAG_TEST_CONCURRENCY_H

#include <stdint.h>

/* Run the scenario on device (-1: the CPU engine with `threads` workers per context), the
 * model's layer weights placed by weights_pct (NULL: all on the device; a disk share needs
 * offload_dir), so the contexts' tiered schedulers share the pinned pool and the store. Returns 0
 * when every concurrent round matched; cmocka assertions fail the test otherwise. */
int tc_run_concurrency(int device, int threads, int rounds, const uint32_t weights_pct[3],
                       const char *offload_dir);

#endif /* FLEXDIAG_TEST_CONCURRENCY_H */
