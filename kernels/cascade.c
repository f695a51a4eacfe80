/*
 * cascade.c - the cascade plan of shared prompt KV (kernels.h flexdiag__cascade_plan): the
 * sequences of a decode call grouped by the prompt block they read, cut into tiles a backend
 * attends with one read of that block each. Host code, shared by the runtime and the tests.
 */
#include <string.h>

#include "kernels/kernels.h"

/* Sequences per tile: FLEXDIAG_CASCADE_ROWS query rows of g heads each. */
static int32_t tile_seqs(int32_t g) { return FLEXDIAG_CASCADE_ROWS / g; }

int32_t flexdiag__cascade_tiles(int32_t n_seq, int32_t n_pre, int32_t g) {
    if (g < 1 || g > FLEXDIAG_CASCADE_ROWS || n_seq < 1 || n_pre < 1) return 0;
    int32_t per = tile_seqs(g), groups = n_pre < n_seq ? n_pre : n_seq;
    return (n_seq + per - 1) / per + groups; /* sum of ceil(k / per) over the groups */
}

void flexdiag__cascade_plan(const int32_t *prefix, int32_t n_seq, int32_t n_pre, int32_t g,
                            int32_t *seq, int32_t *tile) {
    int32_t cap = flexdiag__cascade_tiles(n_seq, n_pre, g), per = tile_seqs(g > 0 ? g : 1);
    int32_t n = 0, t = 0;
    if (cap == 0) return;
    memset(tile, 0, (size_t)cap * 3 * sizeof *tile);
    for (int32_t p = 0; p < n_pre; p++) { /* group p: its sequences in index order */
        int32_t first = n;
        for (int32_t s = 0; s < n_seq; s++) {
            int32_t q = prefix[s] < 0 ? 0 : prefix[s] >= n_pre ? n_pre - 1 : prefix[s];
            if (q == p) seq[n++] = s;
        }
        for (int32_t i = first; i < n; i += per, t++) {
            tile[3 * t] = p;
            tile[3 * t + 1] = i;
            tile[3 * t + 2] = n - i < per ? n - i : per;
        }
    }
}
