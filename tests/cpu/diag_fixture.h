/*
 * diag_fixture.h - fixture and oracle for attn_decode's fused Diagonal update (kernels.h
 * flexdiag_attn_args diag_lag), shared by the reference and fast CPU kernel tests.
 *
 * A fixture is a ch_attn_fix whose slot lists have the Diagonal shape: diag_base sink columns,
 * then one column per lag-list entry (entry e at column n_slots - 1 - e), with list kinds by
 * index li = s·h_kv + h: li % 4 == 0 full (n_slots = base + a), 1 partial (base + 1 <
 * n_slots < base + a for a >= 3), 2 no candidates (n_slots = base), 3 a single candidate
 * (n_slots = base + 1). Lag lists hold distinct random lags < 30000; the new lag of sequence s
 * (diag_next[s]) is DF_NEXT + s, so a lag written into another sequence's list shows; a test
 * may set it negative (no update for s). In "structured" mode the group's queries and its
 * candidate K rows are positive multiples of one vector, so scores are well separated (ref and
 * fast agree), and two candidates of each list get identical K rows at the lowest score: a
 * bitwise tie that the larger lag must win. The oracle df_expect is the literal argmin over a call's own logits.
 */
#ifndef FLEXDIAG_TEST_DIAG_FIXTURE_H
#define FLEXDIAG_TEST_DIAG_FIXTURE_H

#include <stdint.h>

#include "cpu/cpu_harness.h"
#include "kernels/kernels.h"

#define DF_NEXT 31000 /* diag_next[0]: above every initial lag, so a replaced entry stands out */

typedef struct df_case {
    int32_t n_seq, h_q, h_kv, d_h, p_cap; /* as ch_attn_case */
    int32_t a, base;                      /* lag list length, sink slots */
} df_case;

typedef struct df_fix {
    ch_attn_fix f; /* caches, queries, lp, slot lists; f.a carries diag_a / base / next */
    int64_t n_lag; /* n_seq·h_kv·a */
    int16_t *lag0; /* (n_seq, h_kv, a) initial lags, distinct within a list */
    int32_t *next; /* (n_seq) f.a.diag_next: DF_NEXT + s */
    int32_t *tie;  /* (n_seq·h_kv, 2) tied list entries (structured mode), -1 when none */
} df_fix;

/* Outputs of one decode call with the fused update (every buffer guarded). */
typedef struct df_out {
    float *out, *lse, *logits, *probs; /* lse / logits NULL when the call had none */
    int16_t *lag;                      /* lag lists after the call */
} df_out;

/* Build the fixture of c (structured: see top), deterministic in seed. */
void df_init(df_fix *d, const df_case *c, int structured, uint64_t seed);
void df_free(df_fix *d);
/* K->attn_decode on d with probs_out and diag_lag (a copy of lag0) set, and logits_out /
 * lse_out when with_logits; asserts success and intact guards. */
df_out df_run(const flexdiag_kernels *K, flexdiag_stream *s, const df_fix *d, int with_logits);
void df_out_free(df_out *o);
/* want (n_lag) = lag0 with, per list that has candidates and whose sequence s has next[s] >= 0,
 * the entry minimising (score, -lag) replaced by next[s]; score = max over the group's query
 * heads of logits (n_seq, h_q, max_slots). */
void df_expect(const df_fix *d, const float *logits, int16_t *want);

#endif /* FLEXDIAG_TEST_DIAG_FIXTURE_H */
