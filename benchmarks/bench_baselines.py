"""Our greedy loop against transformers' generate, and traced against untraced.

    python benchmarks/bench_baselines.py [--target smollm2-135m-instruct] [--repeats 5]
        [--max-new-tokens 64] [--json benchmarks/results/baselines-cpu.json]

Two copies of the same weights are loaded: one as the app loads it (CPU linear
kernels chosen per bucket of row counts on this machine, decoding/runtime/kernels.py),
one with transformers' default kernels (``kernels="default"``), which is what a
plain ``generate`` user runs. Everything runs in one process, interleaved,
after a warm-up; each figure is the median over repeats, then over prompts.
Prints:
  ours/generate          = our greedy tok/s (chosen kernels) / generate tok/s (default kernels)  (goal >= 1.0)
  loop: ours/generate    = both on the default-kernel model: our loop's own overhead             (goal ~ 1.0)
  traced/untraced        = our traced greedy time / untraced time                                 (goal <= 1.03)
Our greedy on default kernels must give generate's tokens exactly; on the chosen
kernels the logits differ by about 1e-4 (summation order), so the tokens are
compared and reported.
"""

from __future__ import annotations

import argparse

import torch

from common import generate_new_tokens, median, remeasure_kernels, timed, write_json  # first: it puts the repository root on sys.path

from decoding.harness.runner import encode_prompt, environment
from decoding.params import GreedyParams
from decoding.runtime.kernel_choice import REPEATS
from decoding.runtime.models import load_model
from decoding.runtime.pair import ModelPair
from decoding.strategies.baselines import greedy
from decoding.tracer import NULL_TRACER, Tracer

PROMPTS = [
    "Explain in a short paragraph why the sky looks blue.",
    "Write a Python function that checks whether a number is prime.",
    "Give me three tips for writing clear emails.",
]


def runners(chosen, plain, n: int) -> dict:
    """name -> function(prompt ids) -> new token ids."""
    ours, ours_plain = ModelPair(chosen), ModelPair(plain)
    return {
        "ours": lambda ids: greedy(ids, ours, GreedyParams(), max_new_tokens=n, tracer=NULL_TRACER).token_ids,
        "ours_traced": lambda ids: greedy(ids, ours, GreedyParams(), max_new_tokens=n, tracer=Tracer()).token_ids,
        "ours_default_kernels": lambda ids: greedy(ids, ours_plain, GreedyParams(), max_new_tokens=n,
                                                   tracer=NULL_TRACER).token_ids,
        "generate": lambda ids: generate_new_tokens(plain, ids, max_new_tokens=n),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=len(PROMPTS), help="how many of the prompts to run")
    ap.add_argument("--kernels", default="auto", choices=("auto", "packed", "default"),
                    help="kernels of our greedy's model (generate always runs transformers' default kernels)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    ap.add_argument("--remeasure", action="store_true",
                    help="time the CPU kernels again for our model's choice and replace the cached decision")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)     # part of the kernel choice's cache key

    chosen = load_model(args.target, device=args.device, dtype=args.dtype, kernels=args.kernels)
    if args.remeasure and args.kernels == "auto":
        remeasure_kernels(chosen, args.target, REPEATS)
    plain = load_model(args.target, device=args.device, dtype=args.dtype, kernels="default")
    env = environment(ModelPair(chosen), 0)
    print(f"CPU: {env.get('cpu', env['processor'])}, {env['threads']} torch threads; our kernels: "
          f"{chosen.kernels}; generate's: {plain.kernels}")
    texts = PROMPTS[: args.prompts]
    prompts = [encode_prompt(chosen.tokenizer, p, chat=chosen.chat) for p in texts]
    runs = runners(chosen, plain, args.max_new_tokens)
    for ids in prompts:  # warm-up
        for run in runs.values():
            run(ids)
    per_prompt = []
    for p_index, ids in enumerate(prompts):
        times: dict[str, list[float]] = {k: [] for k in runs}
        tokens: dict[str, list[int]] = {}
        for rep in range(args.repeats):
            names = list(runs)[rep % len(runs):] + list(runs)[:rep % len(runs)]
            for name in names:  # interleaved, the order rotating
                tokens[name], seconds = timed(lambda: runs[name](ids), chosen.device)
                times[name].append(seconds)
        n_tok = len(tokens["ours"])
        row = {"prompt": texts[p_index], "tokens": n_tok,
               "identical": tokens["ours"] == tokens["generate"] == tokens["ours_traced"],
               "identical_on_default_kernels": tokens["ours_default_kernels"] == tokens["generate"]}
        for name in runs:
            row[f"{name}_s"] = median(times[name])
            row[f"{name}_tok_s"] = len(tokens[name]) / row[f"{name}_s"]
        row["ours_over_generate"] = row["ours_tok_s"] / row["generate_tok_s"]
        row["loop_ours_over_generate"] = row["ours_default_kernels_tok_s"] / row["generate_tok_s"]
        row["traced_over_untraced"] = row["ours_traced_s"] / row["ours_s"]
        per_prompt.append(row)
        print(f"prompt {p_index}: {n_tok} tok  ours {row['ours_tok_s']:.1f} tok/s  generate "
              f"{row['generate_tok_s']:.1f} tok/s  ours/generate {row['ours_over_generate']:.3f}  "
              f"loop {row['loop_ours_over_generate']:.3f}  traced/untraced {row['traced_over_untraced']:.3f}  "
              f"identical={row['identical']} (default kernels: {row['identical_on_default_kernels']})")
    summary = {key: median([r[key] for r in per_prompt])
               for key in ("ours_over_generate", "loop_ours_over_generate", "traced_over_untraced")}
    summary["all_identical"] = all(r["identical"] for r in per_prompt)
    summary["all_identical_on_default_kernels"] = all(r["identical_on_default_kernels"] for r in per_prompt)
    print(f"\nmedian over prompts: ours/generate = {summary['ours_over_generate']:.3f} (goal >= 1.0), "
          f"loop ours/generate = {summary['loop_ours_over_generate']:.3f}, "
          f"traced/untraced = {summary['traced_over_untraced']:.3f} (goal <= 1.03), "
          f"identical = {summary['all_identical']} (default kernels: {summary['all_identical_on_default_kernels']})")
    write_json(args.json, {"benchmark": "baselines", "args": vars(args), "environment": env,
                           "generate_model": plain.describe(), "prompts": per_prompt, "summary": summary})


if __name__ == "__main__":
    main()
