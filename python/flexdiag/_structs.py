# SPDX-License-Identifier: MIT
"""ctypes mirrors of the structs and callback types of include/flexdiag.h.

Owns the layouts: every Structure lists the header's fields in its order with its types
(bool -> c_bool, enums -> c_int, handles -> c_void_p), so ctypes.sizeof equals the C sizeof
(tests/python/test_layout.py compares them with a C program built from the header). Params
structs get their defaults from the library's _init() functions (INIT, used by _lib.init, which
sets struct_size to the binding's sizeof); fill() and as_dict() move fields from keyword
arguments and to dicts.
"""
import ctypes as c
import os

u32, i32, i64, u64 = c.c_uint32, c.c_int32, c.c_int64, c.c_uint64
f64 = c.c_double

# typedef bool (*flexdiag_progress_fn)(int phase, uint64_t done, uint64_t total, void *user)
PROGRESS_FN = c.CFUNCTYPE(c.c_bool, c.c_int, u64, u64, c.c_void_p)
# typedef void (*flexdiag_image_fn)(flexdiag_handle *, int32_t index, const int32_t *tokens,
#                                   int32_t n, void *user)
IMAGE_FN = c.CFUNCTYPE(None, c.c_void_p, i32, c.POINTER(i32), i32, c.c_void_p)
# typedef void (*flexdiag_token_fn)(flexdiag_handle *, int32_t index, int32_t step, int32_t id,
#                                   void *user)
TOKEN_FN = c.CFUNCTYPE(None, c.c_void_p, i32, i32, i32, c.c_void_p)
# typedef void (*flexdiag_done_fn)(flexdiag_handle *, flexdiag_status, void *user)
DONE_FN = c.CFUNCTYPE(None, c.c_void_p, c.c_int, c.c_void_p)


class RuntimeParams(c.Structure):
    _fields_ = [("struct_size", u32), ("device", c.c_int), ("gpu_mem", u64),
                ("threads", c.c_int), ("cpu_mem", u64), ("disk_mem", u64),
                ("offload_dir", c.c_char_p), ("compress_disk", u32)]


class ModelParams(c.Structure):
    _fields_ = [("struct_size", u32), ("arch", c.c_char_p), ("random_weights", c.c_bool),
                ("seed", u64), ("weights_pct", u32 * 3), ("compress_weights", u32)]


class PolicyParams(c.Structure):
    _fields_ = [("struct_size", u32), ("kind", c.c_int), ("n_att", i32), ("n_r", i32),
                ("sparsity", f64)]


class ContextParams(c.Structure):
    _fields_ = [("struct_size", u32), ("max_images", i32), ("micro_batch", i32),
                ("max_prompt_len", i32), ("policy", PolicyParams), ("max_new_tokens", i32),
                ("progress", PROGRESS_FN), ("progress_user", c.c_void_p), ("text", c.c_bool),
                ("kv_pct", u32 * 3), ("cpu_attention", c.c_bool), ("images_per_prompt", i32),
                ("cpu_attention_pct", u32), ("queue_images", i32), ("batching", i32),
                ("draft_len", i32), ("sjd_group", i32), ("policy_calib", c.c_char_p),
                ("ssd_tau", f64)]


class Request(c.Structure):
    _fields_ = [("struct_size", u32), ("n_prompts", i32), ("prompts", c.POINTER(c.c_char_p)),
                ("prompt_ids", c.POINTER(c.POINTER(i32))), ("prompt_lens", c.POINTER(i32)),
                ("images_per_prompt", i32), ("cfg_weight", c.c_float),
                ("temperature", c.c_float), ("top_k", i32), ("top_p", c.c_float),
                ("seed", u64), ("first_image", i64), ("draft_len", i32),
                ("sjd_group", i32)]


class Output(c.Structure):
    _fields_ = [("n_images", i32), ("tokens_per_image", i32), ("tokens", c.POINTER(i32))]


class Stats(c.Structure):
    _fields_ = [("prefill_s", f64), ("decode_s", f64), ("tokens_generated", u64),
                ("kv_bytes_per_seq", u64), ("evictions", u64), ("peak_device_bytes", u64)]


class OffloadInfo(c.Structure):
    _fields_ = [("struct_size", u32), ("scheduler", c.c_char_p), ("weights_pct", u32 * 3),
                ("weights_bytes", u64 * 3), ("pinned_budget", u64), ("pinned_used", u64),
                ("pinned", i32), ("pinned_note", c.c_char_p), ("disk_budget", u64),
                ("disk_used", u64), ("disk_io", c.c_char_p), ("disk_note", c.c_char_p),
                ("loads", u64), ("h2d_bytes", u64), ("disk_read_bytes", u64),
                ("disk_wait_s", f64), ("kv_pct", u32 * 3), ("kv_bytes", u64 * 3),
                ("kv_h2d_bytes", u64), ("kv_d2h_bytes", u64), ("cpu_attention", c.c_bool),
                ("cpu_attn_d2h_bytes", u64), ("cpu_attn_h2d_bytes", u64),
                ("cpu_attn_kv_bytes", u64), ("cpu_attn_s", f64), ("kv_disk_read_bytes", u64),
                ("kv_disk_write_bytes", u64), ("kv_disk_wait_s", f64), ("host_mb", i32),
                ("cpu_attn_mb", i32)]


class PolicyInfo(c.Structure):
    _fields_ = [("struct_size", u32), ("kind", c.c_int), ("n_att", i32), ("n_r", i32),
                ("l_dec", i32), ("sparsity", f64)]


class ScoreRequest(c.Structure):
    _fields_ = [("struct_size", u32), ("prompt_ids", c.POINTER(i32)), ("prompt_len", i32),
                ("ids", c.POINTER(i32)), ("n", i32), ("cfg_weight", c.c_float)]


class ScoreOutput(c.Structure):
    _fields_ = [("struct_size", u32), ("vocab", i32), ("rows", i32),
                ("logits", c.POINTER(c.c_float)), ("raw", c.POINTER(c.c_float))]


class SubmitParams(c.Structure):
    _fields_ = [("struct_size", u32), ("on_image", IMAGE_FN), ("on_token", TOKEN_FN),
                ("on_done", DONE_FN), ("user", c.c_void_p), ("wait_for_room", c.c_bool),
                ("max_new_tokens", i32), ("stop_at_eos", c.c_bool)]


class HandleStats(c.Structure):
    _fields_ = [("struct_size", u32), ("n_images", i32), ("done_images", i32),
                ("tokens", u64), ("queue_s", f64), ("first_token_s", f64),
                ("first_image_s", f64), ("total_s", f64), ("passes", u64),
                ("accepted", u64 * 63)]


# the library's function that fills each params struct's defaults (_lib.init)
INIT = {RuntimeParams: "flexdiag_runtime_params_init", ModelParams: "flexdiag_model_params_init",
        ContextParams: "flexdiag_context_params_init", Request: "flexdiag_request_init",
        ScoreRequest: "flexdiag_score_request_init",
        SubmitParams: "flexdiag_submit_params_init"}


def as_dict(s):
    """A Structure's fields as a dict (strings decoded, arrays as lists, struct_size left out)."""
    out = {}
    for name, _ in s._fields_:
        v = getattr(s, name)
        if name == "struct_size":
            continue
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        elif isinstance(v, c.Array):
            v = list(v)
        out[name] = v
    return out


def fill(struct, params, what, reserved=()):
    """Set struct's fields named by params (str and paths -> bytes, sequences -> arrays);
    TypeError for a name the struct does not have."""
    fields = dict(struct._fields_)
    for name, value in params.items():
        if value is None:
            continue
        if name not in fields or name in reserved or name == "struct_size":
            valid = ", ".join(f for f in fields if f not in reserved and f != "struct_size")
            raise TypeError(f"{what}: unknown parameter {name!r} (valid: {valid})")
        if isinstance(value, (str, os.PathLike)):
            value = os.fsencode(value)
        elif issubclass(fields[name], c.Array):
            value = fields[name](*value)
        setattr(struct, name, value)
    return struct
