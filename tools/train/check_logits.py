#!/usr/bin/env python3
"""
check_logits.py - does flexdiag compute what the PyTorch model computes on an exported folder?

Loads DIR (config.json, model.safetensors, tokenizer.json) into the PyTorch models of models.py
(bf16 weights widened to f32, f32 compute on the CPU) and compares with the flexdiag binary:

  1. score   teacher-forced logits of one caption's prompt (text.py builds the ids as flexdiag
             does) and a 576-token image sequence (sampled from the PyTorch model with CFG 5):
             `flexdiag score --raw` (conditional and unconditional rows) and the CFG-combined
             `flexdiag score`, against the PyTorch KV-cache path and the full-sequence training
             path (forward_train). Relative L2 = ||a - b|| / ||b|| over all logits.
  2. decode  the same grid through `flexdiag decode --raw` and the PyTorch VQ decoder: relative
             L2 and max |difference| of the float pixels, and how many uint8 pixels differ.
  3. prompt  `flexdiag generate --prompt CAPTION --top-k 1` (greedy, flexdiag's own tokenizer,
             template and unconditional row) against PyTorch greedy CFG decoding from our ids:
             the number of identical tokens (equal prompt ids make them identical up to
             near-ties of the argmax).

  python3 tools/train/check_logits.py --model DIR [--flexdiag build/flexdiag] [--gpu]
      [--caption "two red circles on the left"] [--json out.json]
--gpu runs flexdiag on its CUDA engine (bf16 activations: expect ~1e-2 instead of ~1e-5).
Exit status 1 when a comparison fails its tolerance (--tol-logits, --tol-pixels).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
import st  # noqa: E402
import text  # noqa: E402


def load_exported(d, device="cpu"):
    """(lm, vq, tok, config) from an exported folder; weights as stored (bf16 -> f32)."""
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    tc, vc = dict(cfg["text_config"]), dict(cfg["vq_config"])
    tc.setdefault("head_dim", tc["hidden_size"] // tc["num_attention_heads"])
    tc.setdefault("num_key_value_heads", tc["num_attention_heads"])
    if "rope_parameters" in tc and "rope_theta" not in tc:
        tc["rope_theta"] = tc["rope_parameters"]["rope_theta"]
    lm = models.JanusLM(tc, vc)
    vq = models.VQModel(vc)
    w = st.load(os.path.join(d, "model.safetensors"))
    lsd, vsd = {}, {}
    for k, v in w.items():
        if k.startswith("model.language_model."):
            lsd[k[len("model.language_model."):]] = v
        elif k.startswith("model.generation_"):
            lsd[k[len("model."):]] = v
        elif k.startswith("model.vqmodel."):
            vsd[k[len("model.vqmodel."):]] = v
    lm.load_state_dict(lsd, strict=True)
    missing, unexpected = vq.load_state_dict(vsd, strict=False)
    bad = [k for k in missing if not (k.startswith("encoder.") or k.startswith("quant_conv."))]
    if bad or unexpected:
        raise SystemExit("check_logits: VQ tensors missing %s, unexpected %s" % (bad, unexpected))
    tok = text.Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    return lm.to(device).eval(), vq.to(device).eval(), tok, cfg


def sample_scored(lm, tok, caption, n, cfg_weight, seed):
    """(prompt ids, image ids (1, n), CFG logits (1, n, V), raw logits (2, 1, n, V)): one image
    sampled for caption with CFG, then its teacher-forced logits through the KV-cache path."""
    pids = tok.prompt_ids(caption)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        ids = lm.generate([pids], n, cfg_weight=cfg_weight, generator=g, uncond_fn=tok.uncond_ids)
        _, l_cfg, l_raw = lm.generate([pids], n, cfg_weight=cfg_weight, uncond_fn=tok.uncond_ids,
                                      forced=ids, return_logits=True)
    return pids, ids, l_cfg, l_raw


M64 = (1 << 64) - 1


def rng64(seed, a, b):
    """flexdiag__rng64 (base/core.h): two splitmix64 finaliser rounds over (seed, a, b)."""
    x = (seed ^ ((a * 0x9E3779B97F4A7C15) & M64) ^ ((b * 0xD1B54A32D192ED03) & M64)) & M64
    for _ in range(2):
        x = (x + 0x9E3779B97F4A7C15) & M64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
        x ^= x >> 31
    return x


def flexdiag_draw(logits, seed, images, step, temperature=1.0):
    """kernels/cpu/ref_sample.c without top-k/top-p: p = softmax(l / T) (exp in fp32, sum in
    double, p rounded to fp32), u = rng_uniform(seed, image index, step), first id (ascending)
    whose cumulative p (double) exceeds u * sum(p)."""
    out = []
    for row, img in zip(logits.float().numpy(), images):
        lv = (row / np.float32(temperature)).astype(np.float32)
        e = np.exp(lv - lv.max()).astype(np.float32)
        p = (e.astype(np.float64) / e.astype(np.float64).sum()).astype(np.float32)
        cum = np.cumsum(p.astype(np.float64))
        u = (rng64(seed, img, step) >> 11) * (1.0 / 9007199254740992.0)
        hit = np.nonzero(cum > u * cum[-1])[0]
        out.append(int(hit[0]) if len(hit) else len(p) - 1)
    return torch.tensor(out)


def rel_l2(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def find_flexdiag(given):
    if given:
        return given
    here = os.path.dirname(os.path.abspath(__file__))
    for c in [os.path.join(here, "..", "..", "build", "flexdiag"), "/tmp/h18/flexdiag"]:
        if os.path.exists(c):
            return os.path.abspath(c)
    w = shutil.which("flexdiag")
    if w:
        return w
    raise SystemExit("check_logits: no flexdiag binary found: pass --flexdiag PATH")


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise SystemExit("check_logits: %s failed (%d):\n%s%s" % (" ".join(cmd), r.returncode,
                                                                 r.stdout, r.stderr))
    return r


def main():
    ap = argparse.ArgumentParser(description="PyTorch vs flexdiag on an exported model folder")
    ap.add_argument("--model", required=True)
    ap.add_argument("--flexdiag", help="flexdiag binary (default: build/flexdiag, PATH)")
    ap.add_argument("--caption", default="two red circles on the left")
    ap.add_argument("--cfg", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gpu", action="store_true", help="let flexdiag use its GPU engine")
    ap.add_argument("--tol-logits", type=float, default=None,
                    help="max relative L2 of the logits (default 1e-3 CPU, 5e-2 GPU)")
    ap.add_argument("--tol-pixels", type=float, default=None,
                    help="max relative L2 of the decoded pixels (default 1e-3 CPU, 2e-2 GPU)")
    ap.add_argument("--json", help="write the numbers to this file")
    ap.add_argument("--keep", help="keep the intermediate files in this folder")
    a = ap.parse_args()
    tol_l = a.tol_logits or (5e-2 if a.gpu else 1e-3)
    tol_p = a.tol_pixels or (2e-2 if a.gpu else 1e-3)
    fx = find_flexdiag(a.flexdiag)
    dev_flag = [] if a.gpu else ["--cpu"]
    torch.set_num_threads(os.cpu_count() or 1)
    lm, vq, tok, cfg = load_exported(a.model)
    grid = cfg["vq_config"]["num_patches"]
    n = grid * grid
    work = a.keep or tempfile.mkdtemp(prefix="check_logits_")
    os.makedirs(work, exist_ok=True)
    res = {"model": a.model, "caption": a.caption, "flexdiag": fx, "engine": "gpu" if a.gpu
           else "cpu"}
    ok = True

    # ---- 1. score
    pids, ids, l_cfg, l_raw = sample_scored(lm, tok, a.caption, n, a.cfg, a.seed)
    with torch.no_grad():
        # the training path: both rows as one batch, full sequences
        rows = [pids, tok.uncond_ids(pids)]
        txt = torch.tensor(rows)
        lt = lm.forward_train(txt, torch.tensor([len(r) for r in rows]), ids.repeat(2, 1))
    l_cfg, l_raw, lt = l_cfg[0].numpy(), l_raw[:, 0].numpy(), lt.numpy()
    inp = os.path.join(work, "score_input.json")
    with open(inp, "w") as f:
        json.dump({"prompt_ids": pids, "image_ids": ids[0].tolist(), "cfg_weight": a.cfg}, f)
    raw_npy, cfg_npy = os.path.join(work, "raw.npy"), os.path.join(work, "cfg.npy")
    run([fx, "score", "--model", a.model, "--input", inp, "--out", raw_npy, "--raw"] + dev_flag)
    run([fx, "score", "--model", a.model, "--input", inp, "--out", cfg_npy] + dev_flag)
    f_raw, f_cfg = np.load(raw_npy), np.load(cfg_npy)
    sc = {"prompt_ids": pids, "n_tokens": n,
          "rel_l2_cond": rel_l2(f_raw[0], l_raw[0]), "rel_l2_uncond": rel_l2(f_raw[1], l_raw[1]),
          "rel_l2_cfg": rel_l2(f_cfg, l_cfg),
          "max_abs_cfg": float(np.abs(f_cfg - l_cfg).max()),
          "argmax_agree_cfg": float((f_cfg.argmax(-1) == l_cfg.argmax(-1)).mean()),
          "rel_l2_pytorch_cache_vs_full_sequence": rel_l2(l_raw, lt)}
    res["score"] = sc
    print("score: prompt %d ids %s" % (len(pids), pids))
    print("score: rel L2 flexdiag vs PyTorch: cond %.3e, uncond %.3e, CFG %.3e (max |d| %.3e, "
          "argmax agreement %.4f); PyTorch KV cache vs full sequence %.3e" % (
              sc["rel_l2_cond"], sc["rel_l2_uncond"], sc["rel_l2_cfg"], sc["max_abs_cfg"],
              sc["argmax_agree_cfg"], sc["rel_l2_pytorch_cache_vs_full_sequence"]))
    ok &= max(sc["rel_l2_cond"], sc["rel_l2_uncond"], sc["rel_l2_cfg"]) < tol_l

    # ---- 2. decode
    tk = os.path.join(work, "tokens.npy")
    np.save(tk, ids.numpy().astype(np.int64))
    pix_npy = os.path.join(work, "pixels.npy")
    run([fx, "decode", "--model", a.model, "--tokens", tk, "--out", os.path.join(work, "dec"),
         "--raw", pix_npy] + dev_flag)
    f_pix = np.load(pix_npy)[0]
    with torch.no_grad():
        t_pix = vq.decode_ids(ids, grid)[0].permute(1, 2, 0).numpy()
    to8 = lambda x: np.clip((x.astype(np.float32) + 1) / 2 * 255, 0, 255).astype(np.uint8)
    dc = {"rel_l2": rel_l2(f_pix, t_pix), "max_abs": float(np.abs(f_pix - t_pix).max()),
          "uint8_pixels_differing": int((to8(f_pix) != to8(t_pix)).sum()),
          "uint8_values": int(f_pix.size)}
    res["decode"] = dc
    print("decode: rel L2 flexdiag vs PyTorch %.3e, max |d| %.3e, %d of %d uint8 values differ"
          % (dc["rel_l2"], dc["max_abs"], dc["uint8_pixels_differing"], dc["uint8_values"]))
    ok &= dc["rel_l2"] < tol_p

    # ---- 3. prompt path: greedy generation from the caption text
    gen = os.path.join(work, "greedy")
    run([fx, "generate", "--model", a.model, "--prompt", a.caption, "--top-k", "1",
         "--images-per-prompt", "1", "--batch", "1", "--cfg", str(a.cfg), "--out", gen,
         "--quiet"] + dev_flag)
    with open(os.path.join(gen, "tokens.json")) as f:
        f_ids = np.array(json.load(f)["images"][0]["grid"]).reshape(-1)
    with torch.no_grad():
        t_ids = lm.generate([pids], n, cfg_weight=a.cfg, top_k=1,
                            uncond_fn=tok.uncond_ids)[0].numpy()
    same = f_ids == t_ids
    first = int(np.argmin(same)) if not same.all() else n
    gr = {"identical_tokens": int(same.sum()), "tokens": n, "identical_prefix": first}
    res["greedy"] = gr
    print("prompt path: flexdiag greedy from the caption text vs PyTorch greedy from our ids: "
          "%d of %d tokens identical, identical prefix %d" % (gr["identical_tokens"], n, first))
    ok &= first >= min(n, 32)

    # ---- 4. prompt path with sampling: flexdiag's draws replayed in PyTorch
    gen = os.path.join(work, "sampled")
    run([fx, "generate", "--model", a.model, "--prompt", a.caption, "--images-per-prompt", "2",
         "--batch", "2", "--cfg", str(a.cfg), "--sample-seed", str(a.seed + 7), "--out", gen,
         "--quiet"] + dev_flag)
    with open(os.path.join(gen, "tokens.json")) as f:
        imgs = json.load(f)["images"]
    f_ids = np.array([np.array(im["grid"]).reshape(-1) for im in imgs])
    with torch.no_grad():
        t_ids = lm.generate([pids, pids], n, cfg_weight=a.cfg, uncond_fn=tok.uncond_ids,
                            sample_fn=lambda l, t: flexdiag_draw(l, a.seed + 7, [0, 1], t)
                            ).numpy()
    same = f_ids == t_ids
    pref = [int(np.argmin(s)) if not s.all() else n for s in same]
    sm = {"identical_tokens": int(same.sum()), "tokens": int(same.size),
          "identical_prefix": pref, "distinct_ids": int(len(np.unique(f_ids)))}
    res["sampled"] = sm
    print("prompt path: flexdiag sampling (seed %d) from the caption text vs PyTorch with "
          "flexdiag's draws from our ids: %d of %d tokens identical, identical prefixes %s "
          "(%d distinct ids)" % (a.seed + 7, sm["identical_tokens"], sm["tokens"], pref,
                                 sm["distinct_ids"]))
    ok &= min(pref) >= min(n, 32)
    res["ok"] = bool(ok)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    print("check_logits: %s" % ("OK" if ok else "FAILED"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
