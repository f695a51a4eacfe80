/*
 * calib_util.h - what the tests of the head-typed policies share (test_policy_ssd.c,
 * test_policy_hack.c, test_policy_calib.c): random calibration tables, a deterministic
 * probability source, and a driver that runs an ssd or hack state machine step by step against
 * literal references written in positions (docs/policies.md §9.6, §10.6):
 *   window    {max(0, t - N_att + 1) .. t};
 *   lags      {0 .. min(t, 3)} u {t - l : l in the head's list, t - l >= 4};
 *   semantic  A_t = {t} u (A_{t-1} \ V), V = {} while |A_{t-1}| < b, else the position of
 *             A_{t-1} \ {t - 1} with the smallest sum over the steps that attended it of the
 *             group-summed probability (ties: the smaller position).
 */
#ifndef FLEXDIAG_TEST_CALIB_UTIL_H
#define FLEXDIAG_TEST_CALIB_UTIL_H

#include <stdint.h>

#include "policy/kv_policy.h"
#include "policy/kvp_calib.h"
#include "util.h"

#define CU_MAXR 400 /* decode tokens of the test configurations at most */

/* A table of the shape with random profiles (each row a distribution, a skewed draw per lag)
 * and log-uniform variances in [e^-12, 1]; the identity fields zero but t0, t_end, pairs. */
flexdiag_kvp_calib *cu_table(tu_rng *r, int32_t n_layers, int32_t h_q, int32_t h_kv,
                             int32_t w_s, int32_t l_dec);
/* Probability fed to update() for (seed, step t, position p, query head q): eighths of 1/8, so
 * ties are frequent. */
float cu_prob(uint64_t seed, int32_t t, int32_t p, int32_t q);
/* Run kind on plan hd for every step of n_seq sequences and n_layers layers, checking each
 * list's attended set, write slot and the evictions against the references; returns the
 * evictions. */
uint64_t cu_run(const flexdiag_kvp_heads *hd, int32_t n_seq, int32_t h_q, uint64_t seed);

#endif /* FLEXDIAG_TEST_CALIB_UTIL_H */
