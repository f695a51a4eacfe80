#!/usr/bin/env python3
"""
make_fixtures.py - golden fixtures for flexdiag, made by transformers from small random models.

Writes, under --out:
  golden/janus/  tiny random JanusForConditionalGeneration (Janus-Pro structure), bf16
                 safetensors + config + generation config + tokenizer, and float32 references:
                 generation-head logits (cond / uncond / CFG, teacher forcing), per-layer
                 hidden states, final-norm output, VQ decoder pixels, greedy CFG generation;
  golden/llama/  tiny random LlamaForCausalLM (GQA), bf16 safetensors + config, logits and
                 per-layer hidden states;
  golden/opt/    tiny random OPTForCausalLM with a GPT-2-style byte-level BPE tokenizer.json
                 (trained here), the same references, the logits of the same tokens left-padded
                 under an attention mask, transformers' greedy generate() of a text prompt
                 (ids, text, teacher-forced logits) and tokenizer encode/decode cases;
  golden/chameleon/ tiny random ChameleonForConditionalGeneration saved as Lumina-mGPT stores
                 it (QK-norm tables [1, head_dim], no VQ tensors), text-mode logits and hidden
                 states over the whole vocabulary, and image-mode CFG logits over the image
                 codes (conditional row and Lumina's unconditional row, teacher forcing);
  tokenizer/     byte-level BPE tokenizer.json (DeepSeek-LLM pre-tokenizer) + cases.json.
Every fixture folder has golden.json (magic "flexdiag-golden", version 1, library versions,
shapes and file names). Weights are stored in bf16 and the references are computed in float32
on the CPU from the same bf16-rounded values (reloaded from the saved file), eager attention,
so the runtime's bf16 weights are exactly the reference's weights.
Deterministic: fixed seeds, own weight initialisation (wider than transformers' default so that
logits are not flat), no threads-dependent reductions that matter at these sizes.
Usage: python3 make_fixtures.py --out DIR [--only janus|llama|opt|chameleon|tokenizer]
"""

import argparse
import json
import math
import os
import re
import sys

import numpy as np
import torch

import tokenizer_fixture as tokfx

GENERATOR = "tools/golden/make_fixtures.py"
SEED = 20250101
N_POS_HIDDEN = 4      # positions of the per-layer hidden-state references
CFG_WEIGHT = 5.0      # docs/architecture.md §4.1 default
N_IMAGE_IDS = 12      # teacher-forced image tokens scored per row
GRID = 4              # Janus image grid (GRID x GRID tokens): vision image_size / patch_size
OPT_VOCAB = 320       # OPT tokenizer: 4 specials + 256 byte symbols + 60 merges
OPT_PAD, OPT_EOS = 1, 2  # OPT's <pad> and </s> (also its BOS)
# candidate prompts of the greedy case: the one whose continuation has the most distinct ids
# is kept (a random tiny model often repeats one token, which would test little)
OPT_PROMPTS = ["The lighthouse keeper wrote a letter", "Once upon a time, in a quiet village",
               "Water boils at one hundred degrees", "She opened the old wooden box and",
               "A list of colours: red, green, blue,", "My favourite breakfast is toast with",
               "The train to the mountains leaves at", "In 1969 the first people walked on"]
OPT_NEW_TOKENS = 12   # greedy generate() length
CHAM_VOCAB = 160      # Chameleon vocabulary (layout in chameleon_vocabulary_map)
CHAM_GRID = 8         # Chameleon image grid: CHAM_GRID x CHAM_GRID codes
CHAM_IMG0 = 4         # first image-code id (64 codes: ids 4..67)
CHAM_CFG = 4.0        # Lumina-mGPT's default CFG weight


def log(msg):
    """Progress line on stdout (the device run's log)."""
    print(msg, flush=True)


def versions():
    """Library versions recorded in every golden.json."""
    import tokenizers
    import transformers
    return {"transformers": transformers.__version__, "torch": torch.__version__,
            "tokenizers": tokenizers.__version__, "numpy": np.__version__}


# ---- common writers ----

class Fixture:
    """One fixture folder: collects arrays and writes golden.json at the end."""

    def __init__(self, path, vers):
        self.path = path
        self.arrays = {}
        self.doc = {"magic": "flexdiag-golden", "version": 1, "generator": GENERATOR,
                    "transformers": vers["transformers"], "torch": vers["torch"]}
        os.makedirs(path, exist_ok=True)

    def save(self, name, array, dtype):
        """Save a C-order little-endian .npy (float32 or int64) and record its shape."""
        a = np.ascontiguousarray(np.asarray(array, dtype=dtype))
        np.save(os.path.join(self.path, name + ".npy"), a, allow_pickle=False)
        self.arrays[name] = {"file": name + ".npy", "dtype": a.dtype.name, "shape": list(a.shape)}
        return a

    def write_json(self, name, obj):
        """Write a JSON file in the folder (UTF-8, stable key order)."""
        with open(os.path.join(self.path, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, indent=1)
            f.write("\n")

    def finish(self, **fields):
        """Write golden.json with the recorded arrays and extra fields."""
        self.doc.update(fields)
        self.doc["arrays"] = self.arrays
        self.write_json("golden.json", self.doc)


def list_tensors(path, out_txt):
    """Names, dtypes and shapes of every tensor in a safetensors file; also written to out_txt."""
    from safetensors import safe_open
    rows = []
    with safe_open(path, framework="pt") as f:
        for name in sorted(f.keys()):
            sl = f.get_slice(name)
            dtype = sl.get_dtype() if hasattr(sl, "get_dtype") else str(f.get_tensor(name).dtype)
            rows.append((name, dtype, list(sl.get_shape())))
    if out_txt:
        with open(out_txt, "w") as f:
            f.write("# %s: name dtype shape (from the saved file)\n" % os.path.basename(path))
            for name, dt, shape in rows:
                f.write("%s %s %s\n" % (name, dt, json.dumps(shape)))
    log("%s: %d tensors" % (path, len(rows)))
    for name, dt, shape in rows:
        log("  %s %s %s" % (name, dt, shape))
    return rows


def randomize(model, seed, gains):
    """Deterministic wide initialisation: norms 1 + N(0, 0.1²), biases N(0, 0.05²), embeddings
    N(0, 1), matrices and convs N(0, (gain/sqrt(fan_in))²); gains maps name substrings."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("bias"):
                value = 0.05 * noise
            elif p.ndim == 1:
                value = 1.0 + 0.1 * noise
            elif "embed" in name or "position_embedding" in name:
                value = noise
            else:
                gain = next((v for k, v in gains.items() if k in name), 1.0)
                value = noise * (gain / math.sqrt(p[0].numel()))
            p.copy_(value.to(p.dtype))


def save_bf16_and_reload(model, cls, path):
    """save_pretrained in bf16, reload in float32 (eager attention), check exact round trip."""
    ref = {k: v.detach().to(torch.bfloat16).float() for k, v in model.state_dict().items()}
    model.to(torch.bfloat16).save_pretrained(path)
    loaded = cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    loaded.eval()
    worst = 0.0
    for k, v in loaded.state_dict().items():
        if k in ref and ref[k].shape == v.shape:
            worst = max(worst, (ref[k] - v.float()).abs().max().item() if v.numel() else 0.0)
    log("%s: reloaded in %s, max |bf16 - reloaded| = %g" % (path, loaded.dtype, worst))
    if worst != 0.0:
        raise RuntimeError("%s: weights changed in the bf16 save/reload" % path)
    return loaded


class LayerCapture:
    """Forward hooks that keep each decoder layer's output (before the final norm)."""

    def __init__(self, layers):
        self.outputs = [None] * len(layers)
        self.handles = [layer.register_forward_hook(self._hook(i)) for i, layer in
                        enumerate(layers)]

    def _hook(self, i):
        def fn(_module, _inputs, output):
            h = output[0] if isinstance(output, (tuple, list)) else output
            self.outputs[i] = h.detach().clone()
        return fn

    def stacked(self, n_pos):
        """[n_layers, n_pos, hidden] of batch row 0."""
        for h in self.handles:
            h.remove()
        return torch.stack([o[0, :n_pos] for o in self.outputs])


# ---- Janus ----

def janus_config(text_vocab, ids):
    """Tiny Janus-Pro-shaped config (docs/formats.md §2.2): 2 layers, hidden 64, 4 MHA heads
    of 16."""
    from transformers import JanusConfig, JanusVisionConfig, JanusVQVAEConfig, LlamaConfig
    text = LlamaConfig(vocab_size=text_vocab, hidden_size=64, intermediate_size=160,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                       head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                       hidden_act="silu", tie_word_embeddings=False, bos_token_id=ids["bos"],
                       eos_token_id=ids["eos"], pad_token_id=ids["pad"])
    vision = JanusVisionConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                               image_size=16 * GRID, patch_size=16, mlp_ratio=2.0,
                               projection_dim=64, depth=2, num_image_tokens=GRID * GRID)
    # GroupNorm uses 32 groups: every VQ channel count is a multiple of 32.
    vq = JanusVQVAEConfig(embed_dim=8, num_embeddings=256, latent_channels=32, base_channels=32,
                          channel_multiplier=[1, 1, 2], num_res_blocks=2, projection_dim=64,
                          image_token_embed_dim=64, num_hidden_layers=2, hidden_act="gelu")
    return JanusConfig(text_config=text, vision_config=vision, vq_config=vq,
                       image_token_id=ids["image"], tie_word_embeddings=False)


def janus_generation_config(ids):
    """generation_config.json as the transformers Janus port uses it (boi in generation_kwargs)."""
    from transformers import GenerationConfig
    return GenerationConfig(bos_token_id=ids["bos"], eos_token_id=ids["eos"],
                            pad_token_id=ids["pad"], guidance_scale=CFG_WEIGHT,
                            generation_kwargs={"boi_token_id": ids["boi"]})


def check_generation_config(path, ids):
    """Make sure generation_config.json holds bos, pad and generation_kwargs.boi_token_id."""
    gpath = os.path.join(path, "generation_config.json")
    doc = {}
    if os.path.exists(gpath):
        with open(gpath) as f:
            doc = json.load(f)
    ok = (doc.get("bos_token_id") == ids["bos"] and doc.get("pad_token_id") == ids["pad"]
          and doc.get("generation_kwargs", {}).get("boi_token_id") == ids["boi"])
    if not ok:
        log("generation_config.json incomplete after save_pretrained (%r); writing it" % doc)
        doc.update({"bos_token_id": ids["bos"], "eos_token_id": ids["eos"],
                    "pad_token_id": ids["pad"], "guidance_scale": CFG_WEIGHT})
        doc.setdefault("generation_kwargs", {})["boi_token_id"] = ids["boi"]
        with open(gpath, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
    log("generation_config.json: %s" % json.dumps(doc, sort_keys=True))


def janus_ids(tok):
    """Special ids resolved by string from the fixture tokenizer."""
    s = tokfx.special_ids(tok)
    return {"bos": s[tokfx.BOS], "eos": s[tokfx.EOS], "pad": s[tokfx.PAD],
            "boi": s[tokfx.BOI], "image": s["<image_placeholder>"]}


def gen_logits(model, prompt_ids, image_ids, capture=None):
    """Teacher forcing: rows i = generation-head logits predicting image_ids[i] from the prompt
    and image_ids[:i]; image tokens enter as generation_aligner(generation_embeddings(id))."""
    lm = model.model.language_model
    text = lm.get_input_embeddings()(torch.tensor([prompt_ids]))
    image = model.prepare_embeddings_for_image_generation(torch.tensor([image_ids[:-1]]))
    embeds = torch.cat([text, image.to(text.dtype)], dim=1)
    out = lm(inputs_embeds=embeds, use_cache=False)
    hidden = out.last_hidden_state
    rows = hidden[0, len(prompt_ids) - 1:]
    layers = capture.stacked(N_POS_HIDDEN) if capture else None
    return model.model.generation_head(rows), hidden[0, :N_POS_HIDDEN], layers


def uncond_ids(prompt_ids, pad):
    """docs/architecture.md §4.1 step 3: keep BOS (first) and <begin_of_image> (last), pad
    the rest."""
    return [prompt_ids[0]] + [pad] * (len(prompt_ids) - 2) + [prompt_ids[-1]]


def cfg_logits(model, prompt_ids, image_ids, pad):
    """(cond, uncond, cfg) logits; cfg = u + w (c - u)."""
    cond = gen_logits(model, prompt_ids, image_ids)[0]
    unc = gen_logits(model, uncond_ids(prompt_ids, pad), image_ids)[0]
    return cond, unc, unc + CFG_WEIGHT * (cond - unc)


def new_cache(model):
    """An empty DynamicCache for the language model (constructor differs across versions)."""
    from transformers import DynamicCache
    try:
        return DynamicCache(config=model.config.text_config)
    except TypeError:
        return DynamicCache()


def greedy_cached(model, prompt_ids, pad, steps):
    """Greedy CFG decoding with a KV cache, as docs/architecture.md §4.1 (argmax instead of
    sampling):
    prefill the cond/uncond pair, then feed each chosen id to both rows."""
    lm = model.model.language_model
    rows = torch.tensor([prompt_ids, uncond_ids(prompt_ids, pad)])
    x = lm.get_input_embeddings()(rows)
    cache = new_cache(model)
    ids = []
    for _ in range(steps):
        out = lm(inputs_embeds=x, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        logits = model.model.generation_head(out.last_hidden_state[:, -1])
        cfg = logits[1] + CFG_WEIGHT * (logits[0] - logits[1])
        ids.append(int(cfg.argmax().item()))
        x = model.prepare_embeddings_for_image_generation(torch.tensor([[ids[-1]]] * 2))
    return ids


def transformers_generate(model, prompt_ids):
    """transformers' own Janus image generate(), greedy; 5.17 needs a cache passed in (its
    static-cache helper call is missing an argument). Returns ids or an error string."""
    try:
        inp = torch.tensor([prompt_ids])
        out = model.generate(inputs=inp, attention_mask=torch.ones_like(inp),
                             generation_mode="image", do_sample=False,
                             guidance_scale=CFG_WEIGHT, past_key_values=new_cache(model))
        seq = out.sequences if hasattr(out, "sequences") else out
        return seq[0].tolist()
    except Exception as e:  # recorded in golden.json; the other references do not need it
        return "failed: %s: %s" % (type(e).__name__, str(e)[:200])


def greedy_check(model, fx, prompt_ids, pad):
    """Greedy CFG generation of one image (GRID x GRID ids) with a KV cache; checked against
    the teacher-forced CFG argmax and against transformers' generate()."""
    steps = GRID * GRID
    ids = greedy_cached(model, prompt_ids, pad, steps)
    cfg = cfg_logits(model, prompt_ids, ids, pad)[2]
    agree = int((cfg.argmax(-1) == torch.tensor(ids)).sum().item())
    hf = transformers_generate(model, prompt_ids)
    hf_state = hf if isinstance(hf, str) else ("match" if hf == ids else "differs: %s" % hf)
    log("greedy: %s; teacher-forced argmax agrees at %d/%d; transformers generate: %s"
        % (ids, agree, steps, hf_state))
    fx.save("greedy_ids", ids, np.int64)
    fx.save("greedy_logits_cfg", cfg, np.float32)
    fx.save("greedy_pixels", model.decode_image_tokens(torch.tensor([ids])).float(), np.float32)
    return {"generate_greedy": {"ids": "greedy_ids.npy", "logits_cfg": "greedy_logits_cfg.npy",
                                "pixels": "greedy_pixels.npy", "steps": steps,
                                "teacher_forced_argmax_agrees": agree,
                                "transformers_generate": hf_state}}


def janus_references(model, fx, prompt_ids, ids, rng):
    """Score input, logits, hidden states and VQ pixels; returns extra golden.json fields."""
    vocab = model.config.vq_config.num_embeddings
    image_ids = [int(x) for x in rng.integers(0, vocab, N_IMAGE_IDS)]
    fx.write_json("score_input.json", {"prompt_ids": prompt_ids, "image_ids": image_ids,
                                       "cfg_weight": CFG_WEIGHT})
    capture = LayerCapture(model.model.language_model.layers)
    cond, final_norm, layers = gen_logits(model, prompt_ids, image_ids, capture)
    unc = gen_logits(model, uncond_ids(prompt_ids, ids["pad"]), image_ids)[0]
    fx.save("logits_cond", cond, np.float32)
    fx.save("logits_uncond", unc, np.float32)
    fx.save("logits_cfg", unc + CFG_WEIGHT * (cond - unc), np.float32)
    fx.save("hidden_cond", layers, np.float32)
    fx.save("final_norm_cond", final_norm, np.float32)
    log("janus logits: cond std %.3f, uncond std %.3f, argmax cond %s"
        % (cond.std().item(), unc.std().item(), cond.argmax(-1).tolist()))
    tokens = torch.from_numpy(rng.integers(0, vocab, (2, GRID * GRID)).astype(np.int64))
    fx.save("vq_tokens", tokens, np.int64)
    fx.save("vq_quant", model.model.vqmodel.quantize.get_codebook_entry(tokens), np.float32)
    pixels = model.decode_image_tokens(tokens)
    fx.save("vq_pixels", pixels, np.float32)
    log("vq pixels %s, range [%.3f, %.3f]" % (list(pixels.shape), pixels.min().item(),
                                              pixels.max().item()))
    return greedy_check(model, fx, prompt_ids, ids["pad"])


def make_janus(out, tok, vers):
    """The golden/janus fixture."""
    from transformers import JanusForConditionalGeneration
    path = os.path.join(out, "golden", "janus")
    fx = Fixture(path, vers)
    ids = janus_ids(tok)
    n_tok = tok.get_vocab_size(with_added_tokens=True)
    text_vocab = (n_tok + 63) // 64 * 64  # embedding rows >= tokenizer ids, as in Janus-Pro
    torch.manual_seed(SEED)
    model = JanusForConditionalGeneration(janus_config(text_vocab, ids)).float().eval()
    tied = model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    log("janus: lm_head tied to embed_tokens: %s" % tied)
    randomize(model, SEED + 1, {"vision_head": 2.0, "lm_head": 2.0})
    model.generation_config = janus_generation_config(ids)
    model = save_bf16_and_reload(model, JanusForConditionalGeneration, path)
    check_generation_config(path, ids)
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "config.json")) as f:
        log("janus config.json: %s" % f.read())
    list_tensors(os.path.join(path, "model.safetensors"), os.path.join(path, "tensor_names.txt"))
    _, prompt_ids = tokfx.janus_prompt_ids(tok, tokfx.JANUS_PROMPTS[0])
    with torch.no_grad():
        extra = janus_references(model, fx, prompt_ids, ids, np.random.default_rng(SEED + 2))
    fx.finish(model={"arch": "janus", "config": "config.json", "weights": "model.safetensors",
                     "generation_config": "generation_config.json", "tokenizer": "tokenizer.json",
                     "tensor_names": "tensor_names.txt", "weights_dtype": "bfloat16",
                     "text_vocab": text_vocab, "grid": [GRID, GRID],
                     "image_vocab": model.config.vq_config.num_embeddings},
              reference={"dtype": "float32", "device": "cpu", "attention": "eager"},
              special_ids=ids, prompt=tokfx.JANUS_PROMPTS[0], score_input="score_input.json",
              cfg_weight=CFG_WEIGHT, n_pos_hidden=N_POS_HIDDEN,
              layout={"logits_*": "[n_image_ids, image_vocab]; row i predicts image_ids[i]",
                      "hidden_cond": "[n_layers, n_pos, hidden], decoder layer outputs, cond row",
                      "final_norm_cond": "[n_pos, hidden], after the final RMSNorm",
                      "vq_quant": "[batch, embed_dim, grid_h, grid_w], L2-normalised codebook",
                      "vq_pixels": "[batch, H, W, 3] decode_image_tokens output (NHWC, float)"},
              **extra)


# ---- Llama ----

def make_llama(out, vers):
    """The golden/llama fixture: GQA 4 query / 2 KV heads, untied lm_head."""
    from transformers import LlamaConfig, LlamaForCausalLM
    path = os.path.join(out, "golden", "llama")
    fx = Fixture(path, vers)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      max_position_embeddings=256, rms_norm_eps=1e-6,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                      hidden_act="silu", tie_word_embeddings=False, bos_token_id=1,
                      eos_token_id=2)
    torch.manual_seed(SEED + 10)
    model = LlamaForCausalLM(cfg).float().eval()
    randomize(model, SEED + 11, {"lm_head": 2.0})
    model = save_bf16_and_reload(model, LlamaForCausalLM, path)
    with open(os.path.join(path, "config.json")) as f:
        log("llama config.json: %s" % f.read())
    list_tensors(os.path.join(path, "model.safetensors"), os.path.join(path, "tensor_names.txt"))
    rng = np.random.default_rng(SEED + 12)
    input_ids = fx.save("input_ids", rng.integers(0, 256, 16), np.int64)
    with torch.no_grad():
        capture = LayerCapture(model.model.layers)
        out_ = model(input_ids=torch.from_numpy(input_ids)[None], use_cache=False)
        fx.save("logits", out_.logits[0], np.float32)
        fx.save("hidden", capture.stacked(N_POS_HIDDEN), np.float32)
    log("llama logits std %.3f, argmax %s" % (out_.logits.std().item(),
                                             out_.logits[0].argmax(-1).tolist()))
    fx.finish(model={"arch": "llama", "config": "config.json", "weights": "model.safetensors",
                     "tensor_names": "tensor_names.txt", "weights_dtype": "bfloat16"},
              reference={"dtype": "float32", "device": "cpu", "attention": "eager"},
              n_pos_hidden=N_POS_HIDDEN,
              layout={"logits": "[n_tokens, vocab], all positions, teacher forcing",
                      "hidden": "[n_layers, n_pos, hidden], decoder layer outputs"})


def write_opt_tokenizer(tok, path):
    """tokenizer.json (no post-processor: flexdiag adds the BOS itself) and a
    tokenizer_config.json for transformers' AutoTokenizer, OPT's special tokens named."""
    tok.save(os.path.join(path, "tokenizer.json"))
    conf = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "</s>",
            "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
            "add_bos_token": False, "add_prefix_space": False,
            "clean_up_tokenization_spaces": False, "model_max_length": 256}
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(conf, f, indent=2)
        f.write("\n")


def hf_tokenizer(path):
    """transformers' tokenizer of the folder (AutoTokenizer, else PreTrainedTokenizerFast on
    tokenizer.json), or an error string: the check is then skipped, the tokenizers library
    being the reference."""
    errors = []
    try:
        from transformers import AutoTokenizer
        return AutoTokenizer.from_pretrained(path)
    except Exception as e:
        errors.append("AutoTokenizer: %s: %s" % (type(e).__name__, str(e)[:200]))
    try:
        from transformers import PreTrainedTokenizerFast
        return PreTrainedTokenizerFast(tokenizer_file=os.path.join(path, "tokenizer.json"))
    except Exception as e:
        errors.append("PreTrainedTokenizerFast: %s: %s" % (type(e).__name__, str(e)[:200]))
    return "failed: " + "; ".join(errors)


def greedy_loop(model, prompt_ids, steps):
    """Greedy decoding by full forwards (no cache), stopping after EOS like generate()."""
    ids = list(prompt_ids)
    for _ in range(steps):
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
        ids.append(int(logits.argmax().item()))
        if ids[-1] == OPT_EOS:
            break
    return ids[len(prompt_ids):]


def opt_generate(model, prompt_ids):
    """transformers' greedy generate(): the new ids (through the first EOS, where it stops)."""
    inp = torch.tensor([prompt_ids])
    out = model.generate(input_ids=inp, attention_mask=torch.ones_like(inp),
                         max_new_tokens=OPT_NEW_TOKENS, do_sample=False, num_beams=1,
                         pad_token_id=OPT_PAD, eos_token_id=OPT_EOS)
    seq = out.sequences if hasattr(out, "sequences") else out
    return seq[0, len(prompt_ids):].tolist()


def opt_prompt_ids(tok, path, prompt):
    """[</s>] + encode(prompt), checked against transformers' tokenizer of the folder."""
    body = tok.encode(prompt, add_special_tokens=False).ids
    hf = hf_tokenizer(path)
    if isinstance(hf, str):
        log("opt: transformers tokenizer not loaded (%s); tokenizers' ids only" % hf)
        return [OPT_EOS] + body, hf
    hf_ids = hf(prompt, add_special_tokens=False)["input_ids"]
    log("opt prompt %r: tokenizers %s, transformers %s" % (prompt, body, hf_ids))
    if hf_ids != body:
        raise RuntimeError("opt: transformers' tokenizer encodes the prompt as %s, the "
                           "tokenizers library as %s" % (hf_ids, body))
    return [OPT_EOS] + body, hf


def opt_pick_prompt(model, tok):
    """The prompt of OPT_PROMPTS whose greedy continuation has the most distinct ids (the first
    on a tie)."""
    best, best_n = OPT_PROMPTS[0], -1
    for p in OPT_PROMPTS:
        gen = opt_generate(model, [OPT_EOS] + tok.encode(p, add_special_tokens=False).ids)
        log("opt greedy candidate %r: %d distinct of %s" % (p, len(set(gen)), gen))
        if len(set(gen)) > best_n:
            best, best_n = p, len(set(gen))
    return best


def opt_greedy(model, tok, fx, path):
    """greedy.json + greedy_logits.npy: transformers' generate() of the chosen prompt, its
    text and the teacher-forced logits of every generated id; returns golden.json fields."""
    prompt = opt_pick_prompt(model, tok)
    prompt_ids, hf = opt_prompt_ids(tok, path, prompt)
    generated = opt_generate(model, prompt_ids)
    own = greedy_loop(model, prompt_ids, OPT_NEW_TOKENS)
    log("opt greedy: generate() %s, full-forward loop %s" % (generated, own))
    if own != generated:
        raise RuntimeError("opt: generate() and the argmax loop disagree: %s vs %s"
                           % (generated, own))
    ids = generated[:generated.index(OPT_EOS)] if OPT_EOS in generated else generated
    text = tok.decode(ids, skip_special_tokens=True)
    hf_text = hf if isinstance(hf, str) else hf.decode(ids, skip_special_tokens=True)
    log("opt greedy text %r (transformers decode %r)" % (text, hf_text))
    if "\x00" in text:  # the C test reads the text as a NUL-terminated JSON string
        raise RuntimeError("opt: the greedy text holds a NUL byte; change OPT_PROMPTS")
    n_p = len(prompt_ids)
    full = model(input_ids=torch.tensor([prompt_ids + generated]), use_cache=False).logits[0]
    logits = full[n_p - 1:n_p - 1 + len(generated)]
    top2 = logits.topk(2, dim=-1).values
    margin = float((top2[:, 0] - top2[:, 1]).min().item())
    log("opt greedy: smallest top-1 / top-2 logit gap %.4g" % margin)
    if logits.argmax(-1).tolist() != generated:
        raise RuntimeError("opt: teacher-forced argmax differs from the generated ids")
    fx.save("greedy_logits", logits, np.float32)
    fx.write_json("greedy.json", {
        "prompt": prompt, "prompt_ids": prompt_ids, "max_new_tokens": OPT_NEW_TOKENS,
        "generated": generated, "ids": ids, "stop": "eos" if OPT_EOS in generated else "length",
        "text": text, "transformers_text": hf_text, "eos_id": OPT_EOS, "pad_id": OPT_PAD,
        "min_top2_gap": margin})
    return {"greedy": "greedy.json", "greedy_logits": "greedy_logits.npy"}


def make_opt(out, vers):
    """The golden/opt fixture: pre-LayerNorm blocks with biases, ReLU MLP, learned positions
    (offset 2), tied head, a trained GPT-2-style tokenizer; plus the same tokens left-padded
    with pad id 1 under an attention mask (positions count only real tokens; pad rows use
    position row 1) and greedy text generation."""
    from transformers import OPTConfig, OPTForCausalLM
    path = os.path.join(out, "golden", "opt")
    fx = Fixture(path, vers)
    tok = tokfx.build_gpt2(OPT_VOCAB, log)
    cfg = OPTConfig(vocab_size=OPT_VOCAB, hidden_size=64, ffn_dim=160, num_hidden_layers=2,
                    num_attention_heads=4, max_position_embeddings=256, do_layer_norm_before=True,
                    word_embed_proj_dim=64, activation_function="relu", enable_bias=True,
                    layer_norm_elementwise_affine=True, tie_word_embeddings=True,
                    pad_token_id=OPT_PAD, bos_token_id=OPT_EOS, eos_token_id=OPT_EOS,
                    dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(SEED + 20)
    model = OPTForCausalLM(cfg).float().eval()
    # wider block outputs: with the head tied to N(0, 1) embeddings and gain 1, every greedy
    # continuation repeated one id (the residual's input embedding won the argmax)
    randomize(model, SEED + 21, {"fc2": 4.0, "out_proj": 4.0})
    model = save_bf16_and_reload(model, OPTForCausalLM, path)
    write_opt_tokenizer(tok, path)
    with open(os.path.join(path, "config.json")) as f:
        log("opt config.json: %s" % f.read())
    list_tensors(os.path.join(path, "model.safetensors"), os.path.join(path, "tensor_names.txt"))
    rng = np.random.default_rng(SEED + 22)
    ids = rng.integers(3, OPT_VOCAB, 16)
    ids[0] = OPT_EOS  # </s> as BOS, as OPT's tokenizer does
    input_ids = fx.save("input_ids", ids, np.int64)
    n_pad = 3
    padded = fx.save("padded_ids", np.concatenate([np.ones(n_pad, np.int64), ids]), np.int64)
    mask = np.concatenate([np.zeros(n_pad, np.int64), np.ones(len(ids), np.int64)])
    with torch.no_grad():
        capture = LayerCapture(model.model.decoder.layers)
        out_ = model(input_ids=torch.from_numpy(input_ids)[None], use_cache=False)
        fx.save("logits", out_.logits[0], np.float32)
        fx.save("hidden", capture.stacked(N_POS_HIDDEN), np.float32)
        outp = model(input_ids=torch.from_numpy(padded)[None],
                     attention_mask=torch.from_numpy(mask)[None], use_cache=False)
        fx.save("padded_logits", outp.logits[0], np.float32)
        extra = opt_greedy(model, tok, fx, path)
    gap = (outp.logits[0, n_pad:] - out_.logits[0]).abs().max().item()
    log("opt logits std %.3f, argmax %s; left-padded vs plain max |diff| %.3g" %
        (out_.logits.std().item(), out_.logits[0].argmax(-1).tolist(), gap))
    fx.write_json("tokenizer_cases.json", tokfx.gpt2_cases_document(tok, vers))
    fx.finish(model={"arch": "opt", "config": "config.json", "weights": "model.safetensors",
                     "tokenizer": "tokenizer.json", "tensor_names": "tensor_names.txt",
                     "weights_dtype": "bfloat16"},
              reference={"dtype": "float32", "device": "cpu", "attention": "eager"},
              n_pos_hidden=N_POS_HIDDEN, n_pad=n_pad, tokenizer_cases="tokenizer_cases.json",
              layout={"logits": "[n_tokens, vocab], all positions, teacher forcing",
                      "hidden": "[n_layers, n_pos, hidden], decoder layer outputs",
                      "padded_logits": "[n_pad + n_tokens, vocab]: padded_ids (n_pad pad ids 1, "
                                       "then input_ids) under an attention mask of 0 on the pads",
                      "greedy_logits": "[n_generated, vocab]: row i predicts generated[i] "
                                       "(teacher forcing on prompt_ids + generated)"},
              **extra)


# ---- Chameleon (Lumina-mGPT) ----

def image_code_name(code):
    """Chameleon's name of VQGAN code `code`: IMGIMG + its decimal digits as A..J + Z."""
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z"


def chameleon_vocabulary_map(perm):
    """name -> id: <s> <pad> </s> <unk> (0..3), the image codes (id 4 + i has code perm[i]),
    <eoss> 68, <racm3:break> 69 (image start), <reserved08706> 70 (end of turn),
    <reserved08799> 71 (end of an image row), <reserved08804> 72 (the size token of an 8-code
    side: 8800 + grid / 2), then text tokens t0.. up to the vocabulary size."""
    vmap = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for i, code in enumerate(perm):
        vmap[image_code_name(int(code))] = CHAM_IMG0 + i
    n_codes = CHAM_GRID * CHAM_GRID
    specials = ["<eoss>", "<racm3:break>", "<reserved08706>", "<reserved08799>",
                "<reserved%05d>" % (8800 + CHAM_GRID // 2)]
    for k, name in enumerate(specials):
        vmap[name] = CHAM_IMG0 + n_codes + k
    first_text = CHAM_IMG0 + n_codes + len(specials)
    for i in range(first_text, CHAM_VOCAB):
        vmap["t%d" % (i - first_text)] = i
    return vmap


def chameleon_config(vmap):
    """Tiny Lumina-mGPT-shaped config: 2 layers, hidden 64, 4 MHA heads of 16, untied head; a
    minimal VQ encoder (the class always builds one; its tensors are not saved)."""
    from transformers import ChameleonConfig
    vq = {"embed_dim": 8, "num_embeddings": CHAM_GRID * CHAM_GRID, "latent_channels": 32,
          "resolution": 16 * CHAM_GRID, "base_channels": 32, "channel_multiplier": [1],
          "num_res_blocks": 1, "attn_resolutions": None}
    return ChameleonConfig(vocab_size=CHAM_VOCAB, hidden_size=64, intermediate_size=128,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                           max_position_embeddings=256, rms_norm_eps=1e-5,
                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                           hidden_act="silu", tie_word_embeddings=False, swin_norm=False,
                           bos_token_id=0, pad_token_id=1, eos_token_id=2, vq_config=vq,
                           vocabulary_map=vmap)


def check_vocabulary_mapping(model, perm):
    """transformers must read the image codes of vmap as intended (id 4 + i -> perm[i])."""
    got = model.model.vocabulary_mapping.bpe2img
    want = {CHAM_IMG0 + i: int(c) for i, c in enumerate(perm)}
    if got != want:
        raise RuntimeError("chameleon: transformers maps image ids to codes as %s, want %s"
                           % (sorted(got.items())[:6], sorted(want.items())[:6]))
    log("chameleon: image ids %d..%d, codes %s..." % (min(got), max(got), list(perm[:8])))


def same_qk_rows(model, seed):
    """Every layer's q_norm / k_norm weight and bias [heads, head_dim]: one random row repeated
    (weight 1 + N(0, 0.1²), bias N(0, 0.05²)), so that [1, head_dim] is the same model."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in model.model.layers:
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                d = norm.weight.shape[-1]
                norm.weight.copy_((1.0 + 0.1 * torch.randn(d, generator=g)).expand_as(norm.weight))
                norm.bias.copy_((0.05 * torch.randn(d, generator=g)).expand_as(norm.bias))


def lumina_layout(path):
    """Rewrite model.safetensors as Lumina-mGPT stores it: no model.vqmodel.* tensors and the
    QK-norm tables as [1, head_dim] (their rows are identical); other names unchanged."""
    from safetensors.torch import load_file, save_file
    f = os.path.join(path, "model.safetensors")
    tensors, kept, dropped = load_file(f), {}, 0
    for name, t in tensors.items():
        if name.startswith("model.vqmodel."):
            dropped += 1
            continue
        if re.search(r"self_attn\.[qk]_norm\.(weight|bias)$", name):
            if not torch.equal(t, t[:1].expand_as(t)):
                raise RuntimeError("chameleon: %s rows differ" % name)
            t = t[:1].clone()
        if not name.startswith(("model.embed_tokens.", "model.layers.", "model.norm.",
                                "lm_head.")):
            raise RuntimeError("chameleon: unexpected tensor name %s (transformers renamed?)"
                               % name)
        kept[name] = t.contiguous()
    save_file(kept, f, metadata={"format": "pt"})
    log("chameleon: %d tensors kept, %d model.vqmodel.* dropped, QK norms as [1, head_dim]"
        % (len(kept), dropped))


def patch_config(path, fields):
    """Add fields to config.json (flexdiag's image_grid) and log the result."""
    p = os.path.join(path, "config.json")
    with open(p) as f:
        doc = json.load(f)
    doc.update(fields)
    with open(p, "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
        f.write("\n")
    if doc.get("model_type") != "chameleon" or "vocabulary_map" not in doc:
        raise RuntimeError("chameleon config.json lacks model_type/vocabulary_map: %s"
                           % sorted(doc))
    log("chameleon config.json: %s" % json.dumps({k: v for k, v in doc.items()
                                                  if k != "vocabulary_map"}, sort_keys=True))


def chameleon_text(model, fx, rng):
    """Text mode: logits of every position over the whole vocabulary (lm_head of the model's
    output; ChameleonForConditionalGeneration.forward masks the image codes) and per-layer
    hidden states."""
    ids = rng.integers(3, CHAM_VOCAB, 24)
    ids[0] = 0  # <s>
    input_ids = fx.save("input_ids", ids, np.int64)
    capture = LayerCapture(model.model.layers)
    out = model.model(input_ids=torch.from_numpy(input_ids)[None], use_cache=False)
    logits = model.lm_head(out.last_hidden_state)[0]
    fx.save("logits", logits, np.float32)
    fx.save("hidden", capture.stacked(N_POS_HIDDEN), np.float32)
    masked = model(input_ids=torch.from_numpy(input_ids)[None], use_cache=False).logits[0]
    codes = slice(CHAM_IMG0, CHAM_IMG0 + CHAM_GRID * CHAM_GRID)
    keep = torch.ones(CHAM_VOCAB, dtype=torch.bool)
    keep[codes] = False
    log("chameleon text logits std %.3f, argmax %s; forward() logits outside the image codes "
        "max |diff| %.3g" % (logits.std().item(), logits.argmax(-1).tolist(),
                             (masked[:, keep] - logits[:, keep]).abs().max().item()))


def image_rows(model, prompt, image_ids):
    """One row of Lumina's CFG pair at its own positions 0..: the logits predicting each of
    image_ids (teacher forcing), restricted to the image-code ids in id order."""
    seq = torch.tensor([prompt + image_ids[:-1]])
    hidden = model.model(input_ids=seq, use_cache=False).last_hidden_state[0]
    logits = model.lm_head(hidden[len(prompt) - 1:])
    return logits[:, CHAM_IMG0:CHAM_IMG0 + CHAM_GRID * CHAM_GRID]


def chameleon_image(model, fx, rng, vmap, perm):
    """Image mode, CFG as Lumina-mGPT runs it: the conditional row [<s>] + text + end of turn +
    image start + size twice, the unconditional row image start + size twice alone; both
    teacher-forced on two image rows (8 codes + row end each)."""
    text0 = CHAM_IMG0 + CHAM_GRID * CHAM_GRID + 5
    eot, boi, row_end = vmap["<reserved08706>"], vmap["<racm3:break>"], vmap["<reserved08799>"]
    size = vmap["<reserved%05d>" % (8800 + CHAM_GRID // 2)]
    cond = [0] + [int(x) for x in rng.integers(text0, CHAM_VOCAB, 6)] + [eot, boi, size, size]
    uncond = [boi, size, size]
    image_ids = []
    for _ in range(2):
        codes = rng.integers(CHAM_IMG0, CHAM_IMG0 + CHAM_GRID * CHAM_GRID, CHAM_GRID)
        image_ids += [int(x) for x in codes] + [row_end]
    c, u = image_rows(model, cond, image_ids), image_rows(model, uncond, image_ids)
    cfg = u + CHAM_CFG * (c - u)
    fx.save("image_logits_cond", c, np.float32)
    fx.save("image_logits_uncond", u, np.float32)
    fx.save("image_logits_cfg", cfg, np.float32)
    fx.write_json("image_input.json", {
        "cond_prompt": cond, "uncond_prompt": uncond, "image_ids": image_ids,
        "cfg_weight": CHAM_CFG, "row_end_id": row_end, "image_id0": CHAM_IMG0,
        "code_of_id": [int(x) for x in perm]})
    log("chameleon image: cond %s, uncond %s, ids %s; cfg argmax + %d: %s"
        % (cond, uncond, image_ids, CHAM_IMG0, cfg.argmax(-1).tolist()))


def make_chameleon(out, vers):
    """The golden/chameleon fixture (Lumina-mGPT's layout of a Chameleon model)."""
    from transformers import ChameleonForConditionalGeneration
    path = os.path.join(out, "golden", "chameleon")
    fx = Fixture(path, vers)
    rng = np.random.default_rng(SEED + 32)
    perm = rng.permutation(CHAM_GRID * CHAM_GRID)
    vmap = chameleon_vocabulary_map(perm)
    torch.manual_seed(SEED + 30)
    model = ChameleonForConditionalGeneration(chameleon_config(vmap)).float().eval()
    check_vocabulary_mapping(model, perm)
    randomize(model, SEED + 31, {"lm_head": 2.0})
    same_qk_rows(model, SEED + 33)
    model = save_bf16_and_reload(model, ChameleonForConditionalGeneration, path)
    lumina_layout(path)
    patch_config(path, {"image_grid": CHAM_GRID})
    list_tensors(os.path.join(path, "model.safetensors"), os.path.join(path, "tensor_names.txt"))
    with torch.no_grad():
        chameleon_text(model, fx, rng)
        chameleon_image(model, fx, rng, vmap, perm)
    fx.finish(model={"arch": "chameleon", "config": "config.json",
                     "weights": "model.safetensors", "tensor_names": "tensor_names.txt",
                     "weights_dtype": "bfloat16", "vocab": CHAM_VOCAB, "grid": CHAM_GRID,
                     "image_ids": [CHAM_IMG0, CHAM_IMG0 + CHAM_GRID * CHAM_GRID - 1]},
              reference={"dtype": "float32", "device": "cpu", "attention": "eager"},
              n_pos_hidden=N_POS_HIDDEN, image_input="image_input.json", cfg_weight=CHAM_CFG,
              layout={"logits": "[n_tokens, vocab], all positions, lm_head of the model output "
                                "(no image-code mask), teacher forcing",
                      "hidden": "[n_layers, n_pos, hidden], decoder layer outputs",
                      "image_logits_*": "[n_image_ids, image codes]: row i predicts "
                                        "image_ids[i]; columns = ids 4..67 in id order; "
                                        "cfg = u + w (c - u)"})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--out", required=True, help="output folder (golden/, tokenizer/ inside)")
    ap.add_argument("--only", choices=["janus", "llama", "opt", "chameleon", "tokenizer"],
                    default=None,
                    help="make one fixture only (janus also needs the tokenizer)")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    vers = versions()
    log("versions: %s" % json.dumps(vers))
    tok = None
    if args.only in (None, "tokenizer", "janus"):
        tok = tokfx.build(SEED, log)
        if args.only != "janus":
            tokfx.write(tok, os.path.join(args.out, "tokenizer"), vers, log)
    if args.only in (None, "janus"):
        make_janus(args.out, tok, vers)
    if args.only in (None, "llama"):
        make_llama(args.out, vers)
    if args.only in (None, "opt"):
        make_opt(args.out, vers)
    if args.only in (None, "chameleon"):
        make_chameleon(args.out, vers)
    log("done: fixtures in %s" % args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
