/*
 * kernels_cpu.c - the two CPU op tables.
 *
 * "cpu-ref" is the scalar reference: every op single-threaded and written for obviousness, the
 * oracle every other backend is tested against. "cpu" is the same table with matmul and the two
 * attention ops replaced by the multi-threaded fast versions, which use the thread pool of the
 * stream they are given (see cpu_stream.h). Both use fp32 activations (act_bytes 4) and host
 * memory as "device" memory. The slots the two tables share are listed once in
 * CPU_SHARED_OPS; each table then names its own matmul and attention.
 */
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_stream.h"
#include "kernels/cpu/ref_vq.h"

/* Slots identical in both tables (everything but matmul, attn_prefill, attn_decode and the two
 * parallel image-decoder ops). */
#define CPU_SHARED_OPS                                                                             \
    .act_bytes = 4,                                                                                \
    .stream_create = flexdiag__cpu_stream_create,                                                  \
    .stream_destroy = flexdiag__cpu_stream_destroy,                                                \
    .stream_sync = flexdiag__cpu_stream_sync,                                                      \
    .copy_stream_create = flexdiag__cpu_copy_stream_create,                                        \
    .event_create = flexdiag__cpu_event_create,                                                    \
    .event_destroy = flexdiag__cpu_event_destroy,                                                  \
    .event_record = flexdiag__cpu_event_record,                                                    \
    .stream_wait_event = flexdiag__cpu_stream_wait_event,                                          \
    .event_sync = flexdiag__cpu_event_sync,                                                        \
    .event_query = flexdiag__cpu_event_query,                                                      \
    .mem_alloc = flexdiag__cpu_mem_alloc,                                                          \
    .mem_free = flexdiag__cpu_mem_free,                                                            \
    .copy_h2d = flexdiag__cpu_copy,                                                                \
    .copy_d2h = flexdiag__cpu_copy_d2h,                                                            \
    .copy_d2d = flexdiag__cpu_copy,                                                                \
    .copy_h2d_async = flexdiag__cpu_copy,                                                          \
    .copy_d2h_async = flexdiag__cpu_copy,                                                          \
    .copy_h2d_2d_async = flexdiag__cpu_copy_2d,                                                    \
    .copy_d2h_2d_async = flexdiag__cpu_copy_2d,                                                    \
    .copy_h2d_slots_async = flexdiag__cpu_copy_slots,                                              \
    .memset0 = flexdiag__cpu_memset0,                                                              \
    .host_fn = flexdiag__cpu_host_fn,                                                              \
    .mem_info = NULL,                                                                              \
    .device_name = flexdiag__cpu_device_name,                                                      \
    .pci_bus_id = NULL, /* no device on a bus */                                                   \
    .host_register = flexdiag__cpu_host_register,                                                  \
    .host_unregister = flexdiag__cpu_host_unregister,                                              \
    .act_to_f32 = flexdiag__cpu_act_to_f32,                                                        \
    .act_from_f32 = flexdiag__cpu_act_from_f32,                                                    \
    .embed = flexdiag__cpu_ref_embed,                                                              \
    .pos_embed_add = flexdiag__cpu_ref_pos_embed_add,                                              \
    .rmsnorm = flexdiag__cpu_ref_rmsnorm,                                                          \
    .layernorm = flexdiag__cpu_ref_layernorm,                                                      \
    .qk_norm = flexdiag__cpu_ref_qk_norm,                                                          \
    .swiglu = flexdiag__cpu_ref_swiglu,                                                            \
    .gelu = flexdiag__cpu_ref_gelu,                                                                \
    .relu = flexdiag__cpu_ref_relu,                                                                \
    .gather_rows = flexdiag__cpu_ref_gather_rows,                                                  \
    .wq4_unpack = flexdiag__cpu_wq4_unpack,                                                        \
    .kv_append = flexdiag__cpu_ref_kv_append,                                                      \
    .cfg_combine = flexdiag__cpu_ref_cfg_combine,                                                  \
    .sample = flexdiag__cpu_ref_sample,                                                            \
    .diag_slots = flexdiag__cpu_diag_slots,                                                        \
    .evict_plan = flexdiag__cpu_evict_plan,                                                        \
    .evict_update = flexdiag__cpu_evict_update,                                                    \
    .alisa_plan = flexdiag__cpu_alisa_plan,                                                        \
    .alisa_update = flexdiag__cpu_alisa_update,                                                    \
    .diag_max_group = INT32_MAX /* both decodes fuse the Diagonal update for any group */

static const flexdiag_kernels cpu_ref_table = {
    .name = "cpu-ref",
    CPU_SHARED_OPS,
    .matmul = flexdiag__cpu_ref_matmul,
    .attn_prefill = flexdiag__cpu_ref_attn_prefill,
    .attn_decode = flexdiag__cpu_ref_attn_decode,
    .vq_lookup = flexdiag__cpu_ref_vq_lookup,
    .conv2d = flexdiag__cpu_ref_conv2d,
    .groupnorm = flexdiag__cpu_ref_groupnorm,
    .upsample2x = flexdiag__cpu_ref_upsample2x,
    .attn_spatial = flexdiag__cpu_ref_attn_spatial,
    .to_nhwc = flexdiag__cpu_ref_to_nhwc,
};

static const flexdiag_kernels cpu_fast_table = {
    .name = "cpu",
    CPU_SHARED_OPS,
    .matmul = flexdiag__cpu_fast_matmul,
    .attn_prefill = flexdiag__cpu_fast_attn_prefill,
    .attn_decode = flexdiag__cpu_fast_attn_decode,
    .vq_lookup = flexdiag__cpu_ref_vq_lookup,
    .conv2d = flexdiag__cpu_fast_conv2d,
    .groupnorm = flexdiag__cpu_ref_groupnorm,
    .upsample2x = flexdiag__cpu_ref_upsample2x,
    .attn_spatial = flexdiag__cpu_fast_attn_spatial,
    .to_nhwc = flexdiag__cpu_ref_to_nhwc,
};

const flexdiag_kernels *flexdiag__kernels_cpu_ref(void) { return &cpu_ref_table; }

const flexdiag_kernels *flexdiag__kernels_cpu(void) { return &cpu_fast_table; }
