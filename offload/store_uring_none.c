/*
 * store_uring_none.c - the io_uring backend of a build without liburing (-Dio_uring=disabled, or
 * liburing-dev missing at configure time): open always fails, so the store runs its pread/pwrite
 * thread pool and says why. Keeping the choice in meson (this file or store_uring.c) keeps
 * #if out of the store.
 */
#include "offload/store_io.h"

#include <errno.h>
#include <stdio.h>

static int none_open(flexdiag_store *s, char *why, size_t n) {
    (void)s;
    snprintf(why, n, "this build has no io_uring (liburing >= 2.3 was not found at configure "
             "time: install liburing-dev and reconfigure with -Dio_uring=enabled)");
    return -ENOSYS;
}

const flexdiag_store_backend flexdiag__store_uring = {
    .name = "io_uring",
    .open = none_open,
};
