/*
 * layout.c - sizes and field offsets of the public structs, as the C compiler lays them out
 * from include/flexdiag.h, printed as JSON for tests/python/test_layout.py, which compares them
 * with the ctypes mirrors of python/flexdiag/_structs.py. Public header only.
 */
#include <stddef.h>
#include <stdio.h>

#include "flexdiag.h"

static int first = 1;   /* no struct printed yet */
static const char *sep; /* before the next field */

/* "Name": {"size": S, "fields": {"f": offset, ...}} */
#define BEGIN(py, c) printf("%s\"%s\": {\"size\": %zu, \"fields\": {", first ? "" : ", ", py, \
                            sizeof(c)), first = 0, sep = ""
#define FIELD(c, f) printf("%s\"%s\": %zu", sep, #f, offsetof(c, f)), sep = ", "
#define END() printf("}}")

static void params(void) {
    BEGIN("RuntimeParams", flexdiag_runtime_params);
    FIELD(flexdiag_runtime_params, device); FIELD(flexdiag_runtime_params, gpu_mem);
    FIELD(flexdiag_runtime_params, threads); FIELD(flexdiag_runtime_params, cpu_mem);
    FIELD(flexdiag_runtime_params, disk_mem); FIELD(flexdiag_runtime_params, offload_dir);
    FIELD(flexdiag_runtime_params, compress_disk);
    END();
    BEGIN("ModelParams", flexdiag_model_params);
    FIELD(flexdiag_model_params, arch); FIELD(flexdiag_model_params, random_weights);
    FIELD(flexdiag_model_params, seed); FIELD(flexdiag_model_params, weights_pct);
    FIELD(flexdiag_model_params, compress_weights);
    END();
    BEGIN("PolicyParams", flexdiag_policy_params);
    FIELD(flexdiag_policy_params, kind); FIELD(flexdiag_policy_params, n_att);
    FIELD(flexdiag_policy_params, n_r); FIELD(flexdiag_policy_params, sparsity);
    END();
    BEGIN("ContextParams", flexdiag_context_params);
    FIELD(flexdiag_context_params, max_images); FIELD(flexdiag_context_params, micro_batch);
    FIELD(flexdiag_context_params, max_prompt_len); FIELD(flexdiag_context_params, policy);
    FIELD(flexdiag_context_params, max_new_tokens); FIELD(flexdiag_context_params, progress);
    FIELD(flexdiag_context_params, progress_user); FIELD(flexdiag_context_params, text);
    FIELD(flexdiag_context_params, kv_pct); FIELD(flexdiag_context_params, cpu_attention);
    FIELD(flexdiag_context_params, images_per_prompt);
    FIELD(flexdiag_context_params, cpu_attention_pct);
    FIELD(flexdiag_context_params, queue_images); FIELD(flexdiag_context_params, batching);
    FIELD(flexdiag_context_params, draft_len); FIELD(flexdiag_context_params, sjd_group);
    FIELD(flexdiag_context_params, policy_calib); FIELD(flexdiag_context_params, ssd_tau);
    END();
    BEGIN("Request", flexdiag_request);
    FIELD(flexdiag_request, n_prompts); FIELD(flexdiag_request, prompts);
    FIELD(flexdiag_request, prompt_ids); FIELD(flexdiag_request, prompt_lens);
    FIELD(flexdiag_request, images_per_prompt); FIELD(flexdiag_request, cfg_weight);
    FIELD(flexdiag_request, temperature); FIELD(flexdiag_request, top_k);
    FIELD(flexdiag_request, top_p); FIELD(flexdiag_request, seed);
    FIELD(flexdiag_request, first_image);
    FIELD(flexdiag_request, draft_len); FIELD(flexdiag_request, sjd_group);
    END();
    BEGIN("SubmitParams", flexdiag_submit_params);
    FIELD(flexdiag_submit_params, on_image); FIELD(flexdiag_submit_params, on_token);
    FIELD(flexdiag_submit_params, on_done); FIELD(flexdiag_submit_params, user);
    FIELD(flexdiag_submit_params, wait_for_room);
    FIELD(flexdiag_submit_params, max_new_tokens); FIELD(flexdiag_submit_params, stop_at_eos);
    END();
    BEGIN("ScoreRequest", flexdiag_score_request);
    FIELD(flexdiag_score_request, prompt_ids); FIELD(flexdiag_score_request, prompt_len);
    FIELD(flexdiag_score_request, ids); FIELD(flexdiag_score_request, n);
    FIELD(flexdiag_score_request, cfg_weight);
    END();
}

static void outputs(void) {
    BEGIN("Output", flexdiag_output);
    FIELD(flexdiag_output, n_images); FIELD(flexdiag_output, tokens_per_image);
    FIELD(flexdiag_output, tokens);
    END();
    BEGIN("Stats", flexdiag_stats);
    FIELD(flexdiag_stats, prefill_s); FIELD(flexdiag_stats, decode_s);
    FIELD(flexdiag_stats, tokens_generated); FIELD(flexdiag_stats, kv_bytes_per_seq);
    FIELD(flexdiag_stats, evictions); FIELD(flexdiag_stats, peak_device_bytes);
    END();
    BEGIN("PolicyInfo", flexdiag_policy_info);
    FIELD(flexdiag_policy_info, kind); FIELD(flexdiag_policy_info, n_att);
    FIELD(flexdiag_policy_info, n_r); FIELD(flexdiag_policy_info, l_dec);
    FIELD(flexdiag_policy_info, sparsity);
    END();
    BEGIN("ScoreOutput", flexdiag_score_output);
    FIELD(flexdiag_score_output, vocab); FIELD(flexdiag_score_output, rows);
    FIELD(flexdiag_score_output, logits); FIELD(flexdiag_score_output, raw);
    END();
    BEGIN("HandleStats", flexdiag_handle_stats);
    FIELD(flexdiag_handle_stats, n_images); FIELD(flexdiag_handle_stats, done_images);
    FIELD(flexdiag_handle_stats, tokens); FIELD(flexdiag_handle_stats, queue_s);
    FIELD(flexdiag_handle_stats, first_token_s); FIELD(flexdiag_handle_stats, first_image_s);
    FIELD(flexdiag_handle_stats, total_s); FIELD(flexdiag_handle_stats, passes);
    FIELD(flexdiag_handle_stats, accepted);
    END();
}

static void offload_info(void) {
    BEGIN("OffloadInfo", flexdiag_offload_info);
    FIELD(flexdiag_offload_info, scheduler); FIELD(flexdiag_offload_info, weights_pct);
    FIELD(flexdiag_offload_info, weights_bytes); FIELD(flexdiag_offload_info, pinned_budget);
    FIELD(flexdiag_offload_info, pinned_used); FIELD(flexdiag_offload_info, pinned);
    FIELD(flexdiag_offload_info, pinned_note); FIELD(flexdiag_offload_info, disk_budget);
    FIELD(flexdiag_offload_info, disk_used); FIELD(flexdiag_offload_info, disk_io);
    FIELD(flexdiag_offload_info, disk_note); FIELD(flexdiag_offload_info, loads);
    FIELD(flexdiag_offload_info, h2d_bytes); FIELD(flexdiag_offload_info, disk_read_bytes);
    FIELD(flexdiag_offload_info, disk_wait_s); FIELD(flexdiag_offload_info, kv_pct);
    FIELD(flexdiag_offload_info, kv_bytes); FIELD(flexdiag_offload_info, kv_h2d_bytes);
    FIELD(flexdiag_offload_info, kv_d2h_bytes); FIELD(flexdiag_offload_info, cpu_attention);
    FIELD(flexdiag_offload_info, cpu_attn_d2h_bytes);
    FIELD(flexdiag_offload_info, cpu_attn_h2d_bytes);
    FIELD(flexdiag_offload_info, cpu_attn_kv_bytes); FIELD(flexdiag_offload_info, cpu_attn_s);
    FIELD(flexdiag_offload_info, kv_disk_read_bytes);
    FIELD(flexdiag_offload_info, kv_disk_write_bytes);
    FIELD(flexdiag_offload_info, kv_disk_wait_s); FIELD(flexdiag_offload_info, host_mb);
    FIELD(flexdiag_offload_info, cpu_attn_mb);
    END();
}

int main(void) {
    printf("{\"api_version\": %u, ", FLEXDIAG_API_VERSION);
    printf("\"structs\": {");
    params();
    outputs();
    offload_info();
    printf("}}\n");
    return 0;
}
