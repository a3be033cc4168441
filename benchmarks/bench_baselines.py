"""Our greedy loop against transformers' generate, and traced against untraced.

    python benchmarks/bench_baselines.py [--target smollm2-135m-instruct] [--repeats 5]
        [--max-new-tokens 64] [--json benchmarks/results/baselines-cpu.json]

Everything runs in one process, interleaved, after a warm-up; each figure is the
median over repeats and prompts. Prints:
  ours/generate  = our greedy tok/s / generate greedy tok/s      (goal >= 1.0)
  traced/untraced = our traced greedy time / untraced time        (goal <= 1.03)
and checks that all three produce the same tokens.
"""

from __future__ import annotations

import argparse

from common import generate_new_tokens, median, timed, write_json

from decoding.baselines import greedy
from decoding.models import load_model
from decoding.params import GreedyParams
from decoding.result import ModelPair
from decoding.runner import encode_prompt, environment
from decoding.tracer import NULL_TRACER, Tracer

PROMPTS = [
    "Explain in a short paragraph why the sky looks blue.",
    "Write a Python function that checks whether a number is prime.",
    "Give me three tips for writing clear emails.",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    lm = load_model(args.target, device=args.device, dtype=args.dtype)
    pair, n = ModelPair(lm), args.max_new_tokens
    prompts = [encode_prompt(lm.tokenizer, p, chat=lm.chat) for p in PROMPTS]
    runners = {
        "ours": lambda ids: greedy(ids, pair, GreedyParams(), max_new_tokens=n, tracer=NULL_TRACER).token_ids,
        "ours_traced": lambda ids: greedy(ids, pair, GreedyParams(), max_new_tokens=n, tracer=Tracer()).token_ids,
        "generate": lambda ids: generate_new_tokens(lm, ids, max_new_tokens=n, do_sample=False),
    }
    for ids in prompts:  # warm-up
        for run in runners.values():
            run(ids)
    per_prompt = []
    for p_index, ids in enumerate(prompts):
        times: dict[str, list[float]] = {k: [] for k in runners}
        tokens: dict[str, list[int]] = {}
        for _ in range(args.repeats):
            for name, run in runners.items():  # interleaved
                tokens[name], seconds = timed(lambda: run(ids), lm.device)
                times[name].append(seconds)
        n_tok = len(tokens["ours"])
        row = {"prompt": PROMPTS[p_index], "tokens": n_tok,
               "identical": tokens["ours"] == tokens["generate"] == tokens["ours_traced"]}
        for name in runners:
            row[f"{name}_s"] = median(times[name])
            row[f"{name}_tok_s"] = n_tok / row[f"{name}_s"]
        row["ours_over_generate"] = row["ours_tok_s"] / row["generate_tok_s"]
        row["traced_over_untraced"] = row["ours_traced_s"] / row["ours_s"]
        per_prompt.append(row)
        print(f"prompt {p_index}: {n_tok} tok  ours {row['ours_tok_s']:.1f} tok/s  "
              f"generate {row['generate_tok_s']:.1f} tok/s  ours/generate {row['ours_over_generate']:.3f}  "
              f"traced/untraced {row['traced_over_untraced']:.3f}  identical={row['identical']}")
    summary = {
        "ours_over_generate": median([r["ours_over_generate"] for r in per_prompt]),
        "traced_over_untraced": median([r["traced_over_untraced"] for r in per_prompt]),
        "all_identical": all(r["identical"] for r in per_prompt),
    }
    print(f"\nmedian over prompts: ours/generate = {summary['ours_over_generate']:.3f} (goal >= 1.0), "
          f"traced/untraced = {summary['traced_over_untraced']:.3f} (goal <= 1.03), "
          f"identical = {summary['all_identical']}")
    write_json(args.json, {"benchmark": "baselines", "args": vars(args),
                           "environment": environment(pair, 0), "prompts": per_prompt, "summary": summary})


if __name__ == "__main__":
    main()
