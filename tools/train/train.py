#!/usr/bin/env python3
"""
train.py - trains the toy Janus-shaped image model of issue #18 from procedural data and exports
it as a flexdiag model folder (transformers `janus` layout).

  python3 tools/train/train.py --out DIR --seed 0 --minutes 9 [--resume] [--tiny]

Phases, one after the other inside the time budget (--minutes, counted from the start of the
process; each phase's step count is fixed from its measured speed unless --vq-steps /
--eval-steps / --ar-steps give it):
  1. vq         VQ-VAE on rendered scenes (shapes.py), Janus VQ-16 layout (models.py):
                MSE + L1 + quantiser loss, dead codes re-seeded from encoder outputs.
  2. evaluator  the GenEval-style detector (evaluator.py), on clean, noisy and VQ-reconstructed
                renders.
  3. ar         the Janus LM on [caption prompt, image tokens]: scenes rendered and VQ-encoded on
                the fly, the prompt built exactly as flexdiag builds it (text.py), with CFG
                dropout (p = 0.1: the prompt replaced by flexdiag's unconditional row, BOS + pads
                + <begin_of_image>, same length).
  4. final      PyTorch CFG sampling of the evaluation prompts (prompts.py), scored by the
                detector (a sanity number; flexdiag's own images are scored by evaluator.py),
                and the export.

Outputs in DIR: config.json, generation_config.json, tokenizer.json, model.safetensors (bf16;
the codebook f32), train_info.json (shapes, steps, losses, scores, sha256), evaluator.pt,
samples_pytorch.png (+ .txt captions), and ckpt/state.pt (the resumable training state; not part
of the model). The sha256 of model.safetensors is printed at the end.

Resuming: a run that reaches its time limit saves ckpt/state.pt and exits with status 3; the same
command with --resume continues (the phase step counts planned by the first run are kept). Data
of step s is drawn from numpy Generator([seed, phase, s]), so a resumed run sees the same batches.

Determinism: model initialisation (torch.manual_seed(seed)) and every batch are fixed by the
seed. With explicit --vq-steps/--eval-steps/--ar-steps the schedule is fixed too; without them
the step counts depend on the measured speed (they are printed and stored in train_info.json, so
a run can be repeated with them). GPU kernels (atomics in backward passes, cuBLAS/cuDNN algorithm
choice, the fused attention kernels' backward) are not bitwise reproducible unless --deterministic
(torch.use_deterministic_algorithms, the math attention path; slower). On the CPU runs are
reproducible.
"""

import argparse
import json
import math
import os
import queue
import sys
import threading
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import evaluator  # noqa: E402
import models  # noqa: E402
import png  # noqa: E402
import prompts  # noqa: E402
import shapes  # noqa: E402
import st  # noqa: E402
import text  # noqa: E402

GRID = 24                 # tokens per image side (576 tokens, as Janus-Pro)
P_UNCOND = 0.1            # CFG dropout
P_MAX = 16                # prompt capacity (BOS .. BOI); the longest caption needs 15

PRESETS = {
    # 96 x 96 images (3 VQ levels), ~6.9 M LM parameters, ~0.7 M decoder parameters
    "full": {
        "side": 96,
        "vq": {"base_channels": 32, "channel_multiplier": [1, 2, 2], "num_res_blocks": 1,
               "latent_channels": 64, "embed_dim": 8, "num_embeddings": 1024},
        "lm": {"hidden_size": 256, "num_hidden_layers": 8, "num_attention_heads": 8,
               "num_key_value_heads": 8, "head_dim": 32, "intermediate_size": 688},
        "batch_vq": 64, "batch_ar": 128, "batch_eval": 128, "lr_vq": 6e-4, "lr_ar": 1.5e-3,
        "warmup_vq": 100, "warmup_ar": 200, "frac_vq": 0.14, "frac_eval": 0.10,
        "reserve_s": 35.0, "sample_per_category": 16, "log_every": 100, "ckpt_every_s": 120,
        "det_width": 32, "window": (10, 30),
    },
    # CPU smoke test: 48 x 48 images (2 levels), a 2-layer LM of width 64
    "tiny": {
        "side": 48,
        "vq": {"base_channels": 32, "channel_multiplier": [1, 1], "num_res_blocks": 1,
               "latent_channels": 32, "embed_dim": 8, "num_embeddings": 256},
        "lm": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 4, "head_dim": 16, "intermediate_size": 160},
        "batch_vq": 4, "batch_ar": 4, "batch_eval": 16, "lr_vq": 1e-3, "lr_ar": 2e-3,
        "warmup_vq": 10, "warmup_ar": 10, "frac_vq": 0.2, "frac_eval": 0.08,
        "reserve_s": 20.0, "sample_per_category": 1, "log_every": 10, "ckpt_every_s": 60,
        "det_width": 16, "window": (2, 6),
    },
}


def log(msg):
    print("[%7.1fs] %s" % (time.time() - T0, msg), flush=True)


T0 = time.time()


# ---------------------------------------------------------------- configs

def make_configs(p, tok):
    vq = dict(p["vq"])
    lm = dict(p["lm"])
    vocab = (tok.n_ids + 63) // 64 * 64
    lm.update({"vocab_size": vocab, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
               "max_position_embeddings": 1024})
    vq.update({"projection_dim": lm["hidden_size"], "num_hidden_layers": 2,
               "image_token_embed_dim": lm["hidden_size"], "num_patches": GRID,
               "hidden_act": "gelu", "out_channels": 3, "in_channels": 3})
    return vq, lm


def hf_config(vq, lm, tok):
    """config.json in the transformers `janus` layout (docs/formats.md §2.2, §2.3)."""
    text_config = {
        "model_type": "llama", "hidden_size": lm["hidden_size"],
        "intermediate_size": lm["intermediate_size"],
        "num_hidden_layers": lm["num_hidden_layers"],
        "num_attention_heads": lm["num_attention_heads"],
        "num_key_value_heads": lm["num_key_value_heads"], "head_dim": lm["head_dim"],
        "vocab_size": lm["vocab_size"], "max_position_embeddings": lm["max_position_embeddings"],
        "rms_norm_eps": lm["rms_norm_eps"], "rope_theta": lm["rope_theta"],
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "tie_word_embeddings": False, "bos_token_id": tok.bos,
        "eos_token_id": tok.special[text.EOS], "pad_token_id": tok.pad,
    }
    vq_config = {"model_type": "janus_vqgan", "double_latent": False, "dropout": 0.0}
    vq_config.update({k: vq[k] for k in ["embed_dim", "num_embeddings", "latent_channels",
                                         "base_channels", "channel_multiplier",
                                         "num_res_blocks", "out_channels", "in_channels",
                                         "num_patches", "projection_dim", "num_hidden_layers",
                                         "image_token_embed_dim", "hidden_act"]})
    side = GRID << (len(vq["channel_multiplier"]) - 1)
    return {
        "architectures": ["JanusForConditionalGeneration"], "model_type": "janus",
        "dtype": "bfloat16", "tie_word_embeddings": False,
        "image_token_id": tok.special[text.IMG],
        "text_config": text_config,
        "vision_config": {"model_type": "janus_vision_model", "image_size": 16 * GRID,
                          "patch_size": 16, "num_image_tokens": GRID * GRID},
        "vq_config": vq_config,
        "flexdiag_image_size": side,
    }


# ---------------------------------------------------------------- helpers

def lr_at(step, total, base, warmup, floor=0.1):
    if step < warmup:
        return base * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return base * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


def make_opt(model, lr, betas, device):
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.05}, {"params": other, "weight_decay": 0.0}]
    if device.type == "cuda":
        try:
            return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=True)
        except (TypeError, RuntimeError):
            pass
    return torch.optim.AdamW(groups, lr=lr, betas=betas)


def autocast(device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


class Planner:
    """Fixes a phase's step count from the speed of steps m1..m2 and the phase's deadline."""

    def __init__(self, total, deadline, m1, m2):
        self.total, self.deadline, self.m1, self.m2 = total, deadline, m1, m2
        self.t1 = None
        self.rate = None

    def tick(self, step):
        if self.total is not None:
            return
        if step == self.m1:
            self.t1 = time.time()
        elif step == self.m2:
            rate = (self.m2 - self.m1) / max(time.time() - self.t1, 1e-6)
            self.total = max(self.m2 + 1, self.m2 + int(rate * (self.deadline - time.time())))
            self.rate = rate

    def provisional(self):
        return self.total if self.total is not None else 10 ** 9


def save_state(path, state):
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_state(path, device):
    try:
        return torch.load(path, map_location=device, weights_only=False)
    except TypeError:
        return torch.load(path, map_location=device)


# ---------------------------------------------------------------- phases

def train_vq(vq, opt, S, args, p, device, deadline_phase, deadline_hard):
    side = p["side"]
    plan = Planner(S["vq_total"] if S.get("vq_total") is not None else args.vq_steps,
                   deadline_phase, *p["window"])
    step = S.get("vq_step", 0)
    V = vq.cfg["num_embeddings"]
    counts = torch.zeros(V, device=device)
    t_ckpt = time.time()
    vq.train()
    while step < plan.provisional():
        plan.tick(step)
        if plan.total is not None and S.get("vq_total") is None:
            S["vq_total"] = plan.total
            if plan.rate:
                log("vq: %.1f steps/s -> %d steps" % (plan.rate, plan.total))
        if step >= plan.provisional():
            break
        if time.time() > deadline_hard:
            return step, False
        rng = np.random.default_rng([args.seed, 1, step])
        img, _, _, _ = shapes.batch(rng, p["batch_vq"], side, device)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, plan.provisional(), p["lr_vq"], p["warmup_vq"])
        with autocast(device):
            rec, qloss, ids, zf = vq(img)
        rec = rec.float()
        loss = F.mse_loss(rec, img) + 0.5 * F.l1_loss(rec, img) + qloss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vq.parameters(), 1.0)
        opt.step()
        counts += torch.bincount(ids.reshape(-1), minlength=V).float()
        if (step + 1) % 50 == 0:
            dead = counts == 0
            used = int((~dead).sum())
            if dead.any() and step < 0.8 * plan.provisional():
                g = torch.Generator(device="cpu").manual_seed(args.seed * 1000003 + step)
                pick = torch.randint(0, zf.shape[0], (int(dead.sum()),), generator=g)
                with torch.no_grad():
                    vq.quantize.embedding.weight[dead] = zf.detach()[pick.to(device)].to(
                        vq.quantize.embedding.weight.dtype)
            S["vq_used"] = used
            counts.zero_()
        if step % p["log_every"] == 0 or step + 1 == plan.total:
            mse = F.mse_loss(rec.detach(), img).item()
            log("vq step %d/%s loss %.4f mse %.5f psnr %.1f dB codes used %s" % (
                step, plan.total, loss.item(), mse, 10 * math.log10(4.0 / max(mse, 1e-10)),
                S.get("vq_used", "-")))
            S["vq_mse"] = mse
        step += 1
        S["vq_step"] = step
        if time.time() - t_ckpt > p["ckpt_every_s"]:
            S["checkpoint"]()
            t_ckpt = time.time()
    S["vq_total"] = plan.total if plan.total is not None else step
    return step, True


class Prefetch:
    """Background producer of AR batches (CPU scene sampling + GPU render + VQ encode)."""

    def __init__(self, fn, start, stop, depth=3):
        self.q = queue.Queue(maxsize=depth)
        self.fn, self.step, self.stop_at = fn, start, stop
        self.halt = False
        self.th = threading.Thread(target=self.run, daemon=True)
        self.th.start()

    def run(self):
        s = self.step
        while not self.halt and s < self.stop_at:
            try:
                item = self.fn(s)
            except Exception as e:  # surface in the consumer
                self.q.put(e)
                return
            self.q.put(item)
            s += 1

    def get(self):
        item = self.q.get()
        if isinstance(item, Exception):
            raise item
        return item

    def close(self):
        self.halt = True
        try:
            while True:
                self.q.get_nowait()
        except queue.Empty:
            pass


def ar_batch_fn(vq, tok, args, p, device):
    side = p["side"]

    def make(step):
        rng = np.random.default_rng([args.seed, 2, step])
        B = p["batch_ar"]
        specs = [shapes.sample_spec(rng) for _ in range(B)]
        lay = shapes.layout(rng, specs, side)
        drop = rng.random(B) < P_UNCOND
        txt = np.full((B, P_MAX), tok.pad, np.int64)
        plen = np.zeros(B, np.int64)
        for b, sp in enumerate(specs):
            ids = tok.prompt_ids(shapes.caption(sp))
            if drop[b]:
                ids = tok.uncond_ids(ids)
            assert len(ids) <= P_MAX, (shapes.caption(sp), len(ids))
            txt[b, :len(ids)] = ids
            plen[b] = len(ids)
        with torch.no_grad():
            img = shapes.render(lay, device)
            with autocast(device):
                codes = vq.encode(img)[2]
        return (torch.as_tensor(txt).to(device), torch.as_tensor(plen).to(device), codes)
    return make


def train_ar(lm, opt, vq, tok, S, args, p, device, deadline_phase, deadline_hard):
    plan = Planner(S["ar_total"] if S.get("ar_total") is not None else args.ar_steps,
                   deadline_phase, *[2 * w for w in p["window"]])
    step = S.get("ar_step", 0)
    lm.train()
    vq.eval()
    fn = ar_batch_fn(vq, tok, args, p, device)
    pf = Prefetch(fn, step, plan.provisional()) if device.type == "cuda" else None
    t_ckpt = time.time()
    t_rate, s_rate = time.time(), step
    losses = S.setdefault("ar_losses", [])
    try:
        while step < plan.provisional():
            plan.tick(step)
            if plan.total is not None and S.get("ar_total") is None:
                S["ar_total"] = plan.total
                if plan.rate:
                    log("ar: %.2f steps/s (%.0f images/s) -> %d steps" % (
                        plan.rate, plan.rate * p["batch_ar"], plan.total))
            if step >= plan.provisional():
                break
            if time.time() > deadline_hard:
                return step, False
            txt, plen, codes = pf.get() if pf else fn(step)
            for g in opt.param_groups:
                g["lr"] = lr_at(step, plan.provisional(), p["lr_ar"], p["warmup_ar"])
            with autocast(device):
                logits = lm.forward_train(txt, plen, codes)
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                   codes.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
            opt.step()
            if step % p["log_every"] == 0 or step + 1 == plan.total:
                lv = loss.item()
                losses.append([step, lv])
                now = time.time()
                rate = (step - s_rate) / max(now - t_rate, 1e-6) if step > s_rate else 0.0
                t_rate, s_rate = now, step
                log("ar step %d/%s loss %.4f lr %.2e %.2f steps/s" % (
                    step, plan.total, lv, opt.param_groups[0]["lr"], rate))
            step += 1
            S["ar_step"] = step
            if time.time() - t_ckpt > p["ckpt_every_s"]:
                S["checkpoint"]()
                t_ckpt = time.time()
    finally:
        if pf:
            pf.close()
    S["ar_total"] = plan.total if plan.total is not None else step
    return step, True


# ---------------------------------------------------------------- export

def export(out, vq, lm, tok, vqc, lmc, S, p):
    """config.json, generation_config.json, tokenizer.json, model.safetensors (transformers
    janus names; bf16, codebook f32). Returns (sha256, bytes)."""
    tensors = {}
    for k, v in lm.state_dict().items():
        if k.startswith("generation_"):
            name = "model." + k
        else:
            name = "model.language_model." + k
        tensors[name] = v.detach().float().to(torch.bfloat16)
    for k, v in vq.state_dict().items():
        if k.startswith("decoder.") or k.startswith("post_quant_conv."):
            tensors["model.vqmodel." + k] = v.detach().float().to(torch.bfloat16)
    tensors["model.vqmodel.quantize.embedding.weight"] = \
        vq.quantize.embedding.weight.detach().float().cpu()
    path = os.path.join(out, "model.safetensors")
    sha = st.save(tensors, path, {"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(hf_config(vqc, lmc, tok), f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": tok.bos, "eos_token_id": tok.special[text.EOS],
                   "pad_token_id": tok.pad, "guidance_scale": 5.0,
                   "generation_kwargs": {"boi_token_id": tok.boi}}, f, indent=2)
        f.write("\n")
    tok.save(os.path.join(out, "tokenizer.json"))
    return sha, os.path.getsize(path), tensors


def part_bytes(tensors):
    parts = {"language model": 0, "generation embed/aligner/head": 0, "VQ decoder": 0}
    for k, v in tensors.items():
        b = v.numel() * v.element_size()
        if k.startswith("model.language_model."):
            parts["language model"] += b
        elif k.startswith("model.generation"):
            parts["generation embed/aligner/head"] += b
        else:
            parts["VQ decoder"] += b
    return parts


# ---------------------------------------------------------------- final: sample + score

@torch.no_grad()
def sample_and_score(lm, vq, det, tok, args, p, device, out):
    metas = prompts.build(p["sample_per_category"], args.seed)
    lm.eval()
    vq.eval()
    g = torch.Generator(device=device).manual_seed(args.seed + 12345)
    imgs = []
    bs = 64
    for i in range(0, len(metas), bs):
        chunk = metas[i:i + bs]
        ids = lm.generate([tok.prompt_ids(m["prompt"]) for m in chunk], GRID * GRID,
                          cfg_weight=5.0, generator=g, uncond_fn=tok.uncond_ids)
        imgs.append(shapes.to_uint8(vq.decode_ids(ids, GRID).float().clamp(-1, 1)))
    imgs = np.concatenate(imgs)
    rep = evaluator.full_report(det, metas, imgs, p["side"], device, args.seed)
    png.write(os.path.join(out, "samples_pytorch.png"), png.tile(imgs[:64], 8))
    with open(os.path.join(out, "samples_pytorch.txt"), "w") as f:
        f.write("".join("%d %s\n" % (i, m["prompt"]) for i, m in enumerate(metas[:64])))
    return rep


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="model folder to write")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--minutes", type=float, default=9.0,
                    help="wall-clock budget of this command (default 9)")
    ap.add_argument("--resume", action="store_true", help="continue from the checkpoint")
    ap.add_argument("--ckpt", default=None, help="checkpoint folder (default DIR/ckpt)")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke-test shapes (48 px, 2 layers)")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    ap.add_argument("--vq-steps", type=int, default=None)
    ap.add_argument("--eval-steps", type=int, default=None)
    ap.add_argument("--ar-steps", type=int, default=None)
    ap.add_argument("--batch-vq", type=int, default=None, help="override the preset's batch")
    ap.add_argument("--batch-ar", type=int, default=None, help="override the preset's batch")
    ap.add_argument("--batch-eval", type=int, default=None, help="override the preset's batch")
    ap.add_argument("--kv-heads", type=int, default=None,
                    help="KV heads of the LM (GQA; default: as many as query heads)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: all cores)")
    ap.add_argument("--deterministic", action="store_true",
                    help="torch.use_deterministic_algorithms (slower on the GPU)")
    ap.add_argument("--no-sample", action="store_true", help="skip the PyTorch sampling check")
    args = ap.parse_args()

    budget = args.minutes * 60.0
    preset = "tiny" if args.tiny else "full"
    p = dict(PRESETS[preset])
    for k in ["batch_vq", "batch_ar", "batch_eval"]:
        if getattr(args, k) is not None:
            p[k] = getattr(args, k)
    if args.kv_heads:
        p["lm"] = dict(p["lm"], num_key_value_heads=args.kv_heads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = not args.deterministic
    if args.deterministic:
        torch.backends.cudnn.deterministic = True
        torch.use_deterministic_algorithms(True, warn_only=True)
        if device.type == "cuda" and hasattr(torch.backends.cuda, "enable_math_sdp"):
            # the fused SDPA kernels' backward passes (cuDNN attention: measured on the H200,
            # two runs of the same command gave different weights) are not deterministic;
            # the math path is
            torch.backends.cuda.enable_flash_sdp(False)
            torch.backends.cuda.enable_mem_efficient_sdp(False)
            if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
                torch.backends.cuda.enable_cudnn_sdp(False)
            torch.backends.cuda.enable_math_sdp(True)
    ckdir = args.ckpt or os.path.join(args.out, "ckpt")
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(ckdir, exist_ok=True)
    ckpt = os.path.join(ckdir, "state.pt")

    tok = text.Tokenizer(shapes.all_caption_words())
    vqc, lmc = make_configs(p, tok)
    log("preset %s, device %s (%s), torch %s, seed %d, budget %.1f min" % (
        preset, device, torch.cuda.get_device_name(0) if device.type == "cuda" else
        "%d threads" % torch.get_num_threads(), torch.__version__, args.seed, args.minutes))

    torch.manual_seed(args.seed)
    vq = models.VQModel(vqc).to(device)
    lm = models.JanusLM(lmc, vqc).to(device)
    log("VQ: %.2f M parameters (decoder %.2f M), codebook %d x %d, %d px images, grid %d" % (
        models.count_params(vq) / 1e6, (models.count_params(vq.decoder) +
                                        models.count_params(vq.post_quant_conv)) / 1e6,
        vqc["num_embeddings"], vqc["embed_dim"], p["side"], GRID))
    log("LM: %.2f M parameters, hidden %d, %d layers, %d heads x %d, FFN %d, text vocab %d "
        "(%d used)" % (models.count_params(lm) / 1e6, lmc["hidden_size"],
                       lmc["num_hidden_layers"], lmc["num_attention_heads"], lmc["head_dim"],
                       lmc["intermediate_size"], lmc["vocab_size"], tok.n_ids))
    opt_vq = make_opt(vq, p["lr_vq"], (0.9, 0.99), device)
    opt_ar = make_opt(lm, p["lr_ar"], (0.9, 0.95), device)
    det = None
    S = {"phase": "vq", "preset": preset, "seed": args.seed}
    if args.resume and os.path.exists(ckpt):
        saved = load_state(ckpt, device)
        if saved.get("preset") != preset or saved.get("seed") != args.seed:
            sys.exit("train.py: %s was written with preset %s seed %s; this run is %s seed %d"
                     % (ckpt, saved.get("preset"), saved.get("seed"), preset, args.seed))
        vq.load_state_dict(saved["vq"])
        lm.load_state_dict(saved["lm"])
        opt_vq.load_state_dict(saved["opt_vq"])
        opt_ar.load_state_dict(saved["opt_ar"])
        if saved.get("det") is not None:
            det = evaluator.Detector(p["side"], p["det_width"]).to(device)
            det.load_state_dict(saved["det"])
            det.eval()
        S.update(saved["S"])
        log("resumed from %s: phase %s (vq step %s, ar step %s)" % (
            ckpt, S["phase"], S.get("vq_step"), S.get("ar_step")))
    elif args.resume:
        log("--resume: no %s yet, starting fresh" % ckpt)

    def checkpoint():
        state = {k: v for k, v in S.items() if k != "checkpoint"}
        save_state(ckpt, {"vq": vq.state_dict(), "lm": lm.state_dict(),
                          "opt_vq": opt_vq.state_dict(), "opt_ar": opt_ar.state_dict(),
                          "det": det.state_dict() if det is not None else None, "S": state,
                          "preset": preset, "seed": args.seed})
        log("checkpoint %s (phase %s)" % (ckpt, S["phase"]))
    S["checkpoint"] = checkpoint

    hard = T0 + budget - 5.0                      # leave time to write the checkpoint
    final_at = T0 + budget - p["reserve_s"]       # when the AR phase should end

    def remaining():
        return final_at - time.time()

    # 1. VQ
    span = max(10.0, final_at - T0)              # time for the three training phases
    if S["phase"] == "vq":
        dl = min(final_at, time.time() + p["frac_vq"] * span)
        _, done = train_vq(vq, opt_vq, S, args, p, device, dl, hard)
        if not done:
            checkpoint()
            log("time limit reached in the vq phase: rerun with --resume")
            sys.exit(3)
        S["phase"] = "evaluator"
        checkpoint()
    vq.eval()
    for q in vq.parameters():
        q.requires_grad_(False)

    # 2. evaluator
    if S["phase"] == "evaluator":
        secs = max(3.0, min(p["frac_eval"] * span, 0.5 * remaining()))
        det = evaluator.train(args.eval_steps, device, args.seed, p["batch_eval"], p["side"],
                              vq=vq, grid=GRID, log=log, seconds=secs, width=p["det_width"],
                              window=p["window"])
        S["phase"] = "ar"
        checkpoint()
    evaluator.save(det, os.path.join(args.out, "evaluator.pt"))

    # 3. AR
    if S["phase"] == "ar":
        _, done = train_ar(lm, opt_ar, vq, tok, S, args, p, device, final_at, hard)
        if not done:
            checkpoint()
            log("time limit reached in the ar phase (step %d of %s): rerun with --resume" % (
                S["ar_step"], S.get("ar_total")))
            sys.exit(3)
        S["phase"] = "final"
        checkpoint()

    # 4. sample, score, export
    rep = None
    if not args.no_sample:
        t = time.time()
        rep = sample_and_score(lm, vq, det, tok, args, p, device, args.out)
        log("PyTorch samples (CFG 5, %d prompts, %.0fs), detector accuracy:" % (
            sum(rep["n"].values()), time.time() - t))
        evaluator.print_report(rep)
    sha, nbytes, tensors = export(args.out, vq, lm, tok, vqc, lmc, S, p)
    parts = part_bytes(tensors)
    check = text.check_with_hf(tok, os.path.join(args.out, "tokenizer.json"),
                                     [shapes.caption(shapes.sample_spec(np.random.default_rng(
                                         [args.seed, 4, i]))) for i in range(500)])
    if check:
        log(check)
    info = {"preset": preset, "seed": args.seed, "torch": torch.__version__,
            "device": str(device), "minutes": args.minutes, "grid": GRID, "side": p["side"],
            "vq_config": vqc, "text_config": lmc, "vq_steps": S.get("vq_total"),
            "eval_steps": args.eval_steps, "ar_steps": S.get("ar_total"),
            "batch": {"vq": p["batch_vq"], "ar": p["batch_ar"], "eval": p["batch_eval"]},
            "vq_mse": S.get("vq_mse"), "vq_codes_used": S.get("vq_used"),
            "ar_losses": S.get("ar_losses"), "sample_report": rep,
            "model_safetensors_sha256": sha, "model_safetensors_bytes": nbytes,
            "part_bytes": parts, "tokenizer_check": check, "wall_s": time.time() - T0,
            "cfg_dropout": P_UNCOND, "prompt_ids_example": tok.prompt_ids("two red circles "
                                                                          "on the left")}
    with open(os.path.join(args.out, "train_info.json"), "w") as f:
        json.dump(info, f, indent=1)
        f.write("\n")
    S["phase"] = "done"
    checkpoint()
    log("exported %s: model.safetensors %d bytes (%s)" % (
        args.out, nbytes, ", ".join("%s %d" % kv for kv in parts.items())))
    log("done in %.1f s" % (time.time() - T0))
    print("sha256(model.safetensors) = %s" % sha, flush=True)


if __name__ == "__main__":
    main()
