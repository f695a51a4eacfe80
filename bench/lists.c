/*
 * lists.c - the comma lists of the bench commands (--policies, --sparsities of `bench` and
 * `bench fidelity`); errors name the flag and the valid values, and exit 2.
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

int bench_parse_sparsities(const char *cmd, const char *s, double *out, int *n) {
    char buf[512];
    const char *bad;
    if ((*n = split_list(s, buf, sizeof buf, sparsity_item, out, &bad)) > 0) return 0;
    if (bad)
        fprintf(stderr, "flexdiag %s: --sparsities: '%s' is not a number in [0, 1] (e.g. "
                "0.8,0.9,0.95; at most %d)\n", cmd, bad, BENCH_MAX_LIST);
    else
        fprintf(stderr, "flexdiag %s: --sparsities is empty\n", cmd);
    return 2;
}
