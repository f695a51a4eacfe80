#!/usr/bin/env python3
"""Write the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/).

Run once from anywhere: `python3 tests/fuzz/gen_corpus.py [TARGET ...]` (default: every target);
the output is committed and replayed by the 'format' suite. Files are only written, never
removed, so regression inputs (regress_*) and merged fuzzer finds committed next to the seeds
stay. Standard library only. Per target:
  safetensors  small valid files (every dtype family, metadata, rank 0, empty tensors, an empty
               header), valid and invalid index JSON (the fuzz harness provides the shard
               s1.safetensors holding "a" F32 [2] and "b" BF16 [3]), and one corrupt file per
               class of docs/architecture.md §10.1;
  config       the golden model configs (tests/golden/data/*/config.json; janus with its
               generation_config.json after a NUL byte, as the harness splits inputs), the janus
               one in the original multi_modality layout, and variants next to the checks of
               runtime/model/config.c;
  tokenizer    tests/tokenizer/data/mini.json, the golden tokenizer.json cut to its first merges,
               and small variants reaching each option and refusal of tokenizer_load.c;
  npy          valid arrays of each dtype the reader takes (rank 0..3, empty, format 1.0/2.0/3.0),
               two golden .npy files, and one malformed file per rejection of cli/npy.c;
  score_input  tests/golden/data/janus/score_input.json and variants next to the checks of
               cli/score_input.c;
  prompts      plain, GenEval and DPG prompt sets (lines and the harness's folder form: parts
               "<id>\n<prompt>" separated by 0x1e) with the malformed lines prompts.c refuses;
  serve_request  a route byte and a `flexdiag serve` body: valid image, text and chat requests
               (each chat template, streamed or not), /metrics, and one per refusal of
               cli/serve_api.c (bad JSON, unknown field, type, range, route, chat messages).
  planes_zstd  the target's 7-byte prefix (element size, position, expected raw size) and a
               chunk of offload/planes_zstd.c: planes kept as they are, planes of one repeated
               byte as zstd RLE frames, and one chunk per refusal (magic, version, element and
               raw size, plane lengths, checksum, truncation).
  calib        calibration tables (policy/kvp_calib.h, version 1) of two shapes, and one per
               refusal of policy/kvp_calib.c (magic, version, header, shape, steps, reserved
               bytes, profiles, variances, checksum, size).
So mutations start next to every validation branch. """
import functools
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
SIZES = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "I64": 8, "F64": 8, "U8": 1}


def header_bytes(obj):
    """u64 length + compact JSON padded with spaces to a multiple of 8, as the writer does."""
    text = json.dumps(obj, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def safetensors(tensors, metadata=None):
    """tensors: list of (name, dtype, shape); data is a byte ramp of the right length."""
    obj, data = {}, b""
    if metadata is not None:
        obj["__metadata__"] = metadata
    for name, dtype, shape in tensors:
        n = SIZES[dtype]
        for d in shape:
            n *= d
        obj[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + n]}
        data += bytes((len(data) + i) % 251 for i in range(n))
    return header_bytes(obj) + data


def raw_header(text, data_len):
    """A header written verbatim (may be invalid), then data_len zero bytes."""
    return struct.pack("<Q", len(text)) + text + b"\0" * data_len


def safetensors_seeds():
    two = safetensors([("a", "BF16", [2, 3]), ("b", "F32", [2])], {"format": "pt"})
    entry = b'"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'
    return {
        "valid_two.safetensors": two,
        "valid_dtypes.safetensors": safetensors([
            ("h", "F16", [3]), ("i", "I32", [1]), ("l", "I64", [1]), ("d", "F64", [1]),
            ("u", "U8", [3]), ("s", "BF16", []), ("e", "F32", [0, 4])]),
        "valid_empty_header.safetensors": header_bytes({}),
        "index_valid.json": json.dumps(
            {"metadata": {"total_size": 14},
             "weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}}).encode(),
        "index_self_and_shard.json": json.dumps(
            {"weight_map": {"a": "s1.safetensors", "x": "t.safetensors"}}).encode(),
        "index_dotdot.json": json.dumps({"weight_map": {"a": "../s1.safetensors"}}).encode(),
        "bad_giant_header.safetensors": struct.pack("<Q", 4000000000) + b"{}      ",
        "bad_truncated_mid_tensor.safetensors": two[:-5],
        "bad_dup_keys.safetensors": raw_header(b"{" + entry + b"," + entry + b"}", 8),
        "bad_utf8.safetensors": raw_header(b'{"\xff":{"dtype":"U8","shape":[1],'
                                           b'"data_offsets":[0,1]}}', 1),
        "bad_overlap.safetensors": raw_header(
            b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
            b'"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', 12),
        "bad_hole.safetensors": raw_header(
            b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
            b'"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}', 12),
        "bad_size_mismatch.safetensors": raw_header(
            b'{"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,10]}}', 10),
        "bad_shape_overflow.safetensors": raw_header(
            b'{"a":{"dtype":"U8","shape":[1099511627776,1099511627776],'
            b'"data_offsets":[0,1]}}', 1),
    }


def read_test_file(rel):
    with open(os.path.join(TESTS, rel), "rb") as f:
        return f.read()


def compact(obj):
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


# ---- config: config.json [+ NUL + generation_config.json] ----

def multi_modality(hf):
    """The transformers janus config in the original deepseek-ai layout (as tests/golden/golden_janus.c)."""
    text, vq = hf["text_config"], hf["vq_config"]
    nv, emb, pd = vq["num_embeddings"], vq["embed_dim"], vq["projection_dim"]
    return {"model_type": "multi_modality", "language_config": text,
            "gen_vision_config": {"params": {"image_token_size": nv, "n_embed": emb}},
            "gen_aligner_config": {"params": {"input_dim": emb, "n_embed": pd, "depth": 2}},
            "gen_head_config": {"params": {"n_embed": pd, "image_token_embed": text["hidden_size"],
                                           "image_token_size": nv}}}


def config_seeds():
    janus_raw = read_test_file("golden/data/janus/config.json")
    gen_raw = read_test_file("golden/data/janus/generation_config.json")
    llama_raw = read_test_file("golden/data/llama/config.json")
    hf, llama = json.loads(janus_raw), json.loads(llama_raw)
    orig = multi_modality(hf)

    def janus(edit):
        c = json.loads(janus_raw)
        edit(c)
        return compact(c)

    def lm(**kv):
        return compact({"model_type": "llama", **{k: v for k, v in llama.items()
                                                  if k != "model_type"}, **kv})
    return {
        "valid_janus_hf_gen.json": janus_raw + b"\0" + gen_raw,
        "valid_janus_hf.json": janus_raw,
        "valid_llama.json": llama_raw,
        "valid_multi_modality_gen.json": compact(orig) + b"\0" + gen_raw,
        "valid_llama_defaults.json": b'{"model_type":"llama"}',
        "valid_multi_modality_empty.json": b'{"model_type":"multi_modality","language_config":'
                                           b'{"hidden_size":64,"num_attention_heads":4}}',
        "valid_janus_theta_top.json": janus(lambda c: (c["text_config"].pop("rope_parameters"),
                                                       c["text_config"].update(rope_theta=5e5))),
        "bad_json.json": janus_raw[:200],
        "bad_not_object.json": b"[1, 2]",
        "bad_model_type.json": b'{"model_type":"mistral"}',
        "bad_rope_scaling.json": lm(rope_scaling={"type": "linear", "factor": 2.0}),
        "bad_rope_type.json": lm(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4}),
        "bad_act.json": lm(hidden_act="gelu"),
        "bad_bias.json": lm(attention_bias=True),
        "bad_gqa.json": lm(num_key_value_heads=3),
        "bad_head_dim_odd.json": lm(head_dim=15),
        "bad_head_dim_big.json": lm(head_dim=512),
        "bad_int_type.json": lm(num_hidden_layers=2.5),
        "bad_int_range.json": lm(vocab_size=2**31),
        "bad_minus_one.json": lm(hidden_size=-1),
        "bad_eps_zero.json": lm(rms_norm_eps=0),
        "bad_eps_string.json": lm(rms_norm_eps="1e-6"),
        "bad_vq_act.json": janus(lambda c: c["vq_config"].update(hidden_act="relu")),
        "bad_vq_embed_dim.json": janus(lambda c: c["vq_config"].update(image_token_embed_dim=32)),
        "bad_patch_zero.json": janus(lambda c: (c["vision_config"].update(patch_size=0),
                                                c["vq_config"].pop("num_patches"))),
        "bad_depth.json": compact({**orig, "gen_aligner_config": {"params": {
            "input_dim": 8, "n_embed": 64, "depth": 5}}}),
        "bad_aligner_width.json": compact({**orig, "gen_aligner_config": {"params": {
            "input_dim": 8, "n_embed": 32, "depth": 2}}}),
        "bad_head_sizes.json": compact({**orig, "gen_head_config": {"params": {
            "n_embed": 64, "image_token_embed": 32, "image_token_size": 256}}}),
        "bad_gen_bos.json": janus_raw + b'\0{"bos_token_id":"1"}',
        "bad_gen_boi.json": janus_raw + b'\0{"generation_kwargs":{"boi_token_id":-2}}',
        "valid_gen_malformed_ignored.json": janus_raw + b"\0{",
    }


# ---- tokenizer: tokenizer.json ----

JANUS_SPECIALS = ["<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5c\u2581pad\u2581\uff5c>",
                  "<|User|>", "<|Assistant|>", "<begin_of_image>"]


def added(content, i, **opts):
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True, **opts}


def tiny_tokenizer(**top):
    """A byte-level BPE over a few letters (a..h, space), the Janus specials as added tokens."""
    symbols = ["\u0120"] + [chr(c) for c in range(ord("a"), ord("i"))]
    vocab = {s: i for i, s in enumerate(symbols)}
    merges = [["a", "b"], ["\u0120", "a"], ["ab", "c"], ["\u0120a", "b"]]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
             "ignore_merges": False, "vocab": vocab, "merges": merges}
    doc = {"version": "1.0", "truncation": None, "padding": None,
           "added_tokens": [added(s, len(vocab) + i) for i, s in enumerate(JANUS_SPECIALS)],
           "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                             "use_regex": True},
           "post_processor": None,
           "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                       "use_regex": True},
           "model": model}
    for key, value in top.items():
        if key.startswith("model_"):
            model[key[6:]] = value
        else:
            doc[key] = value
    return compact(doc)


def split(pattern, behavior="Isolated", invert=False):
    return {"type": "Split", "pattern": pattern, "behavior": behavior, "invert": invert}


def sequence(*steps):
    return {"type": "Sequence", "pretokenizers": list(steps)}


def golden_cut(doc, n_merges):
    """The golden tokenizer with its byte symbols and first n_merges merges, ids kept dense."""
    model = doc["model"]
    merges = [m if isinstance(m, list) else m.split(" ") for m in model["merges"][:n_merges]]
    keep = {s for s, i in model["vocab"].items() if i < 256}
    keep |= {a + b for a, b in merges} | {p for m in merges for p in m}
    ids = sorted(keep, key=lambda s: model["vocab"][s])
    model["vocab"] = {s: i for i, s in enumerate(ids)}
    model["merges"] = merges
    doc["added_tokens"] = [dict(a, id=len(ids) + i) for i, a in enumerate(doc["added_tokens"])]
    return compact(doc)


def tokenizer_seeds():
    letters = {c: i for i, c in enumerate("abcdefgh")}
    fallback = dict(letters, **{"<unk>": 8}, **{f"<0x{b:02X}>": 9 + b for b in range(256)})
    return {
        "valid_mini.json": read_test_file("tokenizer/data/mini.json"),
        "valid_golden_cut.json": golden_cut(
            json.loads(read_test_file("golden/data/janus/tokenizer.json")), 120),
        "valid_tiny.json": tiny_tokenizer(),
        "valid_tiny_string_merges.json": tiny_tokenizer(model_merges=["a b", "\u0120 a", "ab c"]),
        "valid_tiny_prefix_no_regex.json": tiny_tokenizer(pre_tokenizer={
            "type": "ByteLevel", "add_prefix_space": True, "use_regex": False}),
        "valid_tiny_split_literal.json": tiny_tokenizer(pre_tokenizer=sequence(
            split({"String": "b"}, "MergedWithPrevious"), split({"String": "c"}, "MergedWithNext"),
            {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False})),
        "valid_tiny_split_regex.json": tiny_tokenizer(pre_tokenizer=sequence(
            split({"Regex": "\\s+|[[:punct:]]"}, "Removed"),
            split({"Regex": "\\w+"}, "Contiguous", True),
            split({"Regex": "[\\S]"}, "Isolated"), {"type": "ByteLevel", "use_regex": True})),
        "valid_tiny_added_strip.json": tiny_tokenizer(added_tokens=[
            added("<mask>", 20, lstrip=True, rstrip=True), added("ab", 0, normalized=True),
            added("<mask>", 20, rstrip=False), added("\u00f8", 21)]),
        "valid_tiny_no_bytelevel.json": tiny_tokenizer(
            pre_tokenizer=None, decoder=None, normalizer={"type": "Sequence", "normalizers": []}),
        "valid_fallback_unk.json": tiny_tokenizer(
            pre_tokenizer=None, decoder=None, added_tokens=[], model_vocab=fallback,
            model_merges=[], model_unk_token="<unk>", model_byte_fallback=True,
            model_fuse_unk=True),
        "valid_unk_ignore_merges.json": tiny_tokenizer(
            pre_tokenizer=None, decoder=None, added_tokens=[],
            model_vocab=dict(letters, **{"<unk>": 8, "ab": 9}), model_merges=["a b"],
            model_unk_token="<unk>", model_ignore_merges=True),
        "bad_json.json": tiny_tokenizer()[:150],
        "bad_merge_missing.json": tiny_tokenizer(model_merges=[["a", "z"]]),
        "bad_merge_form.json": tiny_tokenizer(model_merges=["a b c"]),
        "bad_vocab_id.json": tiny_tokenizer(model_vocab={"a": -1}),
        "bad_unk.json": tiny_tokenizer(model_unk_token="<unk>"),
        "bad_dropout.json": tiny_tokenizer(model_dropout=0.1),
        "bad_suffix.json": tiny_tokenizer(model_end_of_word_suffix="</w>"),
        "bad_normalizer.json": tiny_tokenizer(normalizer={"type": "NFC"}),
        "bad_single_word.json": tiny_tokenizer(added_tokens=[added("<x>", 9, single_word=True)]),
        "bad_added_nul.json": tiny_tokenizer(added_tokens=[added("a\u0000b", 9)]),
        "bad_regex.json": tiny_tokenizer(pre_tokenizer=split({"Regex": "(a"})),
        "bad_regex_h.json": tiny_tokenizer(pre_tokenizer=split({"Regex": "\\h+"})),
        "bad_behavior.json": tiny_tokenizer(pre_tokenizer=split({"String": "a"}, "Merged")),
        "bad_pretok.json": tiny_tokenizer(pre_tokenizer={"type": "Whitespace"}),
        "bad_nested.json": tiny_tokenizer(pre_tokenizer=functools.reduce(
            lambda inner, _: sequence(inner), range(10), split({"String": "a"}))),
    }


# ---- npy ----

NPY_DTYPES = {"<f4": ("<f", 4), "<i4": ("<i", 4), "<i8": ("<q", 8)}


def npy(descr, shape, version=1, fortran=False, data=None, pad_to=64, dict_text=None):
    """An .npy file as numpy writes it (header padded to pad_to); data defaults to a ramp."""
    dims = ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "")
    text = dict_text or (f"{{'descr': '{descr}', 'fortran_order': {fortran}, "
                         f"'shape': ({dims}), }}").encode()
    pre = 10 if version == 1 else 12
    text += b" " * (-(pre + len(text) + 1) % pad_to) + b"\n"
    length = struct.pack("<H" if version == 1 else "<I", len(text))
    if data is None:
        fmt, _ = NPY_DTYPES.get(descr, ("<f", 4))
        n = 1
        for d in shape:
            n *= d
        data = struct.pack(f"{fmt[0]}{n}{fmt[1]}", *[(i * 7) % 13 - 6 for i in range(n)])
    return b"\x93NUMPY" + bytes([version, 0]) + length + text + data


def npy_seeds():
    good = npy("<f4", [2, 3])
    return {
        "valid_f4_2x3.npy": good,
        "valid_i4_4.npy": npy("<i4", [4]),
        "valid_i8_scalar.npy": npy("<i8", []),
        "valid_f4_empty.npy": npy("<f4", [0]),
        "valid_i8_2x0x3.npy": npy("<i8", [2, 0, 3]),
        "valid_i4_v2.npy": npy("<i4", [2, 2], version=2),
        "valid_f4_v3_unpadded.npy": npy("<f4", [1, 1, 1], version=3, pad_to=1),
        "valid_golden_greedy_ids.npy": read_test_file("golden/data/janus/greedy_ids.npy"),
        "valid_golden_vq_tokens.npy": read_test_file("golden/data/janus/vq_tokens.npy"),
        "valid_key_order.npy": npy("<i4", [1], dict_text=b"{\"shape\":(1,),\"fortran_order\":"
                                                         b"False,\"descr\":\"<i4\"}"),
        "bad_magic.npy": b"\x93NUMPX" + good[6:],
        "bad_version.npy": good[:6] + b"\x04" + good[7:],
        "bad_short.npy": good[:9],
        "bad_header_len.npy": good[:8] + struct.pack("<H", 0xffff) + good[10:],
        "bad_fortran.npy": npy("<f4", [2, 3], fortran=True),
        "bad_big_endian.npy": npy(">f4", [2], data=b"\0" * 8),
        "bad_f8.npy": npy("<f8", [1], data=b"\0" * 8),
        "bad_rank9.npy": npy("<i4", [1] * 9),
        "bad_truncated.npy": good[:-1],
        "bad_trailing.npy": good + b"\0",
        "bad_dup_key.npy": npy("<i4", [1], dict_text=b"{'descr': '<i4', 'descr': '<i4', "
                                                      b"'fortran_order': False, 'shape': (1,)}"),
        "bad_extra_key.npy": npy("<i4", [1], dict_text=b"{'descr': '<i4', 'fortran_order': "
                                                        b"False, 'shape': (1,), 'x': 1}"),
        "bad_missing_shape.npy": npy("<i4", [1], dict_text=b"{'descr': '<i4', "
                                                            b"'fortran_order': False}"),
        "bad_shape_overflow.npy": npy("<i8", [2**62, 4], data=b""),
        "bad_negative_dim.npy": npy("<i4", [1], dict_text=b"{'descr': '<i4', "
                                                           b"'fortran_order': False, "
                                                           b"'shape': (-1,)}", data=b""),
        "bad_escape.npy": npy("<i4", [1], dict_text=b"{'descr': '<\\i4', "
                                                     b"'fortran_order': False, 'shape': (1,)}"),
        "bad_after_dict.npy": npy("<i4", [1], dict_text=b"{'descr': '<i4', "
                                                         b"'fortran_order': False, "
                                                         b"'shape': (1,)} x"),
    }


# ---- score_input: the JSON input of `flexdiag score` ----

def score_input_seeds():
    golden_raw = read_test_file("golden/data/janus/score_input.json")
    golden = json.loads(golden_raw)

    def edit(**kv):
        return compact({**golden, **kv})
    return {
        "valid_golden.json": golden_raw,
        "valid_no_cfg.json": compact({k: v for k, v in golden.items() if k != "cfg_weight"}),
        "valid_cfg_int.json": edit(cfg_weight=1),
        "valid_cfg_negative.json": edit(cfg_weight=-2.5e3),
        "valid_one_each.json": b'{"image_ids":[0],"prompt_ids":[2147483647]}',
        "bad_json.json": golden_raw[:60],
        "bad_not_object.json": b"[[1],[2]]",
        "bad_missing_prompt.json": b'{"image_ids":[1]}',
        "bad_empty_ids.json": edit(image_ids=[]),
        "bad_negative_id.json": edit(prompt_ids=[1, -1]),
        "bad_float_id.json": edit(image_ids=[1.0]),
        "bad_big_id.json": edit(image_ids=[2**31]),
        "bad_string_id.json": edit(prompt_ids=["1"]),
        "bad_cfg_string.json": edit(cfg_weight="5"),
        "bad_cfg_null.json": edit(cfg_weight=None),
        "bad_dup_key.json": b'{"prompt_ids":[1],"prompt_ids":[2],"image_ids":[3]}',
        "bad_ids_object.json": edit(image_ids={"0": 1}),
    }


# ---- prompts: --prompt / --prompts (plain, GenEval, DPG lines, DPG folder form) ----

def geneval_line(prompt, tag="single_object", **extra):
    return json.dumps({"tag": tag, "include": [{"class": "bench", "count": 1}],
                       "prompt": prompt, **extra}).encode()


def prompts_seeds():
    return {
        "valid_plain.txt": b"a photo of a bench\n\n  a red apple  \r\n"
                           b"un caf\xc3\xa9 \xe2\x98\x95\n",
        "valid_geneval.jsonl": b"\n".join([
            geneval_line("a photo of a bench"),
            geneval_line("a photo of two cats", "counting", exclude=[{"class": "cat",
                                                                       "count": 3}]),
            geneval_line("caf\u00e9 \"quoted\"\tand\\n escaped")]) + b"\n",
        "valid_dpg_lines.txt": b"0001\tA cozy cabin in the snow.\n"
                               b"  0002 \t  Two dogs playing chess.  \r\n\n"
                               b"x.y\tun caf\xc3\xa9\n",
        "valid_dpg_folder.txt": b"0001\nA cozy cabin in the snow.\n\x1e"
                                b"0002\n  Two dogs playing chess.\n\x1e"
                                b"a-b\nthird prompt",
        "bad_plain_utf8.txt": b"fine\nnot \xff valid\n",
        "bad_plain_surrogate.txt": b"\xed\xa0\x80\n",
        "bad_plain_empty.txt": b"",
        "bad_plain_blank.txt": b" \n\t\r\n\n",
        "bad_plain_nul.txt": b"one\0two\n\0\n",
        "bad_geneval_json.jsonl": geneval_line("ok") + b"\n{\"prompt\": \n",
        "bad_geneval_no_prompt.jsonl": b'{"tag": "colors"}\n["prompt"]\n{"prompt": "  "}\n',
        "bad_dpg_no_tab.txt": b"0001 A cabin\n",
        "bad_dpg_id_slash.txt": b"../x\tprompt\n",
        "bad_dpg_id_dots.txt": b"..\tprompt\n.\tprompt\n",
        "bad_dpg_dup_id.txt": b"7\tone\n7\ttwo\n",
        "bad_dpg_empty_prompt.txt": b"7\t   \n",
        "bad_dpg_folder_dup.txt": b"7\none\x1e7\ntwo\x1e.hidden\nthree\x1e8\n",
    }


# ---- serve_request: a route byte, then a `flexdiag serve` request body ----

IMAGES, COMPLETIONS, MODELS, NOWHERE, CHAT, METRICS = range(6)   # the route bits' values
NO_TEMPLATE, OTHER_TEMPLATE, CHATML, ZEPHYR, LLAMA2, LLAMA3 = range(6)  # the template bits'


def serve_request_seeds():
    def req(image, route, body, get=False, template=NO_TEMPLATE):
        head = bytes([(1 if image else 0) | route << 1 | (16 if get else 0) | template << 5])
        return head + (body if isinstance(body, bytes) else compact(body))
    chat = [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "\u00e9t\u00e9"}]
    return {
        "valid_image.json": req(1, IMAGES, {"prompt": "a red apple", "n": 2, "seed": 7,
                                            "cfg": 3.5, "temperature": 0.9, "top_k": 50,
                                            "top_p": 0.9, "size": "32x32", "model": "micro-janus",
                                            "response_format": "b64_json", "tokens": True}),
        "valid_image_stream.json": req(1, IMAGES, {"prompt": "x", "n": 3, "stream": True}),
        "valid_text_ids.json": req(0, COMPLETIONS, {"prompt": [1, 5, 9], "max_tokens": 16,
                                                    "n": 3, "top_k": 1, "seed": 0,
                                                    "temperature": 0.5, "top_p": 1,
                                                    "model": "micro-opt", "stream": False}),
        "valid_text_string.json": req(0, COMPLETIONS, {"prompt": "hello", "stream": True}),
        "valid_models.json": req(1, MODELS, b"", get=True),
        "valid_metrics.json": req(1, METRICS, b"", get=True),
        "valid_chat_chatml.json": req(0, CHAT, {"messages": chat, "model": "micro-opt",
                                                "max_tokens": 8, "n": 2, "seed": 3,
                                                "temperature": 0.7, "top_p": 0.9, "top_k": 5,
                                                "stream": True}, template=CHATML),
        "valid_chat_zephyr.json": req(0, CHAT, {"messages": chat,
                                                "max_completion_tokens": 4}, template=ZEPHYR),
        "valid_chat_llama2.json": req(0, CHAT, {"messages": chat}, template=LLAMA2),
        "valid_chat_llama3.json": req(0, CHAT, {"messages": chat[1:]}, template=LLAMA3),
        "bad_json.json": req(1, IMAGES, b"{not json"),
        "bad_array.json": req(1, IMAGES, b"[1, 2]"),
        "bad_unknown_field.json": req(1, IMAGES, {"prompt": "x", "colour": "red"}),
        "bad_duplicate.json": req(1, IMAGES, b'{"prompt": "x", "prompt": "y"}'),
        "bad_n_type.json": req(1, IMAGES, {"prompt": "x", "n": "2"}),
        "bad_n_range.json": req(1, IMAGES, {"prompt": "x", "n": 17}),
        "bad_temperature.json": req(1, IMAGES, {"prompt": "x", "temperature": 0}),
        "bad_size.json": req(1, IMAGES, {"prompt": "x", "size": "1024x1024"}),
        "bad_stream.json": req(1, IMAGES, {"prompt": "x", "stream": 1}),
        "bad_no_prompt.json": req(1, IMAGES, {}),
        "bad_ids.json": req(0, COMPLETIONS, {"prompt": [1, -5]}),
        "bad_max_tokens.json": req(0, COMPLETIONS, {"prompt": [1], "max_tokens": 17}),
        "bad_route_model.json": req(0, IMAGES, {"prompt": "x"}),
        "bad_method.json": req(1, IMAGES, b"", get=True),
        "bad_metrics_method.json": req(1, METRICS, b""),
        "bad_path.json": req(1, NOWHERE, {"prompt": "x"}),
        "bad_chat_no_template.json": req(0, CHAT, {"messages": chat}),
        "bad_chat_other_template.json": req(0, CHAT, {"messages": chat},
                                            template=OTHER_TEMPLATE),
        "bad_chat_no_messages.json": req(0, CHAT, {"max_tokens": 4}, template=CHATML),
        "bad_chat_empty.json": req(0, CHAT, {"messages": []}, template=CHATML),
        "bad_chat_role.json": req(0, CHAT, {"messages": [{"role": "tool", "content": "x"}]},
                                  template=CHATML),
        "bad_chat_parts.json": req(0, CHAT, {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "x"}]}]}, template=CHATML),
        "bad_chat_name.json": req(0, CHAT, {"messages": [{"role": "user", "content": "x",
                                                          "name": "me"}]}, template=CHATML),
        "bad_chat_alternate.json": req(0, CHAT, {"messages": [chat[1], chat[1]]},
                                       template=LLAMA2),
        "bad_chat_renders_nothing.json": req(0, CHAT, {"messages": chat[:1]}, template=LLAMA2),
        "bad_chat_both_max.json": req(0, CHAT, {"messages": chat, "max_tokens": 2,
                                                "max_completion_tokens": 2}, template=CHATML),
        "bad_chat_image_model.json": req(1, CHAT, {"messages": chat}, template=CHATML),
        # a 400 message cut inside a UTF-8 character must stay UTF-8 (JSON)
        "bad_long_utf8_key.json": req(1, IMAGES, ('{"' + "\u00e9" * 600 + '": 1}').encode()),
        # so must jansson's excerpt of a bad escape before a two-byte character (was a 500)
        "bad_json_escape_utf8.json": req(0, COMPLETIONS, '{"prompt": "\\\u00e9l"}'.encode()),
    }


M64 = (1 << 64) - 1
XP = [0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63,
      0x27D4EB2F165667C5]


def xxh64(data, seed=0):
    """XXH64, the reference algorithm (offload/planes_zstd.c flexdiag__xxh64)."""
    def rotl(x, r):
        return ((x << r) | (x >> (64 - r))) & M64

    def rnd(acc, v):
        return rotl((acc + v * XP[1]) & M64, 31) * XP[0] & M64

    p, n = 0, len(data)
    if n >= 32:
        v = [(seed + XP[0] + XP[1]) & M64, (seed + XP[1]) & M64, seed, (seed - XP[0]) & M64]
        while n - p >= 32:
            for i in range(4):
                v[i] = rnd(v[i], struct.unpack_from("<Q", data, p + 8 * i)[0])
            p += 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M64
        for x in v:
            h = ((h ^ rnd(0, x)) * XP[0] + XP[3]) & M64
    else:
        h = (seed + XP[4]) & M64
    h = (h + n) & M64
    while n - p >= 8:
        h = (rotl(h ^ rnd(0, struct.unpack_from("<Q", data, p)[0]), 27) * XP[0] + XP[3]) & M64
        p += 8
    if n - p >= 4:
        h = (rotl(h ^ (struct.unpack_from("<I", data, p)[0] * XP[0] & M64), 23) * XP[1] + XP[2]) & M64
        p += 4
    while p < n:
        h = rotl(h ^ (data[p] * XP[4] & M64), 11) * XP[0] & M64
        p += 1
    h ^= h >> 33
    h = h * XP[1] & M64
    h ^= h >> 29
    h = h * XP[2] & M64
    return h ^ (h >> 32)


def zstd_rle(byte, m):
    """A zstd frame of m copies of byte: single segment, content size, one RLE block."""
    if m < 256:
        head = bytes([0x20, m])
    else:
        head = bytes([0x60]) + struct.pack("<H", m - 256)
    block = 1 | 1 << 1 | m << 3
    return struct.pack("<I", 0xFD2FB528) + head + struct.pack("<I", block)[:3] + bytes([byte])


def pz_chunk(raw, elem, planes=None):
    """A chunk of raw bytes (elem-byte elements): each plane kept as it is, or the given zstd
    frame for it (planes: {b: frame})."""
    m = len(raw) // elem
    stored, lens, payload = 0, [0] * 8, b""
    for b in range(elem):
        frame = (planes or {}).get(b)
        if frame is None:
            frame = bytes(raw[i * elem + b] for i in range(m))
            stored |= 1 << b
        lens[b] = len(frame)
        payload += frame
    head = struct.pack("<IHBBII8IQQ", 0x315A4446, 1, elem, stored, len(raw), len(payload),
                       *lens, 0, 0)
    total = xxh64(head, xxh64(payload))
    return head[:48] + struct.pack("<Q", total) + head[56:] + payload


def planes_zstd_seeds():
    def case(elem, raw, chunk, p=5):
        return bytes([elem - 1]) + struct.pack("<HI", p, raw) + chunk

    ramp = bytes((i * 37) % 251 for i in range(512))
    bf16 = bytes([0x3C if i % 2 else (i * 13) % 256 for i in range(1024)])  # a constant high byte
    stored2 = pz_chunk(ramp, 2)
    rle = pz_chunk(bf16, 2, {1: zstd_rle(0x3C, 512)})
    seeds = {
        "valid_stored_e1.bin": case(1, 512, pz_chunk(ramp, 1)),
        "valid_stored_e2.bin": case(2, 512, stored2),
        "valid_stored_e4.bin": case(4, 512, pz_chunk(ramp, 4)),
        "valid_stored_e8.bin": case(8, 512, pz_chunk(ramp, 8)),
        "valid_rle_high_plane.bin": case(2, 1024, rle),
        "valid_rle_all_planes.bin": case(2, 400, pz_chunk(bytes(400), 2, {0: zstd_rle(0, 200),
                                                                          1: zstd_rle(0, 200)})),
        "bad_magic.bin": case(2, 512, b"PK\3\4" + stored2[4:]),
        "bad_version.bin": case(2, 512, stored2[:4] + b"\2\0" + stored2[6:]),
        "bad_elem.bin": case(4, 512, stored2),
        "bad_raw.bin": case(2, 510, stored2),
        "bad_plane_length.bin": case(2, 512, stored2[:16] + struct.pack("<I", 255) + stored2[20:]),
        "bad_checksum.bin": case(2, 512, stored2[:48] + bytes(8) + stored2[56:]),
        "bad_payload_flip.bin": case(2, 1024, rle[:-1] + bytes([rle[-1] ^ 1])),
        "bad_truncated.bin": case(2, 1024, rle[:-3]),
        "bad_short.bin": case(2, 512, stored2[:30]),
        "data_only.bin": case(2, 0, bf16, p=0x2345),
    }
    return seeds


def fnv1a64(data, h=0xcbf29ce484222325):
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
    return h


def calib_table(layers=1, hq=2, hkv=1, l_dec=8, w_s=4, t0=None, t_end=None, backend=b"cpu",
                P=None, V=None, patch=None):
    """A calibration table file (policy/kvp_calib.h, version 1): header, P f32, V f64, FNV-1a
    64 checksum; patch = (offset, bytes) applied before the checksum."""
    t0 = l_dec // 2 if t0 is None else t0
    t_end = l_dec - 1 if t_end is None else t_end
    head = b"FDXCALIB" + struct.pack("<II", 1, 128)
    head += struct.pack("<QQQQ", 0x192B633ED0967595, 0x1234, 0, 2 * max(t_end - t0, 1))
    head += struct.pack("<8i", w_s, l_dec, layers, hq, hkv, t0, t_end, 1)
    head += backend.ljust(16, b"\0")[:16] + bytes(32)
    rows = layers * hq
    if P is None:  # row r: a skewed distribution, lag 0 heaviest
        P = []
        for r in range(rows):
            w = [1.0 / (1 + l + r) for l in range(l_dec)]
            P += [x / sum(w) for x in w]
    if V is None:
        V = [1e-3 * (1 + r) for r in range(rows)]
    body = head + struct.pack(f"<{len(P)}f", *P) + struct.pack(f"<{len(V)}d", *V)
    if patch:
        off, b = patch
        body = body[:off] + b + body[off + len(b):]
    return body + struct.pack("<Q", fnv1a64(body))


def calib_seeds():
    good = calib_table()
    return {
        "valid_small.calib": good,
        "valid_gqa.calib": calib_table(layers=2, hq=4, hkv=2, l_dec=12, w_s=3),
        "valid_backend_full.calib": calib_table(backend=b"cuda-abcdefghij"),
        "bad_magic.calib": calib_table(patch=(0, b"FDXCALIX")),
        "bad_version.calib": calib_table(patch=(8, struct.pack("<I", 2))),
        "bad_header_len.calib": calib_table(patch=(12, struct.pack("<I", 64))),
        "bad_heads.calib": calib_table(hq=3, hkv=2),
        "bad_layers.calib": calib_table(patch=(56, struct.pack("<i", 0))),
        "bad_l_dec.calib": calib_table(patch=(52, struct.pack("<i", 40000))),
        "bad_w_s.calib": calib_table(w_s=3),
        "bad_steps.calib": calib_table(t0=6, t_end=5),
        "bad_n_cal.calib": calib_table(patch=(76, struct.pack("<i", 0))),
        "bad_backend.calib": calib_table(backend=b"x" * 16),
        "bad_reserved.calib": calib_table(patch=(120, b"\1")),
        "bad_prob.calib": calib_table(patch=(128, struct.pack("<f", -0.5))),
        "bad_sum.calib": calib_table(patch=(132, struct.pack("<f", 0.9))),
        "bad_variance.calib": calib_table(V=[float("nan"), 1.0]),
        "bad_checksum.calib": good[:-1] + bytes([good[-1] ^ 1]),
        "bad_truncated.calib": good[:-9],
        "bad_short.calib": good[:100],
    }


TARGETS = {
    "safetensors": safetensors_seeds,
    "config": config_seeds,
    "tokenizer": tokenizer_seeds,
    "npy": npy_seeds,
    "score_input": score_input_seeds,
    "prompts": prompts_seeds,
    "serve_request": serve_request_seeds,
    "planes_zstd": planes_zstd_seeds,
    "calib": calib_seeds,
}


def main():
    names = sys.argv[1:] or list(TARGETS)
    for target in names:
        if target not in TARGETS:
            sys.exit(f"unknown target {target!r} (known: {', '.join(TARGETS)})")
        out = os.path.join(HERE, "corpus", target)
        os.makedirs(out, exist_ok=True)
        for name, data in sorted(TARGETS[target]().items()):
            with open(os.path.join(out, name), "wb") as f:
                f.write(data)
            print(f"{target}/{name}: {len(data)} bytes")


if __name__ == "__main__":
    main()
