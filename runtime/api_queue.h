/*
 * api_queue.h - the request queue's hooks for the rest of the public API (private to runtime/):
 * a context's queue is made with the context and destroyed with it (its engine thread stopped
 * and joined first), and flexdiag_context_cancel cancels every request of it.
 */
#ifndef FLEXDIAG_API_QUEUE_H
#define FLEXDIAG_API_QUEUE_H

#include "base/layer.h"
#if FLEXDIAG_LAYER < FLEXDIAG_LAYER_RUNTIME
#error "runtime/api_queue.h: a lower layer may not use runtime/ (base <- policy <- kernels <- offload <- runtime; docs/architecture.md)"
#endif

#include "flexdiag.h"

/* The empty queue of c (no thread yet: the first submit starts it). */
flexdiag_status flexdiag__queue_create(flexdiag_context *c);
/* Cancel what c's queue holds, stop and join its engine thread, free it. NULL queue: no-op. */
void flexdiag__queue_destroy(flexdiag_context *c);
/* Cancel every request of c's queue not ended. */
void flexdiag__queue_cancel_all(flexdiag_context *c);
/* The checks of a request every entry point makes (struct_size, prompts, sampling fields), on
 * its copy at this library's size (fields past an older caller's struct at their defaults). */
flexdiag_status flexdiag__read_request(const flexdiag_request *r, flexdiag_request *copy);

#endif /* FLEXDIAG_API_QUEUE_H */
