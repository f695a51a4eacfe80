/*
 * fault.h - fault injection for the store tests, with no hook in the product: the test is
 * linked with -Wl,--wrap for the syscalls and liburing calls the store makes (tests/offload/
 * meson.build), and fault.c's __wrap_* functions pass through until a rule is armed.
 *
 *   threads backend: pread/pwrite fail with errno (EIO, ENOSPC, EINTR, EAGAIN) without
 *     calling the kernel, or are called with a shorter length (a real short transfer);
 *   io_uring backend: io_uring_submit[_and_wait] rewrites the SQEs about to be flushed: a
 *     shorter len (a real short transfer), or a NOP whose CQE res is set to -errno once the
 *     kernel posted it (a NOP completes inline during submission); submit_and_wait can also
 *     return -EINTR without entering the kernel;
 *   setup: io_uring_queue_init_params / io_uring_register_buffers fail with an errno,
 *     fallocate fails, fcntl refuses O_DIRECT.
 */
#ifndef FLEXDIAG_TEST_FAULT_H
#define FLEXDIAG_TEST_FAULT_H

#include <stdint.h>

enum { FI_SHORT = 1, FI_ERR = 2 };

typedef struct fi_rule {
    int kind;    /* FI_SHORT: half the length (rounded down to 4096, >= 4096); FI_ERR: fail */
    int err;     /* errno of FI_ERR */
    int op;      /* 0 reads, 1 writes, -1 both */
    int every;   /* fire on every `every`-th matching transfer (1: each) */
    int count;   /* fire at most this many times, -1: unlimited */
    int64_t off; /* only transfers starting at this file offset, -1: any */
} fi_rule;

/* Arm one rule (replacing any) / disarm; times the rule fired. Thread-safe. */
void fi_set(const fi_rule *r);
void fi_clear(void);
int fi_fired(void);

/* Setup faults: a negative errno to return (0: pass through). fi_submit_eintr is the number of
 * io_uring_submit_and_wait calls to answer -EINTR. */
extern int fi_uring_init_err;
extern int fi_register_err;
extern int fi_submit_eintr;
extern int fi_fallocate_err; /* positive errno */
extern int fi_odirect_err;   /* positive errno for fcntl(F_SETFL, ... | O_DIRECT) */

#endif /* FLEXDIAG_TEST_FAULT_H */
