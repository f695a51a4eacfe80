/*
 * fidelity_report.c - the printers of `flexdiag bench fidelity` rows (fidelity.h): a markdown
 * table on stdout and JSON lines with the policy's reporting traits (docs/policies.md §6). Both
 * runners (cmd_fidelity.c synthetic, fidelity_model.c model-backed) call these; nothing here
 * calls back.
 */
#include <math.h>
#include <stdio.h>

#include "bench/bench.h"
#include "bench/fidelity.h"
#include "policy/kv_policy.h"

void flexdiag_fidelity_md_header(FILE *f) {
    fprintf(f, "| policy | sparsity | N_att | N_r | attn_err | KL | top-1 | resident rows "
               "| resident KB | evictions |\n");
    fprintf(f, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
}

/* "%.4f" or "n/a" for NaN. */
static const char *fmt_opt(char *buf, size_t n, double v, const char *fmt) {
    if (isnan(v)) return "n/a";
    snprintf(buf, n, fmt, v);
    return buf;
}

void flexdiag_fidelity_md_row(FILE *f, const flexdiag_fidelity_row *r) {
    char kl[32], top1[32], nr[16] = "-";
    if (r->n_r > 0) snprintf(nr, sizeof nr, "%d", (int)r->n_r);
    fprintf(f, "| %s | %.4f | %d | %s | %.4f | %s | %s | %lld | %.1f | %llu |\n",
            flexdiag__kvp_name(r->kind), r->reported_sparsity, (int)r->n_att, nr, r->attn_err,
            fmt_opt(kl, sizeof kl, r->kl, "%.4f"), fmt_opt(top1, sizeof top1, r->top1, "%.4f"),
            (long long)r->resident_rows, (double)r->resident_bytes / 1024.0,
            (unsigned long long)r->evictions);
    fflush(f);
}

/* JSON string with the characters JSON requires escaped. */
static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

/* A number, or null for NaN. */
static void json_num(FILE *f, const char *key, double v) {
    if (isnan(v)) fprintf(f, ",\"%s\":null", key);
    else fprintf(f, ",\"%s\":%.6g", key, v);
}

int flexdiag_fidelity_jsonl_row(FILE *f, const flexdiag_fidelity_row *r) {
    const flexdiag_kvp_traits *tr = flexdiag__kvp_traits(r->kind);
    fprintf(f, "{\"bench\":\"fidelity\",\"mode\":");
    json_str(f, r->mode);
    fprintf(f, ",\"source\":");
    json_str(f, r->source);
    fprintf(f, ",\"policy\":\"%s\"", flexdiag__kvp_name(r->kind));
    json_num(f, "sparsity", r->sparsity);
    json_num(f, "reported_sparsity", r->reported_sparsity);
    fprintf(f, ",\"n_att\":%d,\"n_r\":%d,\"l_dec\":%d,\"prompt_len\":%d,\"heads\":%d,"
               "\"d_head\":%d,\"seed\":%llu", (int)r->n_att, (int)r->n_r, (int)r->l_dec,
            (int)r->prompt_len, (int)r->heads, (int)r->d_head, (unsigned long long)r->seed);
    json_num(f, "attn_err", r->attn_err);
    json_num(f, "attn_err_max", r->attn_err_max);
    json_num(f, "kl", r->kl);
    json_num(f, "top1", r->top1);
    fprintf(f, ",\"resident_rows\":%lld,\"resident_bytes\":%llu,\"evictions\":%llu",
            (long long)r->resident_rows, (unsigned long long)r->resident_bytes,
            (unsigned long long)r->evictions);
    if (r->prompts > 0) fprintf(f, ",\"prompts\":%d", (int)r->prompts);
    fprintf(f, ",\"phase\":\"decode\",\"score_source\":\"%s\",\"granularity\":\"%s\","
               "\"gqa_reduction\":\"%s\",\"normalisation\":\"full row\",\"positions\":\"keep\","
               "\"eviction\":\"%s\",\"resident_kv\":\"%s\",\"extra_work\":\"%s\","
               "\"needs_probabilities\":%s,\"provenance\":\"measured\"}\n",
            tr->score_source, tr->granularity, tr->gqa_reduction, tr->eviction, tr->resident_kv,
            tr->extra_work, tr->needs_probabilities ? "true" : "false");
    return fflush(f) == 0 && !ferror(f) ? 0 : -1;
}

int flexdiag_fidelity_rows_of(flexdiag_policy_kind kind, int ns, int n_rings) {
    return kind == FLEXDIAG_POLICY_DENSE ? 1 : bench_has_ring(kind) ? ns * n_rings : ns;
}
