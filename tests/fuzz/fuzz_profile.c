/*
 * fuzz_profile.c - libFuzzer target for the machine profile `flexdiag search` reads
 * (bench/cost_model.c cm_profile_read: the JSON `flexdiag profile` writes, or --profile FILE).
 * Each input is written into a private temp folder as profile.json and read through the same
 * call search makes, once without a device to match and once for the device "fuzz-device".
 *
 * Properties checked beyond "no crash, no sanitizer report":
 *   - a failure returns 1 (or 2 for another device's profile, which parsed), leaves the profile
 *     zeroed (1) and prints one line naming the file;
 *   - a success prints nothing and gives a profile the cost model can divide by: every rate
 *     finite and > 0, sample sizes increasing, disk figures and the optional rates (host read,
 *     CPU attention, KV load, small-op seconds under 1) >= 0, and the device the file names.
 *
 * The same entry point is replayed over tests/fuzz/corpus/profile by replay.c in the 'format'
 * suite.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bench/cost_model.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char *dir, *path; /* temp folder and profile.json */

static void check_usable(const cm_profile *p, const char *out) {
    FUZZ_CHECK(out[0] == 0, out);
    for (int i = 0; i < CM_COPY_SIZES; i++) {
        FUZZ_CHECK(isfinite(p->h2d[i]) && p->h2d[i] > 0, "h2d");
        FUZZ_CHECK(isfinite(p->d2h[i]) && p->d2h[i] > 0, "d2h");
        FUZZ_CHECK(p->copy_bytes[i] > 0 && (!i || p->copy_bytes[i] > p->copy_bytes[i - 1]),
                   "copy_bytes");
    }
    for (int i = 0; i < CM_GEMM_ROWS; i++) {
        FUZZ_CHECK(isfinite(p->gemm[i]) && p->gemm[i] > 0, "gemm");
        FUZZ_CHECK(p->gemm_rows[i] >= 1 && (!i || p->gemm_rows[i] > p->gemm_rows[i - 1]),
                   "gemm_rows");
    }
    FUZZ_CHECK(isfinite(p->hbm) && p->hbm > 0 && p->gemm_k >= 1, "hbm or gemm_k");
    FUZZ_CHECK(isfinite(p->disk) && p->disk >= 0 && p->disk_qd >= 0 && p->disk_req >= 0, "disk");
    /* optional fields: absent reads as 0 (no term), present ones finite and >= 0 */
    const double opt[] = {p->host_read, p->host_attn, p->kv_h2d, p->op_eager, p->op_graph};
    for (int i = 0; i < (int)(sizeof opt / sizeof opt[0]); i++)
        FUZZ_CHECK(isfinite(opt[i]) && opt[i] >= 0, "optional rate");
    FUZZ_CHECK(p->op_eager < 1 && p->op_graph < 1, "small-op seconds");
}

static void check_failure(int rc, const cm_profile *p, const char *out) {
    static const cm_profile zero;
    FUZZ_CHECK(rc == 1 || rc == 2, out);
    FUZZ_CHECK(rc == 2 || memcmp(p, &zero, sizeof zero) == 0, "failed read left a profile");
    FUZZ_CHECK(strncmp(out, "flexdiag fuzz: ", 15) == 0 && strstr(out, path) != NULL, out);
    FUZZ_CHECK(strchr(out, '\n') == out + strlen(out) - 1, out); /* one line */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir) {
        dir = fuzz_tempdir("fuzz-profile");
        path = fuzz_path(dir, "profile.json");
    }
    fuzz_write(path, data, size);
    for (int pass = 0; pass < 2; pass++) {
        cm_profile p;
        fuzz_stderr_begin();
        int rc = cm_profile_read("fuzz", path, pass ? "fuzz-device" : NULL, &p);
        const char *out = fuzz_stderr_end();
        if (rc) {
            check_failure(rc, &p, out);
            continue;
        }
        check_usable(&p, out);
        FUZZ_CHECK(!pass || !strcmp(p.device, "fuzz-device"), "device");
    }
    return 0;
}
