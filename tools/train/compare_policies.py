#!/usr/bin/env python3
"""Teacher-forced fidelity of every KV policy on a trained model, averaged over a prompt set.

For each prompt of the evaluation set (`prompts.py`, --per-category prompts of each of its seven
categories) it runs `flexdiag bench fidelity --model M --prompt P` for all eight policies at the
given sparsities: flexdiag samples the dense image of that prompt, then replays its 576 tokens
under each policy and reports the attention-output error, the KL of the next-token distribution
against dense and the top-1 agreement. This script averages them per (policy, sparsity) and
prints one markdown table, ranked by KL within each sparsity; --json keeps every row.

  python3 tools/train/compare_policies.py --model models/shapes-janus --flexdiag build/flexdiag
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prompts  # noqa: E402

POLICIES = "dense,window,streaming,h2o,tova,alisa,diagonal,diagonal-sink4"  # line-ar, ssd, hack: --policies


def fidelity_rows(args, prompt):
    with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as f:
        path = f.name
    try:
        cmd = [args.flexdiag, "bench", "fidelity", "--model", args.model, "--prompt", prompt,
               "--policies", args.policies, "--sparsities", args.sparsities, "--seed", str(args.seed),
               "--json", path]
        if args.cpu:
            cmd.append("--cpu")
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        if args.calib:
            cmd += ["--calib", args.calib]
        if args.ssd_tau is not None:
            cmd += ["--ssd-tau", str(args.ssd_tau)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    finally:
        os.unlink(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--flexdiag", default="build/flexdiag")
    ap.add_argument("--sparsities", default="0.9,0.95,0.97")
    ap.add_argument("--policies", default=POLICIES,
                    help="comma list; line-ar needs N_att >= 4 + 2 lines (Janus: sparsity <= 0.90); "
                         "ssd and hack need --calib")
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1, help="the dense images' sampling seed")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", help="write every row (one per prompt, policy, sparsity) here")
    ap.add_argument("--calib", help="the model's calibration table, for ssd and hack "
                                    "(flexdiag-bench calibrate --model M --prompts F --out FILE)")
    ap.add_argument("--ssd-tau", type=float, help="ssd's typing threshold (default 0.5)")
    args = ap.parse_args()

    recs = prompts.build(per_category=args.per_category, seed=0)
    seen, plist = set(), []
    for r in recs:
        if r["prompt"] not in seen:
            seen.add(r["prompt"])
            plist.append(r["prompt"])
    rows = []
    out = open(args.json, "w") if args.json else None
    for i, p in enumerate(plist):
        print(f"[{i + 1}/{len(plist)}] {p}", file=sys.stderr, flush=True)
        for row in fidelity_rows(args, p):
            if row.get("mode") == "model" and row["policy"] != "dense":
                row["prompt_text"] = p
                rows.append(row)
                if out:  # written as they come: a run cut short keeps what it measured
                    out.write(json.dumps(row) + "\n")
                    out.flush()
    if out:
        out.close()
    groups = {}
    for r in rows:
        groups.setdefault((r["sparsity"], r["policy"]), []).append(r)
    print(f"{len(plist)} prompts, {len(rows)} rows; model {args.model}; mean over prompts\n")
    print("| sparsity | policy | N_att | attn_err | KL | top-1 |")
    print("|---:|---|---:|---:|---:|---:|")
    for s in sorted({k[0] for k in groups}):
        ranked = sorted(((k[1], v) for k, v in groups.items() if k[0] == s),
                        key=lambda kv: sum(r["kl"] for r in kv[1]) / len(kv[1]))
        for pol, v in ranked:
            n = len(v)
            print(f"| {s} | {pol} | {v[0]['n_att']} | {sum(r['attn_err'] for r in v) / n:.4f} | "
                  f"{sum(r['kl'] for r in v) / n:.4f} | {sum(r['top1'] for r in v) / n:.4f} |")


if __name__ == "__main__":
    main()
