/*
 * lists.c - the comma lists of the bench commands (--policies, --sparsities of `bench` and
 * `bench fidelity`, the Diagonal rings of --n-r of `bench fidelity` and `search`); errors name
 * the flag and the valid values, and exit 2.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "policy/kv_policy.h"

/* Parse the comma list s item by item (item() returns 0 when tok is valid and stores it at
 * index i); returns the count, or -1 with *bad pointing at the first bad token (inside buf) or
 * NULL for an empty list. */
static int split_list(const char *s, char *buf, size_t buf_n,
                      int (*item)(const char *, int, void *), void *out, const char **bad) {
    snprintf(buf, buf_n, "%s", s);
    int n = 0;
    *bad = NULL;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (n == BENCH_MAX_LIST || item(tok, n, out)) {
            *bad = tok;
            return -1;
        }
        n++;
    }
    return n > 0 ? n : -1;
}

static int policy_item(const char *tok, int i, void *out) {
    return flexdiag__kvp_parse(tok, (flexdiag_policy_kind *)out + i);
}

static int sparsity_item(const char *tok, int i, void *out) {
    char *end = NULL;
    double v = strtod(tok, &end);
    ((double *)out)[i] = v;
    return end == tok || *end || !(v >= 0.0 && v <= 1.0);
}

static int ring_item(const char *tok, int i, void *out) {
    char *end = NULL;
    long v = strtol(tok, &end, 10);
    ((int32_t *)out)[i] = (int32_t)v;
    return end == tok || *end || v < 0 || v > 32767;
}

/* Split the numeric list s of flag into out (*n items); a bad item is named with rule, an
 * empty list said so: 2 after the message. */
static int parse_numbers(const char *cmd, const char *flag, const char *s,
                         int (*item)(const char *, int, void *), void *out, int *n,
                         const char *rule) {
    char buf[512];
    const char *bad;
    if ((*n = split_list(s, buf, sizeof buf, item, out, &bad)) > 0) return 0;
    if (bad)
        fprintf(stderr, "flexdiag %s: %s %s: %s (a comma list of at most %d)\n", cmd, flag, bad,
                rule, BENCH_MAX_LIST);
    else
        fprintf(stderr, "flexdiag %s: %s is empty\n", cmd, flag);
    return 2;
}

int bench_parse_sparsities(const char *cmd, const char *s, double *out, int *n) {
    return parse_numbers(cmd, "--sparsities", s, sparsity_item, out, n,
                         "not a number in [0, 1] (e.g. 0.8,0.9,0.95)");
}

int bench_parse_rings(const char *cmd, const char *s, int32_t *out, int *n) {
    return parse_numbers(cmd, "--n-r", s, ring_item, out, n,
                         "not a ring size in [0, 32767] (0: the default ring; e.g. 0,144,64)");
}

int bench_parse_policies(const char *cmd, const char *s, flexdiag_policy_kind *out, int *n) {
    char buf[512];
    const char *bad;
    if ((*n = split_list(s, buf, sizeof buf, policy_item, out, &bad)) > 0) return 0;
    if (bad)
        fprintf(stderr, "flexdiag %s: --policies: unknown policy '%s' or more than %d (valid: "
                "%s)\n", cmd, bad, BENCH_MAX_LIST, flexdiag__kvp_names());
    else
        fprintf(stderr, "flexdiag %s: --policies is empty (valid: %s)\n", cmd,
                flexdiag__kvp_names());
    return 2;
}

int bench_has_ring(flexdiag_policy_kind kind) {
    return flexdiag__kvp_traits(kind)->has_ring;
}
