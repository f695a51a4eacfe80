/*
 * util.c - shared test helpers (see util.h).
 */

#include "util.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "base/core.h"
#include "kernels/kernels.h"

void tu_rng_seed(tu_rng *r, uint64_t seed) { r->s = seed * 0x9E3779B97F4A7C15ull + 1; }

uint64_t tu_rng_u64(tu_rng *r) {
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return r->s * 0x2545F4914F6CDD1Dull;
}

double tu_rng_uniform(tu_rng *r) { return (double)(tu_rng_u64(r) >> 11) / 9007199254740992.0; }

double tu_rng_normal(tu_rng *r) {
    double u1 = tu_rng_uniform(r), u2 = tu_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

int64_t tu_rng_int(tu_rng *r, int64_t lo, int64_t hi) {
    return lo + (int64_t)(tu_rng_u64(r) % (uint64_t)(hi - lo + 1));
}

void tu_fill_f32(tu_rng *r, float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(tu_rng_normal(r) * scale);
}

void tu_fill_bf16(tu_rng *r, uint16_t *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = flexdiag__f32_to_bf16((float)(tu_rng_normal(r) * scale));
}

float *tu_bf16_to_f32(const uint16_t *x, int64_t n) {
    float *f = malloc((size_t)(n > 0 ? n : 1) * sizeof *f);
    if (!f) {
        fprintf(stderr, "tu_bf16_to_f32: no memory for %lld values\n", (long long)n);
        abort();
    }
    for (int64_t i = 0; i < n; i++) f[i] = flexdiag__bf16_to_f32(x[i]);
    return f;
}

int tu_allclose(const char *label, const float *got, const float *ref, int64_t n, double atol,
                double rtol, double max_nmse) {
    int bad = 0;
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = got[i], f = ref[i];
        int gn = isnan(g), fn = isnan(f), gi = isinf(g) ? (g > 0 ? 1 : -1) : 0,
            fi = isinf(f) ? (f > 0 ? 1 : -1) : 0;
        int ok;
        if (gn || fn || gi || fi) ok = gn == fn && gi == fi;
        else ok = fabs(g - f) <= atol + rtol * fabs(f);
        if (!gn && !fn && !gi && !fi) {
            num += (g - f) * (g - f);
            den += f * f;
        }
        if (!ok && bad++ < 5)
            fprintf(stderr, "%s: mismatch at %lld: got %.9g ref %.9g\n", label, (long long)i, g, f);
        if (bad >= 10) break;
    }
    double nmse = den > 0 ? num / den : num;
    if (nmse > max_nmse) fprintf(stderr, "%s: nmse %.3g > %.3g\n", label, nmse, max_nmse);
    return bad == 0 && nmse <= max_nmse;
}

double tu_rel_l2(const float *got, const float *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

char *tu_tempdir(const char *tag) {
    const char *base = getenv("TMPDIR");
    char *p = NULL;
    if (asprintf(&p, "%s/flexdiag-%s-XXXXXX", base ? base : "/tmp", tag) < 0) return NULL;
    if (!mkdtemp(p)) {
        free(p);
        return NULL;
    }
    return p;
}

void tu_rmtree(const char *path) {
    if (path && strstr(path, "flexdiag-")) tu_system("rm -rf '%s'", path);
}

char *tu_data_path(const char *rel) {
    const char *base = getenv("FLEXDIAG_TEST_DATA");
    char *p = NULL;
    if (asprintf(&p, "%s/%s", base ? base : ".", rel) < 0) return NULL;
    return p;
}

int tu_write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, n, f);
    return (fclose(f) == 0 && w == n) ? 0 : -1;
}

void *tu_read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    if (buf && fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[len] = 0;
        if (n) *n = (size_t)len;
    }
    return buf;
}

int tu_system(const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    if (rc == -1) return -1;
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

int tu_run_in(const char *dir, const char *bin, const char *fmt, ...) {
    char args[3072];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    return tu_system("cd '%s' && '%s' %s >out.txt 2>err.txt", dir, bin, args);
}

char *tu_read_in(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return tu_read_file(path, NULL);
}

int tu_cuda_stream(const char *name, flexdiag_stream **s) {
    const flexdiag_kernels *k = flexdiag__kernels_cuda();
    if (!k) {
        fprintf(stderr, "%s: skipped: this build has no CUDA backend\n", name);
        return 77;
    }
    flexdiag_status st = k->stream_create(0, 0, s);
    if (st == FLEXDIAG_ERR_UNSUPPORTED) {
        fprintf(stderr, "%s: skipped: %s\n", name, flexdiag__err_msg());
        return 77;
    }
    if (st != FLEXDIAG_OK) {
        fprintf(stderr, "%s: stream_create(0) failed: %s\n", name, flexdiag__err_msg());
        return 1;
    }
    return 0;
}

void tu_on_table(int which, void (*check)(const flexdiag_kernels *k)) {
    const flexdiag_kernels *k = which == 0   ? flexdiag__kernels_cpu_ref()
                                : which == 1 ? flexdiag__kernels_cpu()
                                             : flexdiag__kernels_cuda();
    size_t fb = 0, tb = 0;
    if (which == 2 && (!k || k->mem_info(&fb, &tb) != FLEXDIAG_OK || tb == 0)) {
        flexdiag__err_clear();
        fprintf(stderr, "no CUDA device: the CUDA half is checked on GPU hosts\n");
        return;
    }
    check(k);
}

uint64_t tu_grid_fnv1a64(const struct json_t *grid, size_t *count) {
    uint64_t h = 0xcbf29ce484222325ull;
    *count = 0;
    for (size_t r = 0; r < json_array_size(grid); r++) {
        const json_t *row = json_array_get(grid, r);
        for (size_t c = 0; c < json_array_size(row); c++, (*count)++) {
            uint32_t v = (uint32_t)json_integer_value(json_array_get(row, c));
            for (int b = 0; b < 4; b++) h = (h ^ ((v >> (8 * b)) & 0xffu)) * 0x100000001b3ull;
        }
    }
    return h;
}
