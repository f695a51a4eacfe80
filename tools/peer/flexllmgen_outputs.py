"""Greedy outputs of flexdiag and FlexLLMGen on one small random OPT, against transformers.

FlexLLMGen (FMInference/FlexLLMGen, an unmodified copy given by --flexllmgen) keeps one CPU
attention workspace and, in its multi-micro-batch loop, fills it with the next micro-batch's
KV before the current one attends, so with the KV on the CPU, CPU attention and two or more
micro-batches a sequence can attend another sequence's history. This script shows what that
does to the tokens, beside flexdiag's runs of the same configuration:

  1. makes a random OPT (seeded; weights scaled so every sublayer moves the residual stream by
     O(1) and the greedy token is decided by the history, not by near-ties), saves it for
     flexdiag (config.json + bf16 safetensors + the tokenizer given by --tokenizer) and for
     FlexLLMGen (one .npy per tensor, fp16, FlexLLMGen's names);
  2. the reference: transformers in fp32 on the same (bf16-rounded) weights, each prompt alone,
     greedy, --gen-len tokens;
  3. FlexLLMGen runs (one process each): KV on GPU with 2 micro-batches, KV on CPU with CPU
     attention and 1 micro-batch, the same with 2 micro-batches;
  4. flexdiag runs (`flexdiag generate`, greedy): all on the GPU; KV on pinned CPU in 2
     micro-batches with GPU attention over the streamed rows; the same with --cpu-attention;
  5. per run: sequences whose tokens equal the reference up to its first EOS, the mean length
     of the agreeing prefix, and sequences equal to the same system's first run (its all-GPU
     configuration: same arithmetic, so only a different history changes a token). Prints a
     table, writes --json.

    python3 tools/peer/flexllmgen_outputs.py --flexllmgen PEER_DIR --flexdiag build/flexdiag \
        --tokenizer tests/golden/data/opt --work /tmp/fgo --json out.json

Needs torch with CUDA, transformers, numpy (FlexLLMGen's own requirements)."""
import argparse, json, os, shutil, subprocess, sys

import numpy as np
import torch

EOS, PAD, BOS = 2, 1, 2
PROMPTS = ["The lighthouse keeper wrote a letter", "Once upon a time, in a quiet village",
           "A short note on trains", "Rain fell on the old stone bridge all night long",
           "Seven", "Tomorrow we will plant the garden, said the teacher to the class",
           "Numbers: 3, 14, 15, 92", "Under the sea"]


def opt_config(a):
    from transformers import OPTConfig
    return OPTConfig(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
                     ffn_dim=a.ffn, num_attention_heads=a.heads, max_position_embeddings=2048,
                     word_embed_proj_dim=a.hidden, do_layer_norm_before=True, pad_token_id=PAD,
                     bos_token_id=BOS, eos_token_id=EOS, tie_word_embeddings=True,
                     enable_bias=True, activation_function="relu", dropout=0.0,
                     attention_dropout=0.0)


def init_weights(model, seed):
    """Token embeddings N(0, 0.25²) (tied to the output: small, so the current token does not
    dominate the logits), positions N(0, 0.5²), linear weights N(0, 1/in), biases N(0, 0.02),
    layer norms 1 + N(0, 0.1) / N(0, 0.1); every value rounded to bf16, the format flexdiag
    reads, so all three systems start from the same numbers."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if "embed_tokens" in name:
                v = 0.25 * r
            elif "embed_positions" in name:
                v = 0.5 * r
            elif "layer_norm" in name:
                v = (1.0 + 0.1 * r) if name.endswith("weight") else 0.1 * r
            elif name.endswith("weight"):
                v = r / p.shape[1] ** 0.5
            else:
                v = 0.02 * r
            p.copy_(v.bfloat16().float())


def make_model(a):
    from transformers import OPTForCausalLM
    model = OPTForCausalLM(opt_config(a)).eval()
    init_weights(model, a.seed)
    hf = os.path.join(a.work, "hf")
    model.to(torch.bfloat16).save_pretrained(hf)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(a.tokenizer, f), hf)
    npd = os.path.join(a.work, "fg", "opt-peer-np")
    os.makedirs(npd, exist_ok=True)
    for name, t in model.model.state_dict().items():
        name = name.replace("decoder.final_layer_norm", "decoder.layer_norm")
        with open(os.path.join(npd, name), "wb") as f:
            np.save(f, t.float().numpy().astype(np.float16))
    shutil.copy(os.path.join(npd, "decoder.embed_tokens.weight"),
                os.path.join(npd, "lm_head.weight"))
    return model.float(), hf


def prompt_ids(a):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    return [[BOS] + tok.encode(p, add_special_tokens=False) for p in PROMPTS]


def reference(model, ids, n):
    out = []
    with torch.no_grad():
        for row in ids:
            x = torch.tensor([row])
            for _ in range(n):
                nxt = model(input_ids=x).logits[0, -1].argmax()
                x = torch.cat([x, nxt.view(1, 1)], dim=1)
            out.append(x[0, len(row):].tolist())
    return out


# ---- FlexLLMGen, one configuration per process ----

FG_RUNS = {  # name: (percent wg wc cg cc hg hc, micro-batches, cpu_cache_compute)
    "FlexLLMGen, KV on GPU, 2 micro-batches": ([100, 0, 100, 0, 100, 0], 2, False),
    "FlexLLMGen, KV on CPU, CPU attention, 1 micro-batch": ([100, 0, 0, 100, 100, 0], 1, True),
    "FlexLLMGen, KV on CPU, CPU attention, 2 micro-batches": ([100, 0, 0, 100, 100, 0], 2, True),
}


def fg_run(a, name, ids):
    sys.path.insert(0, a.flexllmgen)
    import flexllmgen.flex_opt as fo
    from flexllmgen.compression import CompressionConfig
    from flexllmgen.opt_config import OptConfig
    from flexllmgen.pytorch_backend import TorchDevice, TorchDisk, TorchMixedDevice
    from flexllmgen.utils import ExecutionEnv
    pct, ngb, cpu_attn = FG_RUNS[name]
    cfg = OptConfig(name="opt-peer", num_hidden_layers=a.layers, max_seq_len=2048,
                    hidden_size=a.hidden, n_head=a.heads, input_dim=a.hidden, ffn_embed_dim=a.ffn,
                    vocab_size=a.vocab)
    gpu, cpu = TorchDevice("cuda:0"), TorchDevice("cpu")
    os.makedirs(os.path.join(a.work, "fg_offload"), exist_ok=True)
    disk = TorchDisk(os.path.join(a.work, "fg_offload"))
    env = ExecutionEnv(gpu=gpu, cpu=cpu, disk=disk, mixed=TorchMixedDevice([gpu, cpu, disk]))
    comp = CompressionConfig(num_bits=4, group_size=64, group_dim=0, symmetric=False)
    policy = fo.Policy(len(ids) // ngb, ngb, *pct, True, True, True, cpu_attn, 1.0, False, comp,
                       False, comp)
    width = max(len(r) for r in ids)
    inputs = [[PAD] * (width - len(r)) + r for r in ids]  # left padding, as FlexLLMGen pads
    try:
        model = fo.OptLM(cfg, env, os.path.join(a.work, "fg"), policy)
        out = model.generate(inputs, max_new_tokens=a.gen_len)
    finally:
        env.close_copy_threads()
    return [row[width:].tolist() for row in out]


# ---- flexdiag ----

FD_RUNS = {  # name: extra flags
    "flexdiag, all on the GPU": ["--batch", "8"],
    "flexdiag, KV on CPU, GPU attention, 2 micro-batches":
        ["--batch", "8", "--micro-batch", "4", "--kv", "0,100,0"],
    "flexdiag, KV on CPU, CPU attention, 2 micro-batches":
        ["--batch", "8", "--micro-batch", "4", "--kv", "0,100,0", "--cpu-attention"],
}


def fd_run(a, name, hf):
    out = os.path.join(a.work, "fd_" + str(list(FD_RUNS).index(name)))
    shutil.rmtree(out, ignore_errors=True)
    pf = os.path.join(a.work, "prompts.txt")
    with open(pf, "w") as f:
        f.write("\n".join(PROMPTS) + "\n")
    cmd = [a.flexdiag, "generate", "--model", hf, "--prompts", pf, "--images-per-prompt", "1",
           "--max-new-tokens", str(a.gen_len), "--top-k", "1", "--out", out, "--quiet"]
    subprocess.run(cmd + FD_RUNS[name], check=True, stdout=subprocess.DEVNULL)
    recs = [json.loads(l) for l in open(os.path.join(out, "results.jsonl"))]
    recs.sort(key=lambda r: r["image_index"])
    return [r["ids"] for r in recs]


# ---- comparison ----

def until_eos(row):
    return row[:row.index(EOS)] if EOS in row else row


def agreement(ref, got):
    exact, prefix = 0, 0
    for r, g in zip(ref, got):
        r, g = until_eos(r), until_eos(g)
        exact += r == g
        n = 0
        while n < min(len(r), len(g)) and r[n] == g[n]:
            n += 1
        prefix += n
    return exact, prefix / len(ref)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--flexllmgen", required=True, help="folder holding the flexllmgen package")
    p.add_argument("--flexdiag", required=True, help="the flexdiag executable")
    p.add_argument("--tokenizer", required=True, help="folder with an OPT tokenizer.json")
    p.add_argument("--work", default="/tmp/flexllmgen_outputs")
    p.add_argument("--json")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=320)
    p.add_argument("--gen-len", type=int, default=24)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fg-run", help=argparse.SUPPRESS)  # one FlexLLMGen run (child process)
    a = p.parse_args()
    ids = json.load(open(os.path.join(a.work, "ids.json"))) if a.fg_run else None
    if a.fg_run:
        json.dump(fg_run(a, a.fg_run, ids), open(os.path.join(a.work, "fg_out.json"), "w"))
        return
    os.makedirs(a.work, exist_ok=True)
    model, hf = make_model(a)
    ids = prompt_ids(a)
    json.dump(ids, open(os.path.join(a.work, "ids.json"), "w"))
    ref = reference(model, ids, a.gen_len)
    runs = {}
    for name in FG_RUNS:
        subprocess.run([sys.executable, os.path.abspath(__file__), "--fg-run", name] +
                       [x for x in sys.argv[1:]], check=True, stdout=subprocess.DEVNULL)
        runs[name] = json.load(open(os.path.join(a.work, "fg_out.json")))
    for name in FD_RUNS:
        runs[name] = fd_run(a, name, hf)
    rows = []
    print(f"| run | equal to the reference (of {len(ids)}) | mean agreeing prefix (of "
          f"{a.gen_len}) | equal to the system's all-GPU run |\n|---|---:|---:|---:|")
    for name, got in runs.items():
        exact, prefix = agreement(ref, got)
        own = runs[list(FG_RUNS)[0] if name in FG_RUNS else list(FD_RUNS)[0]]
        same = agreement(own, got)[0]
        rows.append({"run": name, "exact": exact, "prefix": prefix, "same_as_all_gpu": same,
                     "tokens": got})
        print(f"| {name} | {exact} | {prefix:.1f} | {same} |")
    if a.json:
        json.dump({"reference": ref, "prompt_ids": ids, "runs": rows}, open(a.json, "w"))


if __name__ == "__main__":
    main()
