#!/usr/bin/env python3
"""
janus_transformers.py - transformers' own Janus-Pro image generation, timed as the peer of
`flexdiag bench`.

Builds JanusForConditionalGeneration with Janus-Pro-7B or -1B shapes and random bf16 weights
directly on the GPU, makes --batch synthetic prompts (BOS, random text ids, <begin_of_image>),
and times transformers' `generate(generation_mode="image")`: its CFG row doubling (cond rows
then uncond rows, every id but BOS and <begin_of_image> replaced by pad), its CFG logits
processor and its multinomial sampling. transformers 5.17's image generate() crashes when it has
to make its own static cache, so a cache is always passed in (DynamicCache by default).
One warm-up generation of a few tokens, then --reps timed generations: img/s, tokens/s, prefill
time (CUDA events on the language model's first call), decode step time, peak GPU memory.
--decode-vq N also times the VQ decoder (decode_image_tokens) on N random 24x24 token grids.
Output: a markdown table row on stdout; with --json FILE one JSON object per row, appended.
The weights are random: the speed is real, the images are noise. Exit status 0 on success,
1 on a failure (message on stderr), 2 on bad flags.
"""

import argparse
import datetime
import json
import sys
import time
import traceback

PROG = "janus_transformers"
VQ_CODES = 16384          # image vocabulary (VQ-16 codebook rows)
VQ_GRID = 24              # 384 px / patch 16: tokens per side of one image
WARM_TOKENS = 8           # image tokens of the warm-up generation
INIT_STD = 0.02           # random weights: N(0, 0.02^2) matrices, norms 1, biases 0

# Janus-Pro shapes (docs/formats.md §2.4) and the special ids flexdiag's built-in configs use.
ARCHS = {
    "janus-pro-7b": {"hidden": 4096, "layers": 30, "heads": 32, "kv_heads": 32, "ffn": 11008,
                     "bos": 100000, "eos": 100001, "pad": 100015, "boi": 100016,
                     "image": 100594},
    "janus-pro-1b": {"hidden": 2048, "layers": 24, "heads": 16, "kv_heads": 16, "ffn": 5632,
                     "bos": 100000, "eos": 100001, "pad": 100002, "boi": 100003,
                     "image": 100581},
}
TEXT_VOCAB = 102400
MAX_POSITIONS = 16384


class PeerError(Exception):
    """A failure to report on stderr with exit status 1 (no traceback needed)."""


def log(msg):
    """Progress line on stdout, flushed at once (the device run's log is read as it comes)."""
    print(msg, flush=True)


def warn(msg):
    """Warning line on stderr, flushed."""
    print("%s: warning: %s" % (PROG, msg), file=sys.stderr, flush=True)


# ---- flags ----

def positive(name, low):
    """argparse type: an integer >= low, with an error naming the flag."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError("%s must be an integer, got '%s'" % (name, text))
        if value < low:
            raise argparse.ArgumentTypeError("%s must be >= %d, got %d" % (name, low, value))
        return value
    return parse


def parse_args(argv):
    """Command line; exits with status 2 and a message naming the flag on a bad value."""
    ap = argparse.ArgumentParser(
        prog=PROG, description="transformers' Janus image generation, timed as the peer of "
        "`flexdiag bench` (random weights).")
    ap.add_argument("--arch", choices=sorted(ARCHS), default="janus-pro-7b",
                    help="model shapes (default janus-pro-7b)")
    ap.add_argument("--batch", type=positive("--batch", 1), default=16,
                    help="images per generation (default 16, as flexdiag bench); rows = 2 x batch")
    ap.add_argument("--prompt-len", type=positive("--prompt-len", 2), default=50,
                    help="synthetic prompt ids incl. BOS and <begin_of_image> (default 50)")
    ap.add_argument("--tokens", type=positive("--tokens", 1), default=VQ_GRID * VQ_GRID,
                    help="image tokens per image (default 576 = a full 384x384 image)")
    ap.add_argument("--cfg", type=float, default=5.0, help="CFG weight (default 5.0, > 1)")
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa",
                    help="transformers attention implementation (default sdpa)")
    ap.add_argument("--cache", choices=["dynamic", "static"], default="dynamic",
                    help="KV cache passed to generate (default dynamic; see README)")
    ap.add_argument("--path", choices=["auto", "generate", "loop"], default="auto",
                    help="generate: transformers' generate() only; loop: the hand-written loop; "
                    "auto (default): generate, and the loop only if generate fails (reported)")
    ap.add_argument("--top-k", type=positive("--top-k", 0), default=0,
                    help="top-k sampling, 0 = off as in Janus-Pro (default 0; transformers' "
                    "global default would be 50)")
    ap.add_argument("--reps", type=positive("--reps", 1), default=1,
                    help="timed generations (default 1)")
    ap.add_argument("--seed", type=positive("--seed", 0), default=1,
                    help="seed of weights, prompts and sampling (default 1)")
    ap.add_argument("--decode-vq", type=positive("--decode-vq", 0), default=0, metavar="N",
                    help="also time decode_image_tokens on N random token grids (default 0)")
    ap.add_argument("--skip-generate", action="store_true",
                    help="only the --decode-vq timing")
    ap.add_argument("--json", metavar="FILE", help="append one JSON object per row to FILE")
    args = ap.parse_args(argv)
    if not args.cfg > 1.0:
        ap.error("--cfg must be > 1 (transformers' Janus generate only merges the cond and "
                 "uncond rows when guidance_scale > 1), got %g" % args.cfg)
    if args.prompt_len + args.tokens > MAX_POSITIONS:
        ap.error("--prompt-len + --tokens = %d exceeds the model's %d positions"
                 % (args.prompt_len + args.tokens, MAX_POSITIONS))
    if args.skip_generate and args.decode_vq == 0:
        ap.error("--skip-generate needs --decode-vq N (N >= 1): nothing would be measured")
    return args


def check_json_path(path):
    """Fail before the long run if FILE cannot be appended to."""
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as e:
        raise PeerError("--json %s: cannot open for appending: %s" % (path, e.strerror))


# ---- environment ----

def import_stack():
    """torch and transformers, with a CUDA device; returns (torch, transformers)."""
    try:
        import torch
        import transformers
    except ImportError as e:
        raise PeerError("needs torch and transformers (the project's GPU host has torch 2.11 and "
                        "transformers 5.17): %s" % e)
    if not torch.cuda.is_available():
        raise PeerError("no CUDA device visible to torch %s: this peer runs on the GPU only"
                        % torch.__version__)
    major = transformers.__version__.split(".")[0]
    if major != "5":
        warn("written against transformers 5.17, found %s; the generate path may differ"
             % transformers.__version__)
    return torch, transformers


# ---- model ----

def janus_config(arch):
    """JanusConfig with the shapes of deepseek-community/Janus-Pro-{7B,1B}: Llama text model,
    SigLIP-L vision tower (instantiated, never run), VQ-16 with the Janus-Pro decoder."""
    from transformers import JanusConfig, JanusVisionConfig, JanusVQVAEConfig, LlamaConfig
    a = ARCHS[arch]
    text = LlamaConfig(vocab_size=TEXT_VOCAB, hidden_size=a["hidden"],
                       intermediate_size=a["ffn"], num_hidden_layers=a["layers"],
                       num_attention_heads=a["heads"], num_key_value_heads=a["kv_heads"],
                       head_dim=a["hidden"] // a["heads"], max_position_embeddings=MAX_POSITIONS,
                       rms_norm_eps=1e-6,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                       hidden_act="silu", tie_word_embeddings=False, bos_token_id=a["bos"],
                       eos_token_id=a["eos"], pad_token_id=a["pad"])
    vision = JanusVisionConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                               mlp_ratio=4.0, image_size=16 * VQ_GRID, patch_size=16,
                               projection_dim=a["hidden"], depth=2,
                               num_image_tokens=VQ_GRID * VQ_GRID)
    vq = JanusVQVAEConfig(embed_dim=8, num_embeddings=VQ_CODES, latent_channels=256,
                          base_channels=128, channel_multiplier=[1, 1, 2, 2, 4], num_res_blocks=2,
                          projection_dim=a["hidden"], image_token_embed_dim=a["hidden"],
                          num_hidden_layers=2, hidden_act="gelu")
    return JanusConfig(text_config=text, vision_config=vision, vq_config=vq,
                       image_token_id=a["image"], tie_word_embeddings=False)


def generation_config(arch, cfg_weight):
    """generation_config as the Janus-Pro port has it: bos/eos/pad, boi in generation_kwargs."""
    from transformers import GenerationConfig
    a = ARCHS[arch]
    return GenerationConfig(bos_token_id=a["bos"], eos_token_id=a["eos"], pad_token_id=a["pad"],
                            guidance_scale=cfg_weight,
                            generation_kwargs={"boi_token_id": a["boi"]})


def construct_on_gpu(torch, config):
    """Instantiate the model on the GPU in bf16 (no CPU copy): every factory call inside the
    constructor allocates on cuda with bf16 as the default float type. Buffers the constructor
    computes in float32 on purpose (RoPE inv_freq) keep their dtype."""
    from transformers import JanusForConditionalGeneration
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = JanusForConditionalGeneration(config)
    finally:
        torch.set_default_dtype(previous)
    return model


def randomize(torch, model, seed):
    """Fast seeded random weights on the GPU: matrices, convolutions and embeddings
    N(0, INIT_STD^2), 1-D weights (norms) 1, biases 0; every parameter made bf16."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    cast = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dtype != torch.bfloat16:
                p.data = p.data.to(torch.bfloat16)
                cast += 1
            if p.device.type != "cuda":
                raise PeerError("parameter %s was built on %s, not on the GPU" % (name, p.device))
            if name.endswith("bias"):
                p.zero_()
            elif p.ndim == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, INIT_STD, generator=gen)
    if cast:
        log("%d parameters were built in another dtype and were cast to bf16" % cast)


def set_attention(model, name):
    """Select the attention implementation on the model and its sub-models; check that the
    language model really uses it."""
    model.set_attn_implementation(name)
    got = model.model.language_model.config._attn_implementation
    if got != name:
        raise PeerError("--attn %s: the language model reports attention '%s' after "
                        "set_attn_implementation" % (name, got))


def build_model(torch, args):
    """Random-weight Janus-Pro model on the GPU, eval mode; returns (model, seconds)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    model = construct_on_gpu(torch, janus_config(args.arch))
    randomize(torch, model, args.seed)
    set_attention(model, args.attn)
    model.generation_config = generation_config(args.arch, args.cfg)
    model.eval()
    torch.cuda.synchronize()
    return model, time.perf_counter() - t0


def describe_model(torch, model, seconds):
    """Log parameter counts and the GPU memory the weights take."""
    total = sum(p.numel() for p in model.parameters())
    lm = sum(p.numel() for p in model.model.language_model.layers.parameters())
    log("model built in %.1f s: %.3f B parameters (decoder layers %.3f B), weights %.2f GiB on "
        "the GPU, attention %s" % (seconds, total / 1e9, lm / 1e9,
                                   torch.cuda.memory_allocated() / 2**30,
                                   model.model.language_model.config._attn_implementation))


# ---- generation ----

def make_prompts(torch, args):
    """[batch, prompt_len] int64 on the GPU: BOS, random text ids (ordinary BPE ids below the
    BOS id, so the uncond masking keeps exactly the first and last id), <begin_of_image>."""
    a = ARCHS[args.arch]
    gen = torch.Generator().manual_seed(args.seed + 1)
    ids = torch.randint(0, a["bos"], (args.batch, args.prompt_len), generator=gen,
                        dtype=torch.long)
    ids[:, 0] = a["bos"]
    ids[:, -1] = a["boi"]
    return ids.to("cuda")


def set_image_tokens(model, n):
    """Janus image generate() runs vision_config.num_image_tokens steps: set it to n."""
    configs = {id(c): c for c in (model.model.vision_model.config, model.config.vision_config)}
    for c in configs.values():
        c.num_image_tokens = n


def new_cache(torch, model, kind, rows, max_len):
    """An empty KV cache for the language model: DynamicCache (grows by concatenation) or a
    StaticCache of max_len positions (constructor differs across transformers versions)."""
    import transformers
    text_config = model.model.language_model.config
    if kind == "dynamic":
        try:
            return transformers.DynamicCache(config=text_config)
        except TypeError:
            return transformers.DynamicCache()
    try:
        return transformers.StaticCache(config=text_config, max_cache_len=max_len)
    except TypeError:
        return transformers.StaticCache(config=text_config, max_batch_size=rows,
                                        max_cache_len=max_len, device="cuda",
                                        dtype=torch.bfloat16)


def run_generate(torch, model, prompts, args, n_tokens):
    """transformers' own Janus image generation of n_tokens ids per image; returns [B, n]."""
    set_image_tokens(model, n_tokens)
    batch, plen = prompts.shape
    cache = new_cache(torch, model, args.cache, 2 * batch, plen + n_tokens)
    out = model.generate(inputs=prompts, attention_mask=torch.ones_like(prompts),
                         generation_mode="image", do_sample=True, temperature=1.0,
                         top_k=args.top_k, top_p=1.0, guidance_scale=args.cfg,
                         max_new_tokens=n_tokens, past_key_values=cache)
    return out.sequences if hasattr(out, "sequences") else out


def uncond_rows(torch, prompts, arch):
    """[cond rows; uncond rows] as transformers builds them: in the uncond copy every id that
    is neither BOS nor <begin_of_image> becomes pad."""
    a = ARCHS[arch]
    rows = prompts.repeat(2, 1)
    unc = rows[prompts.shape[0]:]
    keep = (unc == a["bos"]) | (unc == a["boi"])
    rows[prompts.shape[0]:] = torch.where(keep, unc, torch.full_like(unc, a["pad"]))
    return rows


def run_loop(torch, model, prompts, args, n_tokens):
    """Hand-written equivalent of transformers' image generate (used only when generate fails):
    same rows, cache, generation head, CFG formula and multinomial sampling; returns [B, n]."""
    batch, plen = prompts.shape
    lm = model.model.language_model
    cache = new_cache(torch, model, args.cache, 2 * batch, plen + n_tokens)
    with torch.inference_mode():
        out = torch.empty((batch, n_tokens), dtype=torch.long, device=prompts.device)
        x = model.get_input_embeddings()(uncond_rows(torch, prompts, args.arch))
        for i in range(n_tokens):
            hidden = lm(inputs_embeds=x, past_key_values=cache, use_cache=True).last_hidden_state
            scores = model.model.generation_head(hidden[:, -1])
            cond, unc = scores[:batch], scores[batch:]
            guided = unc + (cond - unc) * args.cfg
            if args.top_k > 0:
                kth = torch.topk(guided, min(args.top_k, guided.shape[-1])).values[:, -1:]
                guided = guided.masked_fill(guided < kth, float("-inf"))
            nxt = torch.multinomial(torch.softmax(guided, dim=-1), num_samples=1).squeeze(-1)
            out[:, i] = nxt
            x = model.prepare_embeddings_for_image_generation(torch.cat([nxt, nxt])[:, None])
    return out


class LmClock:
    """CUDA events around the language model's first call of a generation (the prefill over
    all 2B rows); counts the calls (1 prefill + one per further image token)."""

    def __init__(self, torch, lm):
        self.calls = 0
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)
        self.handles = [lm.register_forward_pre_hook(self._before),
                        lm.register_forward_hook(self._after)]

    def _before(self, _module, _args):
        if self.calls == 0:
            self.start.record()

    def _after(self, _module, _args, _output):
        if self.calls == 0:
            self.end.record()
        self.calls += 1

    def reset(self):
        """Start counting a new generation."""
        self.calls = 0

    def prefill_s(self):
        """Seconds of the first call (after a synchronize)."""
        return self.start.elapsed_time(self.end) / 1e3 if self.calls else 0.0

    def close(self):
        """Remove the hooks."""
        for h in self.handles:
            h.remove()


def timed(torch, fn):
    """(fn(), seconds) with the GPU synchronised on both sides."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return result, time.perf_counter() - t0


def is_oom(torch, e):
    """True for a CUDA out-of-memory error."""
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e)


def warm_up(torch, model, prompts, args):
    """One short generation; picks the path. Returns (path, error text of a failed generate)."""
    n = min(WARM_TOKENS, args.tokens)
    error = None
    if args.path in ("auto", "generate"):
        try:
            ids, s = timed(torch, lambda: run_generate(torch, model, prompts, args, n))
            check_ids(ids, args.batch, n, "warm-up")
            log("warm-up: transformers generate, %d tokens in %.2f s" % (n, s))
            return "generate", None
        except Exception as e:  # reported; the loop is used only under --path auto
            if is_oom(torch, e):
                raise
            error = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            traceback.print_exc(file=sys.stderr)
            if args.path == "generate":
                raise PeerError("transformers' generate(generation_mode='image') failed (%s); "
                                "--path auto would measure the hand-written loop instead" % error)
            warn("transformers' generate(generation_mode='image') failed (%s); measuring the "
                 "hand-written loop instead, and the row says so" % error)
    _, s = timed(torch, lambda: run_loop(torch, model, prompts, args, n))
    log("warm-up: hand-written loop, %d tokens in %.2f s" % (n, s))
    return "loop", error


def check_ids(ids, batch, n, what):
    """The generated ids must be [batch, n] image codes."""
    if tuple(ids.shape) != (batch, n):
        raise PeerError("%s: generation returned shape %s, expected [%d, %d]"
                        % (what, list(ids.shape), batch, n))
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= VQ_CODES:
        raise PeerError("%s: generated ids span [%d, %d], outside the %d image codes"
                        % (what, lo, hi, VQ_CODES))


def bench_generate(torch, model, args, env):
    """Warm-up, then --reps timed full generations; returns the result row."""
    prompts = make_prompts(torch, args)
    torch.manual_seed(args.seed + 2)
    path, gen_error = warm_up(torch, model, prompts, args)
    generate = run_generate if path == "generate" else run_loop
    clock = LmClock(torch, model.model.language_model)
    torch.cuda.reset_peak_memory_stats()
    reps, prefill = [], []
    try:
        for r in range(args.reps):
            clock.reset()
            ids, s = timed(torch, lambda: generate(torch, model, prompts, args, args.tokens))
            check_ids(ids, args.batch, args.tokens, "rep %d" % (r + 1))
            reps.append(s)
            prefill.append(clock.prefill_s())
            log("rep %d: %.3f s (prefill %.3f s, %d language-model calls)"
                % (r + 1, s, prefill[-1], clock.calls))
            if clock.calls != args.tokens:
                warn("%d language-model calls for %d image tokens (expected one per token)"
                     % (clock.calls, args.tokens))
    finally:
        clock.close()
    peak = torch.cuda.max_memory_allocated() / 2**30
    return generate_row(args, env, path, gen_error, reps, prefill, peak)


def generate_row(args, env, path, gen_error, reps, prefill, peak):
    """Figures of the timed generations (means over reps)."""
    rows = 2 * args.batch
    total = sum(reps) / len(reps)
    pre = sum(prefill) / len(prefill)
    dec = max(total - pre, 0.0)
    steps = args.tokens - 1
    row = dict(env, kind="generate", path=path, attn=args.attn, cache=args.cache,
               batch=args.batch, prompt_len=args.prompt_len, gen_len=args.tokens,
               cfg_rows=2, cfg_weight=args.cfg, top_k=args.top_k, temperature=1.0,
               seed=args.seed, reps=args.reps, rep_s=[round(s, 6) for s in reps],
               best_s=min(reps), total_s=total, prefill_s=pre, decode_s=dec,
               img_per_s=args.batch / total, tok_per_s=rows * args.tokens / total,
               image_tok_per_s=args.batch * args.tokens / total,
               prefill_tok_s=rows * args.prompt_len / pre if pre > 0 else 0.0,
               decode_tok_s=rows * steps / dec if steps > 0 and dec > 0 else 0.0,
               step_ms=1e3 * dec / steps if steps > 0 else 0.0, peak_gpu_gib=peak)
    if gen_error:
        row["generate_error"] = gen_error
    return row


# ---- VQ decoder ----

def bench_vq(torch, model, args, env):
    """decode_image_tokens on --decode-vq random token grids (bf16): warm-up, then --reps."""
    n = args.decode_vq
    gen = torch.Generator(device="cuda").manual_seed(args.seed + 3)
    tokens = torch.randint(0, VQ_CODES, (n, VQ_GRID * VQ_GRID), generator=gen, device="cuda")
    torch.cuda.empty_cache()
    with torch.inference_mode():
        _, s = timed(torch, lambda: model.decode_image_tokens(tokens))
        log("VQ warm-up: %d images in %.3f s" % (n, s))
        torch.cuda.reset_peak_memory_stats()
        reps = []
        for r in range(args.reps):
            pixels, s = timed(torch, lambda: model.decode_image_tokens(tokens))
            reps.append(s)
            log("VQ rep %d: %.3f s" % (r + 1, s))
    side = 16 * VQ_GRID
    if tuple(pixels.shape) != (n, side, side, 3):
        raise PeerError("decode_image_tokens returned shape %s, expected [%d, %d, %d, 3]"
                        % (list(pixels.shape), n, side, side))
    mean = sum(reps) / len(reps)
    return dict(env, kind="vq_decode", images=n, pixels=[side, side],
                dtype=str(pixels.dtype).replace("torch.", ""), seed=args.seed, reps=args.reps,
                rep_s=[round(s, 6) for s in reps], total_s=mean, img_per_s=n / mean,
                ms_per_image=1e3 * mean / n,
                peak_gpu_gib=torch.cuda.max_memory_allocated() / 2**30)


# ---- output ----

def print_generate_row(row):
    """Markdown header and one row for a generation result."""
    path = row["path"] + (" (generate failed)" if row.get("generate_error") else "")
    log("")
    log("| peer | arch | path | attn | cache | batch | prompt | tokens | img/s | tok/s | "
        "prefill s | step ms | peak GiB |")
    log("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    log("| transformers %s | %s | %s | %s | %s | %d | %d | %d | %.3f | %.0f | %.3f | %.2f | "
        "%.2f |" % (row["transformers"], row["arch"], path, row["attn"], row["cache"],
                    row["batch"], row["prompt_len"], row["gen_len"], row["img_per_s"],
                    row["tok_per_s"], row["prefill_s"], row["step_ms"], row["peak_gpu_gib"]))


def print_vq_row(row):
    """Markdown header and one row for a VQ decoder result."""
    log("")
    log("| peer | arch | VQ decode images | img/s | ms/image | peak GiB |")
    log("|---|---|---|---|---|---|")
    log("| transformers %s | %s | %d | %.2f | %.2f | %.2f |"
        % (row["transformers"], row["arch"], row["images"], row["img_per_s"],
           row["ms_per_image"], row["peak_gpu_gib"]))


def append_json(path, row):
    """Append one JSON object (one line, with the UTC time) to path."""
    if not path:
        return
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(dict(time=now, **row)) + "\n")
    except OSError as e:
        raise PeerError("--json %s: cannot append: %s" % (path, e.strerror))


def environment(torch, transformers, args, weights_gib, build_s):
    """Fields shared by every result row: versions, device, model shapes."""
    a = ARCHS[args.arch]
    shapes = {k: a[k] for k in ("hidden", "layers", "heads", "kv_heads", "ffn")}
    shapes.update(text_vocab=TEXT_VOCAB, image_codes=VQ_CODES, grid=[VQ_GRID, VQ_GRID],
                  bos=a["bos"], pad=a["pad"], boi=a["boi"])
    return {"peer": "transformers", "backend": "transformers",
            "transformers": transformers.__version__, "torch": torch.__version__,
            "device": torch.cuda.get_device_name(), "arch": args.arch, "config": shapes,
            "random_weights": True, "weights_dtype": "bfloat16", "weights_gib": weights_gib,
            "build_s": build_s, "provenance": "measured"}


def run(args):
    """The whole measurement; raises PeerError on a reportable failure."""
    check_json_path(args.json)
    torch, transformers = import_stack()
    log("%s: transformers %s, torch %s, %s; arch %s, attention %s, cache %s"
        % (PROG, transformers.__version__, torch.__version__, torch.cuda.get_device_name(),
           args.arch, args.attn, args.cache))
    try:
        model, build_s = build_model(torch, args)
        weights_gib = torch.cuda.memory_allocated() / 2**30
        describe_model(torch, model, build_s)
        env = environment(torch, transformers, args, weights_gib, build_s)
        if not args.skip_generate:
            row = bench_generate(torch, model, args, env)
            print_generate_row(row)
            append_json(args.json, row)
        if args.decode_vq:
            row = bench_vq(torch, model, args, env)
            print_vq_row(row)
            append_json(args.json, row)
    except Exception as e:
        if is_oom(torch, e):
            raise PeerError("CUDA out of memory (batch %d, %d prompt + %d image tokens, "
                            "--decode-vq %d): lower --batch or --decode-vq; %s"
                            % (args.batch, args.prompt_len, args.tokens, args.decode_vq,
                               str(e).splitlines()[0]))
        raise


def main(argv=None):
    """Entry point: exit 0 on success, 1 on failure, 2 on bad flags (from argparse)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        run(args)
    except PeerError as e:
        print("%s: error: %s" % (PROG, e), file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("%s: interrupted" % PROG, file=sys.stderr, flush=True)
        return 130
    except Exception as e:  # unexpected: keep the traceback for the report
        traceback.print_exc(file=sys.stderr)
        print("%s: error: %s: %s" % (PROG, type(e).__name__, e), file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)
    sys.exit(main())
