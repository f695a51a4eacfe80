/*
 * tiers.h - the runtime's memory tiers below the device: the pinned host pool and the NVMe store
 * (offload/host_pool.h, offload/store.h), made when a model's weight placement or a context's KV
 * home first needs them and sized by --cpu-mem / --disk-mem or, without them, by that need.
 */
#ifndef FLEXDIAG_TIERS_H
#define FLEXDIAG_TIERS_H

#include "base/layer.h"
#if FLEXDIAG_LAYER < FLEXDIAG_LAYER_RUNTIME
#error "runtime/tiers.h: a lower layer may not use runtime/ (base <- policy <- kernels <- offload <- runtime; docs/architecture.md)"
#endif

#include <stdint.h>

#include "flexdiag.h"
#include "offload/store.h"
#include "offload/weight_homes.h"

/* Disk staging buffers each context's scheduler takes from the pinned pool (one layer's disk
 * part each): reads stay a layer or two ahead of the copies that consume them. */
#define FLEXDIAG_DISK_STAGE 3

/* Make the pool and the store a model placed by cut needs (once per runtime; need[] holds the
 * bytes per tier from flexdiag__weights_plan). Without --cpu-mem the pool holds the host part
 * plus the disk staging of four contexts. A refusal names the flag to give or raise and the
 * bytes. */
flexdiag_status flexdiag__tiers_prepare(flexdiag_runtime *rt, const flexdiag_wcut *cut,
                                        const uint64_t need[3]);
/* Carve bytes of the pinned pool for `what` (a context's KV home), making the pool first when
 * no model needed one (sized by --cpu-mem, else by bytes). OOM_PINNED names the pool. */
flexdiag_status flexdiag__tiers_pool_alloc(flexdiag_runtime *rt, size_t bytes, const char *what,
                                           void **out);
/* Carve an extent of bytes of the store for `what` (a context's disk KV home), making the
 * store first when no model needed one (sized by --disk-mem, else by bytes; in --offload-dir,
 * which must be given). NO_SPACE names the store and says to raise --disk-mem. */
flexdiag_status flexdiag__tiers_store_alloc(flexdiag_runtime *rt, uint64_t bytes, const char *what,
                                            flexdiag_store_extent *out);
/* Free the tiers (models first). */
void flexdiag__tiers_free(flexdiag_runtime *rt);

#endif /* FLEXDIAG_TIERS_H */
