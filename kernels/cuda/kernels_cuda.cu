/*
 * kernels_cuda.cu - the CUDA op table ("cuda"): bf16 activations (act_bytes 2; the image
 * decoder's are fp32), bf16 weights, fp32 logits, one cudaStream_t + cuBLAS/cuBLASLt handles
 * per flexdiag_stream.
 *
 * Only wiring: every slot points at a launcher of cuda_ops.cuh (streams, memory, conversions,
 * row ops, GEMM, CFG, sampling; one op per .cu file) or attn.cuh (KV append and attention, helper
 * F2's files). registry.c reaches this table through flexdiag__kernels_cuda_table() when the
 * build has CUDA. Image-decoder ops live in conv2d.cu and vq_ops.cu; the device-resident Diagonal
 * policy in diag_policy.cu; graph capture, page-locked staging and host registration in mem.cu;
 * events in event.cu.
 *
 * Device-side contracts the runtime must keep (documented at the launchers): ids passed to
 * embed / gather_rows are in range; sample writes id -1 for a row with non-finite logits or
 * settings out of range, and the runtime turns that into an error after copying the ids back.
 */
#include "kernels/cuda/attn.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.cuh"

/* Filled by assignment: C++17 (the CUDA standard of this build) has no designated
 * initialisers. */
static flexdiag_kernels make_table(void) {
    flexdiag_kernels t = {};
    t.name = "cuda";
    t.act_bytes = 2;
    t.stream_bytes = FLEXDIAG_CUDA_WORKSPACE_BYTES;
    t.stream_create = flexdiag__cuda_stream_create;
    t.stream_destroy = flexdiag__cuda_stream_destroy;
    t.stream_sync = flexdiag__cuda_stream_sync;
    t.copy_stream_create = flexdiag__cuda_copy_stream_create; /* no handles: stream_bytes is 0 */
    t.event_create = flexdiag__cuda_event_create;
    t.event_destroy = flexdiag__cuda_event_destroy;
    t.event_record = flexdiag__cuda_event_record;
    t.stream_wait_event = flexdiag__cuda_stream_wait_event;
    t.event_sync = flexdiag__cuda_event_sync;
    t.event_query = flexdiag__cuda_event_query;
    t.mem_alloc = flexdiag__cuda_mem_alloc;
    t.mem_free = flexdiag__cuda_mem_free;
    t.copy_h2d = flexdiag__cuda_copy_h2d;
    t.copy_d2h = flexdiag__cuda_copy_d2h;
    t.copy_d2d = flexdiag__cuda_copy_d2d;
    t.copy_h2d_async = flexdiag__cuda_copy_h2d; /* cudaMemcpyAsync: never waits for pinned memory */
    t.copy_d2h_async = flexdiag__cuda_copy_d2h_async;
    t.copy_h2d_2d_async = flexdiag__cuda_copy_h2d_2d;
    t.copy_d2h_2d_async = flexdiag__cuda_copy_d2h_2d;
    t.copy_h2d_slots_async = flexdiag__cuda_copy_slots;
    t.memset0 = flexdiag__cuda_memset0;
    t.host_fn = flexdiag__cuda_host_fn;
    t.mem_info = flexdiag__cuda_mem_info;
    t.device_name = flexdiag__cuda_device_name;
    t.pci_bus_id = flexdiag__cuda_pci_bus_id;
    t.device_count = flexdiag__cuda_device_count;
    t.act_to_f32 = flexdiag__cuda_act_to_f32;
    t.act_from_f32 = flexdiag__cuda_act_from_f32;
    t.embed = flexdiag__cuda_embed;
    t.pos_embed_add = flexdiag__cuda_pos_embed_add;
    t.rmsnorm = flexdiag__cuda_rmsnorm;
    t.layernorm = flexdiag__cuda_layernorm;
    t.qk_norm = flexdiag__cuda_qk_norm;
    t.matmul = flexdiag__cuda_matmul;
    t.swiglu = flexdiag__cuda_swiglu;
    t.gelu = flexdiag__cuda_gelu;
    t.relu = flexdiag__cuda_relu;
    t.gather_rows = flexdiag__cuda_gather_rows;
    t.wq4_unpack = flexdiag__cuda_wq4_unpack;
    t.kv_append = flexdiag__cuda_kv_append;
    t.attn_prefill = flexdiag__cuda_attn_prefill;
    t.attn_decode = flexdiag__cuda_attn_decode;
    t.cfg_combine = flexdiag__cuda_cfg_combine;
    t.sample = flexdiag__cuda_sample;
    t.host_alloc = flexdiag__cuda_host_alloc;
    t.host_free = flexdiag__cuda_host_free;
    t.host_register = flexdiag__cuda_host_register;
    t.host_unregister = flexdiag__cuda_host_unregister;
    t.graph_begin = flexdiag__cuda_graph_begin;
    t.graph_end = flexdiag__cuda_graph_end;
    t.graph_launch = flexdiag__cuda_graph_launch;
    t.graph_destroy = flexdiag__cuda_graph_destroy;
    t.diag_slots = flexdiag__cuda_diag_slots;
    t.diag_max_group = FLEXDIAG__CUDA_DEC_MAX_G;
    t.evict_plan = flexdiag__cuda_evict_plan;
    t.evict_update = flexdiag__cuda_evict_update;
    t.alisa_plan = flexdiag__cuda_alisa_plan;
    t.alisa_update = flexdiag__cuda_alisa_update;
    t.vq_lookup = flexdiag__cuda_vq_lookup;
    t.conv2d = flexdiag__cuda_conv2d;
    t.groupnorm = flexdiag__cuda_groupnorm;
    t.upsample2x = flexdiag__cuda_upsample2x;
    t.attn_spatial = flexdiag__cuda_attn_spatial;
    t.to_nhwc = flexdiag__cuda_to_nhwc;
    return t;
}

/* The table registry.c hands out as flexdiag__kernels_cuda(). */
extern "C" const flexdiag_kernels *flexdiag__kernels_cuda_table(void) {
    static const flexdiag_kernels table = make_table(); /* built once, thread-safe (C++11) */
    return &table;
}
