/*
 * cpu_attn.h - CPU attention (private to runtime/engine): the decode attention of a context's
 * host-homed micro-batches computed on the host over their KV in place (cpu_attn.c).
 *
 * A layer of such a micro-batch runs in two halves on the compute stream (layer.c): the first
 * projects q/k/v and calls send, which copies the rows into the micro-batch's pinned workspace
 * and queues the host job (append the new K/V row to the home, attend) behind them on the
 * context's host-function queue; the second calls recv, which makes the compute stream wait for
 * that job and copies the output into the attention buffer, then runs o_proj and the MLP. The
 * engine runs every first half of a layer before the second halves (run.c), so the host attends
 * micro-batch k while the device projects k+1 or finishes k-1. Each host micro-batch has its
 * own workspace, so no job ever reads another's rows.
 */
#ifndef FLEXDIAG_CPU_ATTN_H
#define FLEXDIAG_CPU_ATTN_H
#include "base/layer.h"
#if FLEXDIAG_LAYER != FLEXDIAG_LAYER_TESTS && !defined(FLEXDIAG_OWNER_RUNTIME_ENGINE)
#error "runtime/engine/cpu_attn.h is private to runtime/engine/ (docs/architecture.md)"
#endif
#include "runtime/engine/run_state.h"

typedef struct flexdiag_cpu_attn flexdiag_cpu_attn;

/* Pinned host bytes of c's CPU-attention workspaces (0 unless c->p.cpu_attention). */
size_t flexdiag__cpu_attn_host_bytes(const flexdiag_context *c);
/* Check that c's params allow CPU attention (KV in host memory, a position-only policy). */
flexdiag_status flexdiag__cpu_attn_allowed(const flexdiag_context *c);
/* Create c->homes.ca (when c->p.cpu_attention): the host-function queue, the attention threads, and
 * the workspaces in ws (flexdiag__cpu_attn_host_bytes of pinned memory, the context's). */
flexdiag_status flexdiag__cpu_attn_open(flexdiag_context *c, void *ws);
/* Wait for its jobs and free c->homes.ca; NULL is a no-op. */
void flexdiag__cpu_attn_close(flexdiag_context *c);
/* After the q/k/v projection of io (a host-homed micro-batch, io->mem.kv_host): queue its rows
 * down and its host job. */
flexdiag_status flexdiag__cpu_attn_send(const run_state *r, const flexdiag_layer_io *io);
/* Before o_proj of io: the compute stream waits for its job; the output goes to b.att. */
flexdiag_status flexdiag__cpu_attn_recv(const run_state *r, const flexdiag_layer_io *io);
/* The first failure of a host job since the context was made (after the step's sync). */
flexdiag_status flexdiag__cpu_attn_status(const flexdiag_context *c);

#endif /* FLEXDIAG_CPU_ATTN_H */
