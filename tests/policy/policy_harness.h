/*
 * policy_harness.h - drives the KV-policy state machines the way the engine does (plan ->
 * kernel logits of the planned slots + row log-sum-exp -> update) on synthetic quantised
 * logits, so the policy tests can compare the attended positions with literal references.
 *
 * Logits are a pure function of (seed, seq, layer, t, query head, decode position), quantised to
 * a few levels so that ties are frequent (optionally some at -200, whose fp32 probability is
 * exactly 0, so that accumulated H2O/TOVA/ALISA scores tie too); each row also has a prompt
 * part of fixed log-mass. The row lse is computed over the prompt plus the attended positions
 * in ascending position order, so a reference that attends the same set gets a bit-identical
 * lse.
 */
#ifndef FLEXDIAG_TEST_POLICY_HARNESS_H
#define FLEXDIAG_TEST_POLICY_HARNESS_H

#include <stdint.h>

#include "policy/kv_policy.h"

typedef struct ph_logits {
    uint64_t seed;  /* logit stream */
    int32_t levels; /* distinct logit values (>= 1); few levels = many ties */
    float step;     /* spacing of the levels */
    int32_t dead;   /* percent of logits at -200: probability exactly 0 in fp32 (exact ties of
                       accumulated scores) */
} ph_logits;

typedef struct ph_state {
    flexdiag_kvp *kvp;     /* the machine under test */
    flexdiag_kvp_params p; /* its params */
    ph_logits lg;          /* logit source */
    int32_t ms;            /* max_slots */
    int32_t *ws;           /* (n_seq, h_kv) write slots of the last step */
    int32_t *slots;        /* (n_seq, h_kv, ms) slot lists of the last step */
    int32_t *ns;           /* (n_seq, h_kv) */
    float *logits;         /* (n_seq, h_q, ms) */
    float *lse;            /* (n_seq, h_q) */
    int32_t *att;          /* (n_seq, h_kv, ms) attended positions of the last step, ascending */
    int32_t *tmp;          /* (ms) scratch */
} ph_state;

/* Logit of decode position pos for query head hq at step t. */
float ph_logit(const ph_logits *lg, int32_t seq, int32_t layer, int32_t t, int32_t hq,
               int32_t pos);
/* lse over the prompt part and the attended positions pos (n, ascending), fp64 then fp32. */
float ph_lse(const ph_logits *lg, int32_t seq, int32_t layer, int32_t t, int32_t hq,
             const int32_t *pos, int32_t n);
/* Create the machine; returns 0 on success (prints the library error otherwise). */
int ph_init(ph_state *st, const flexdiag_kvp_params *p, const ph_logits *lg);
void ph_free(ph_state *st);
/* One step of one layer for every sequence (plan and update each split in two ranges to
 * exercise s0/n); fills att. Fails the test if an attended slot holds no token. */
void ph_step(ph_state *st, int32_t layer, int32_t t);
/* Attended positions of (seq, KV head) after the last ph_step. */
const int32_t *ph_att(const ph_state *st, int32_t seq, int32_t h, int32_t *n);
/* Resident decode positions of (layer, seq, KV head) into out (ascending); returns the count. */
int32_t ph_resident(const ph_state *st, int32_t layer, int32_t seq, int32_t h, int32_t *out);

#endif /* FLEXDIAG_TEST_POLICY_HARNESS_H */
