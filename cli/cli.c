/*
 * cli.c - flag parsing, value ranges, error printing and the model and policy flags shared by
 * every flexdiag subcommand and by the bench tool (see cli.h); public API only. The CLI checks
 * what is its own (types, ranges of the sampling and size flags, which flags were given); the
 * policy rules are the library's (docs/policies.md §0.6) so every command accepts and refuses
 * the same policies.
 */
#include "cli/cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/fileio.h"

int cli_mkdirs(const char *path) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) return -1;
    memcpy(buf, path, n + 1);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
    struct stat st;
    return stat(buf, &st) == 0 && S_ISDIR(st.st_mode) ? 0 : -1;
}

int cli_check_writable(const char *cmd, const char *flag, const char *path) {
    struct stat st;
    int exists = stat(path, &st) == 0, e = 0;
    const char *why = exists && S_ISDIR(st.st_mode) ? "is a folder: give a file path" : NULL;
    const char *slash = strrchr(path, '/');
    char probe[4200]; /* a file made and removed in path's folder */
    snprintf(probe, sizeof probe, "%.*s/.flexdiag-write-check-XXXXXX",
             slash ? (int)(slash - path) : 1, slash ? path : ".");
    if (!why && exists && !S_ISREG(st.st_mode)) /* a pipe: opening it would wait for a reader */
        e = access(path, W_OK) ? errno : 0;
    else if (!why) {
        int fd = mkstemp(probe);
        e = fd < 0 ? errno : 0;
        if (fd >= 0) close(fd), unlink(probe);
    }
    if (!why && !e) return 0;
    fprintf(stderr, "flexdiag %s: %s %s: %s%s (nothing was run)\n", cmd, flag, path,
            why ? "" : "cannot write there: ", why ? why : strerror(e));
    return 1;
}

int cli_parse_size(const char *s, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || v < 0) return -1;
    double mul = 1;
    switch (*end) {
    case 'K': case 'k': mul = 1024.0; end++; break;
    case 'M': case 'm': mul = 1024.0 * 1024; end++; break;
    case 'G': case 'g': mul = 1024.0 * 1024 * 1024; end++; break;
    case 'T': case 't': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'B') end += (*end == 'i' && end[1] == 'B') ? 2 : 1;
    if (*end || !(v * mul < 18446744073709551616.0)) return -1; /* NaN, inf, >= 2^64 */
    *out = (uint64_t)(v * mul);
    return 0;
}

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

uint64_t cli_fnv1a64_ids(const int32_t *ids, int64_t n) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64 offset basis and prime */
    for (int64_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) {
            h ^= ((uint32_t)ids[i] >> (8 * b)) & 0xffu;
            h *= 0x100000001b3ull;
        }
    return h;
}

/* "a whole number in [lo, hi]" or "a number in (lo, hi]": o's range as help and errors say it. */
static void range_text(const cli_opt *o, char *buf, size_t n) {
    if (o->type == CLI_INT)
        snprintf(buf, n, "a whole number in [%lld, %lld]", (long long)o->lo, (long long)o->hi);
    else
        snprintf(buf, n, "a number in %c%g, %g]", o->lo_open ? '(' : '[', o->flo, o->fhi);
}

static void print_help(const char *cmd, const cli_opt *opts, int n) {
    printf("usage: flexdiag %s [flags]\n", cmd);
    for (int i = 0; i < n; i++) {
        char range[128] = "";
        if (opts[i].ranged) range_text(&opts[i], range, sizeof range);
        printf("  %-22s %s%s%s%s%s%s\n", opts[i].name, opts[i].help ? opts[i].help : "",
               *range ? "; " : "", range, opts[i].ranged && opts[i].note ? " (" : "",
               opts[i].ranged && opts[i].note ? opts[i].note : "",
               opts[i].ranged && opts[i].note ? ")" : "");
    }
    printf("  %-22s %s\n  %-22s %s\n", "--help", "these lines", "--version",
           "the version of flexdiag");
}

/* "flexdiag <cmd>: <flag> <value> is out of range: expected <range> (<note>)"; returns 2. */
static int out_of_range(const char *cmd, const cli_opt *o, const char *value) {
    char what[128];
    range_text(o, what, sizeof what);
    fprintf(stderr, "flexdiag %s: %s %s is out of range: expected %s%s%s%s\n", cmd, o->name,
            value, what, o->note ? " (" : "", o->note ? o->note : "", o->note ? ")" : "");
    return 2;
}

static int set_value(const char *cmd, const cli_opt *o, const char *v) {
    char *end = NULL;
    errno = 0;
    switch (o->type) {
    case CLI_STR: *(const char **)o->dst = v; return 0;
    case CLI_INT: {
        long long x = strtoll(v, &end, 10);
        if (end == v || *end || errno) break;
        if (o->ranged && (x < o->lo || x > o->hi)) return out_of_range(cmd, o, v);
        *(int64_t *)o->dst = x;
        return 0;
    }
    case CLI_F64: {
        double x = strtod(v, &end);
        if (end == v || *end || errno || !isfinite(x)) break;
        int inside = (o->lo_open ? x > o->flo : x >= o->flo) && x <= o->fhi;
        if (o->ranged && !inside) return out_of_range(cmd, o, v);
        *(double *)o->dst = x;
        return 0;
    }
    case CLI_SIZE:
        if (cli_parse_size(v, (uint64_t *)o->dst) == 0) return 0;
        fprintf(stderr, "flexdiag %s: %s: expected a size like 24G or 512M, got '%s'\n", cmd,
                o->name, v);
        return 2;
    case CLI_FLAG: *(int *)o->dst = 1; return 0;
    }
    fprintf(stderr, "flexdiag %s: %s: expected a %s, got '%s'\n", cmd, o->name,
            o->type == CLI_INT ? "whole number" : "finite number", v);
    return 2;
}

/* A flag registered twice would silently feed only its first entry: a bug in the table. */
static void check_unique(const char *cmd, const cli_opt *opts, int n) {
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (!strcmp(opts[i].name, opts[j].name)) {
                fprintf(stderr, "flexdiag %s: internal error: flag %s is registered twice\n",
                        cmd, opts[i].name);
                abort();
            }
}

int cli_parse(const char *cmd, int argc, char **argv, const cli_opt *opts, int n_opts) {
    check_unique(cmd, opts, n_opts);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            print_help(cmd, opts, n_opts);
            return 1;
        }
        if (!strcmp(a, "--version")) {
            printf("flexdiag %s\n", flexdiag_version());
            return 1;
        }
        const char *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const cli_opt *o = NULL;
        for (int j = 0; j < n_opts && !o; j++)
            if (strlen(opts[j].name) == len && !strncmp(opts[j].name, a, len)) o = &opts[j];
        if (!o) {
            fprintf(stderr, "flexdiag %s: unknown flag '%.*s' (see flexdiag %s --help)\n", cmd,
                    (int)len, a, cmd);
            return 2;
        }
        if (o->type == CLI_FLAG) {
            if (eq) {
                fprintf(stderr, "flexdiag %s: %s takes no value\n", cmd, o->name);
                return 2;
            }
            *(int *)o->dst = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) {
            fprintf(stderr, "flexdiag %s: %s needs a value\n", cmd, o->name);
            return 2;
        }
        int rc = set_value(cmd, o, v);
        if (rc) return rc;
    }
    return 0;
}

int cli_errorf(const char *cmd, int rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "flexdiag %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return rc;
}

/* ---- library messages in flag terms ---- */

/* The params fields library messages name (include/flexdiag.h) and the flags that set them.
 * An entry that another starts with comes first ("runtime_params.device -1"). */
static const struct {
    const char *field, *flag;
} field_flags[] = {
    {"runtime_params.device -1", "--cpu"},
    {"runtime_params.gpu_mem", "--gpu-mem"},
    {"runtime_params.cpu_mem", "--cpu-mem"},
    {"runtime_params.disk_mem", "--disk-mem"},
    {"runtime_params.offload_dir", "--offload-dir"},
    {"runtime_params.threads", "--threads"},
    {"runtime_params.compress_disk", "--compress-disk"},
    {"model_params.arch", "--arch"},
    {"model_params.weights_pct", "--weights"},
    {"model_params.compress_weights", "--compress-weights"},
    {"context_params.max_images", "--batch"},
    {"context_params.micro_batch", "--micro-batch"},
    {"context_params.max_prompt_len", "--max-prompt-len"},
    {"context_params.max_new_tokens", "--max-new-tokens"},
    {"context_params.text", "--max-new-tokens"},
    {"context_params.images_per_prompt", "--images-per-prompt"},
    {"context_params.batching", "--batching"},
    {"context_params.kv_pct", "--kv"},
    {"context_params.cpu_attention", "--cpu-attention"},
    {"context_params.cpu_attention_pct", "--cpu-attention-share"},
    {"context_params.policy.n_att", "--n-att"},
    {"context_params.policy.n_r", "--n-r"},
    {"context_params.policy.sparsity", "--sparsity"},
    {"context_params.policy_calib", "--calib"},
    {"context_params.ssd_tau", "--ssd-tau"},
    {"request.images_per_prompt", "--images-per-prompt"},
    {"request.temperature", "--temperature"},
    {"request.top_k", "--top-k"},
    {"request.top_p", "--top-p"},
    {"request.cfg_weight", "--cfg"},
    {"flexdiag_context_max_images", "--batch auto"},
};

static int is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* The flag of the field name that starts at p (a whole name: no name character after it), with
 * its length in *len; NULL when none does. */
static const char *flag_at(const char *p, size_t *len) {
    for (size_t i = 0; i < sizeof field_flags / sizeof field_flags[0]; i++) {
        size_t n = strlen(field_flags[i].field);
        if (!strncmp(p, field_flags[i].field, n) && !is_name_char(p[n])) {
            *len = n;
            return field_flags[i].flag;
        }
    }
    return NULL;
}

const char *cli_last_error(void) {
    static _Thread_local char out[2048];
    const char *msg = flexdiag_last_error(NULL);
    size_t n = 0;
    for (const char *p = msg; *p;) {
        size_t len = 1;
        const char *flag = p > msg && (is_name_char(p[-1]) || p[-1] == '.') ? NULL
                                                                             : flag_at(p, &len);
        const char *src = flag ? flag : p;
        size_t k = flag ? strlen(flag) : 1;
        if (n + k >= sizeof out) break;
        memcpy(out + n, src, k);
        n += k;
        p += len;
    }
    out[n] = '\0';
    return out;
}

int cli_fail(const char *cmd, flexdiag_status st) {
    const char *msg = cli_last_error();
    fprintf(stderr, "flexdiag %s: %s\n", cmd, msg && *msg ? msg : flexdiag_status_str(st));
    return st == FLEXDIAG_ERR_INVALID_ARG ? 2 : 1;
}

int cli_fail_io(const char *cmd) {
    fprintf(stderr, "flexdiag %s: %s\n", cmd, cli_io_error());
    return 1;
}

/* ---- model and policy flags ---- */

const char *cli_arch_help(void) {
    static char help[512];
    if (help[0]) return help;
    int at = snprintf(help, sizeof help, "builtin shape:");
    for (int32_t i = 0; flexdiag_builtin_arch(i) && at < (int)sizeof help; i++)
        at += snprintf(help + at, sizeof help - (size_t)at, "%s %s%s", i ? "," : "",
                       flexdiag_builtin_arch(i), i ? "" : " (default)");
    return help;
}

/* flag G,C,D (v; NULL: 100,0,0) into pct: three integers in 0..100 adding up to 100; what
 * names the percentages in the message. */
static int parse_pct3(const char *cmd, const char *flag, const char *what, const char *v,
                      uint32_t pct[3]) {
    pct[0] = 100, pct[1] = pct[2] = 0;
    if (!v) return 0;
    unsigned a, b, c;
    int end = 0;
    if (sscanf(v, "%3u,%3u,%3u%n", &a, &b, &c, &end) != 3 || v[end] != '\0' || a > 100 ||
        b > 100 || c > 100 || a + b + c != 100) {
        fprintf(stderr,
                "flexdiag %s: %s %s: expected G,C,D, three whole percentages of %s on GPU, "
                "pinned CPU and disk that add up to 100 (e.g. 50,50,0)\n",
                cmd, flag, v, what);
        return 2;
    }
    pct[0] = a, pct[1] = b, pct[2] = c;
    return 0;
}

static int parse_weights(const char *cmd, const char *v, uint32_t pct[3]) {
    return parse_pct3(cmd, "--weights", "the layer weights", v, pct);
}

int cli_kv_pct(const char *cmd, const cli_model_opts *o, uint32_t pct[3]) {
    if (parse_pct3(cmd, "--kv", "the block's micro-batches' KV cache", o->kv, pct)) return 2;
    if (!pct[2] || o->offload_dir) return 0;
    fprintf(stderr, "flexdiag %s: --kv %s puts KV on disk: give --offload-dir DIR (a folder on "
                    "the disk to use; --disk-mem caps the file)\n",
            cmd, o->kv);
    return 2;
}

void cli_kv_homes(const char *cmd, const cli_model_opts *o, flexdiag_context_params *cp) {
    (void)cli_kv_pct(cmd, o, cp->kv_pct);
    cp->cpu_attention = o->cpu_attention != 0;
    cp->cpu_attention_pct = (uint32_t)o->cpu_attn_share; /* checked: 0..100 */
}

/* --compress-weights: 0 (none) or 4 (4-bit groups) into *bits; 2 after a message. */
int cli_compress_bits(const char *cmd, const cli_model_opts *o, uint32_t *bits) {
    *bits = 0;
    if (!o->compress || !strcmp(o->compress, "none")) return 0;
    if (!strcmp(o->compress, "4bit")) {
        *bits = 4;
        return 0;
    }
    fprintf(stderr, "flexdiag %s: --compress-weights %s: expected none or 4bit\n", cmd,
            o->compress);
    return 2;
}

int cli_compress_disk(const char *cmd, const cli_model_opts *o, uint32_t *codec) {
    *codec = 0;
    if (!o->compress_disk || !strcmp(o->compress_disk, "none")) return 0;
    if (!strcmp(o->compress_disk, "zstd")) {
        *codec = 1;
        return 0;
    }
    fprintf(stderr, "flexdiag %s: --compress-disk %s: expected none or zstd\n", cmd,
            o->compress_disk);
    return 2;
}

int cli_check_model(const char *cmd, const cli_model_opts *o) {
    uint32_t pct[3], bits;
    if (parse_weights(cmd, o->weights, pct) || cli_kv_pct(cmd, o, pct) ||
        cli_compress_bits(cmd, o, &bits) || cli_compress_disk(cmd, o, &bits))
        return 2;
    if (o->cpu_attn_share && !o->cpu_attention) {
        fprintf(stderr, "flexdiag %s: --cpu-attention-share %lld divides the CPU attention: give "
                        "--cpu-attention too\n",
                cmd, (long long)o->cpu_attn_share);
        return 2;
    }
    return 0;
}

int cli_open_model(const char *cmd, const cli_model_opts *o, flexdiag_runtime **rt,
                   flexdiag_model **m) {
    if (cli_check_model(cmd, o)) return 2;
    if (o->model && (o->arch || o->random_weights)) {
        fprintf(stderr, "flexdiag %s: --model loads real weights; drop --arch/--random-weights\n",
                cmd);
        return 2;
    }
    flexdiag_runtime_params rp;
    flexdiag_runtime_params_init(&rp);
    if (o->cpu) rp.device = -1;
    else if (o->device > 0) rp.device = o->device;
    rp.gpu_mem = o->gpu_mem;
    rp.threads = (int)o->threads;
    rp.cpu_mem = o->cpu_mem;
    rp.disk_mem = o->disk_mem;
    rp.offload_dir = o->offload_dir;
    (void)cli_compress_disk(cmd, o, &rp.compress_disk); /* checked above */
    flexdiag_status st = flexdiag_runtime_create(&rp, rt);
    if (st != FLEXDIAG_OK) return cli_fail(cmd, st);
    flexdiag_model_params mp;
    flexdiag_model_params_init(&mp);
    if (o->arch) mp.arch = o->arch;
    mp.seed = (uint64_t)o->seed;
    (void)parse_weights(cmd, o->weights, mp.weights_pct); /* checked above */
    (void)cli_compress_bits(cmd, o, &mp.compress_weights);
    st = flexdiag_model_load(*rt, o->model, &mp, m);
    if (st == FLEXDIAG_OK) return 0;
    int rc = cli_fail(cmd, st);
    flexdiag_runtime_destroy(*rt);
    *rt = NULL;
    return rc;
}

int cli_policy_params(const char *cmd, const cli_policy_opts *o, flexdiag_policy_params *out) {
    flexdiag_policy_params_init(out);
    if (o->policy && flexdiag_policy_from_name(o->policy, &out->kind) != FLEXDIAG_OK) {
        fprintf(stderr, "flexdiag %s: --policy: %s\n", cmd, cli_last_error());
        return 2;
    }
    if (o->n_att > 0 && !isnan(o->sparsity)) {
        fprintf(stderr, "flexdiag %s: give --n-att or --sparsity, not both (--n-att %lld attends "
                "%lld decode tokens per step; --sparsity %g attends round((1-S) L_dec))\n", cmd,
                (long long)o->n_att, (long long)o->n_att, o->sparsity);
        return 2;
    }
    out->sparsity = o->sparsity; /* NaN when not given: a sparse policy then needs --n-att */
    out->n_att = (int32_t)o->n_att;
    out->n_r = (int32_t)o->n_r;
    return 0;
}

void cli_policy_calib(const cli_policy_opts *o, flexdiag_context_params *cp) {
    cp->policy_calib = o->calib;
    cp->ssd_tau = isnan(o->ssd_tau) ? 0.0 : o->ssd_tau > 0 ? o->ssd_tau : -1.0;
}

/* ---- --batch ---- */

int32_t cli_batch(const char *cmd, const char *value, flexdiag_model *m,
                  const flexdiag_context_params *cp) {
    if (strcmp(value, "auto")) {
        char *end;
        long b = strtol(value, &end, 10);
        if (end == value || *end || b < 1 || b > INT32_MAX) {
            fprintf(stderr, "flexdiag %s: --batch must be a positive number or 'auto', got '%s'\n",
                    cmd, value);
            return -1;
        }
        return (int32_t)b;
    }
    int32_t fit = 0;
    flexdiag_status st = flexdiag_context_max_images(m, cp, &fit);
    if (st != FLEXDIAG_OK) { /* bad params (each message names its flag), or no budget */
        cli_fail(cmd, st);
        return -1;
    }
    if (fit < 1)
        fprintf(stderr, "flexdiag %s: --batch auto: not even one image fits the memory budget "
                "(raise --gpu-mem or lower the prompt length)\n", cmd);
    return fit < 1 ? -1 : fit;
}
