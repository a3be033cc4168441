"""Relaxed acceptance on the unseen prompts: what ``lenient`` and ``typical`` gain and what they cost.

    python benchmarks/bench_relaxed.py                       # prophet and prompt lookup, every acceptance
    python benchmarks/bench_relaxed.py --strategy prophet --acceptance exact --acceptance typical:posterior_alpha=0.5
    python benchmarks/bench_relaxed.py --per-category 2 --max-new-tokens 32     # a quick look

For every prompt of presets/bench_unseen.yaml (chat template on), greedy runs once, then each (strategy,
acceptance) at its default thresholds (or ``NAME:KEY=V,...``), untraced, at temperature 0. Printed per prompt
and per category: tokens per target forward (deterministic), tokens that differ from greedy's and the first
differing position (``harness/cost.py``: a position differs when the tokens there differ or only one output
reaches it), and the speed-up against greedy from one timed run each (noisy on a shared machine: the counts are
the claim, the times are not). The machine is named in the output and the JSON.
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import add_prompt_args, add_run_args, by_category, keyvals, print_finish, start, write_json  # first: repository root on sys.path
from decoding.harness.cost import differing_tokens, first_divergence  # noqa: E402
from decoding.harness.runner import encode_prompt, run_one  # noqa: E402
from decoding.runtime.head import prophet_for  # noqa: E402
from decoding.runtime.pair import ModelPair  # noqa: E402
from decoding.strategies import get_strategy  # noqa: E402


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_prompt_args(p)
    p.add_argument("--strategy", action="append", help="prophet, prompt_lookup, ... (default: those two)")
    p.add_argument("--acceptance", action="append", metavar="NAME[:KEY=V,...]",
                   help="exact, lenient, typical, with parameters (default: the three at their defaults)")
    add_run_args(p)
    return p.parse_args(argv)


def _methods(args: argparse.Namespace) -> dict[str, tuple]:
    """``"strategy/acceptance"`` -> (strategy, parsed params)."""
    methods = {}
    for sname in args.strategy or ["prophet", "prompt_lookup"]:
        strategy = get_strategy(sname)
        for spec in args.acceptance or ["exact", "lenient", "typical"]:
            name, _, rest = spec.partition(":")
            methods[f"{sname}/{spec}"] = (strategy, strategy.parse({"acceptance": name, **keyvals(rest)}))
    return methods


def summarize(rows: list[dict], methods: list[str]) -> list[dict]:
    out = []
    for cat, rs in by_category(rows):
        for m in methods:
            vals = [r["methods"][m] for r in rs]
            firsts = [v["first_difference"] for v in vals if v["first_difference"] is not None]
            out.append({"category": cat, "method": m, "prompts": len(rs),
                        "tokens_per_forward": statistics.fmean(v["tokens_per_forward"] for v in vals),
                        "differing": statistics.fmean(v["differing"] for v in vals),
                        "tokens": statistics.fmean(v["tokens"] for v in vals),
                        "identical": sum(v["differing"] == 0 for v in vals),
                        "median_first_difference": statistics.median(firsts) if firsts else None,
                        "speedup": statistics.geometric_mean(v["speedup"] for v in vals)})
    return out


def _print_summary(summary: list[dict]) -> None:
    print("| category | method | tokens / target forward | tokens differing from greedy (mean) | "
          "identical to greedy | median first difference | speed-up vs greedy (geomean, noisy) |")
    print("|---|---|---|---|---|---|---|")
    for s in summary:
        first = "–" if s["median_first_difference"] is None else f"{s['median_first_difference']:g}"
        print(f"| {s['category']} ({s['prompts']}) | {s['method']} | {s['tokens_per_forward']:.3f} | "
              f"{s['differing']:.1f} of {s['tokens']:.0f} | {s['identical']}/{s['prompts']} | {first} | "
              f"{s['speedup']:.2f} |")


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    target, machine, prompts = start(args)
    greedy, g_params = get_strategy("greedy"), get_strategy("greedy").parse({})
    methods = _methods(args)
    # the head only where a method drafts with it: prompt lookup alone runs on a target that ships none
    head = any(strategy.name == "prophet" for strategy, _ in methods.values())
    pair = ModelPair(target, None, prophet=prophet_for(target) if head else None)

    def timed(strategy, params, ids, n=args.max_new_tokens):
        return run_one(strategy, params, ids, pair, max_new_tokens=n, trace=False)
    warm = encode_prompt(target.tokenizer, prompts[0][1], chat=True)              # 1. warm-up, untimed
    timed(greedy, g_params, warm, 16)
    for strategy, params in methods.values():
        timed(strategy, params, warm, 16)
    rows, t_start = [], time.time()
    for i, (cat, text) in enumerate(prompts):                                     # 2. one run each
        ids = encode_prompt(target.tokenizer, text, chat=True)
        ref, g_s, _ = timed(greedy, g_params, ids)
        row = {"category": cat, "prompt": text[:80], "tokens": len(ref.token_ids), "methods": {}}
        for m, (strategy, params) in methods.items():
            res, seconds, _ = timed(strategy, params, ids)
            row["methods"][m] = {
                "tokens": len(res.token_ids), "tokens_per_forward": len(res.token_ids) / max(1, res.target_forwards),
                "differing": differing_tokens(res.token_ids, ref.token_ids),
                "first_difference": first_divergence(res.token_ids, ref.token_ids),
                "speedup": (g_s / max(1, len(ref.token_ids))) / (seconds / max(1, len(res.token_ids)))}
        rows.append(row)
        print(f"{i:2d} {cat:10s} " + " ".join(f"{m}:{v['tokens_per_forward']:.2f}/{v['differing']}"
                                              for m, v in row["methods"].items()), flush=True)
    summary = summarize(rows, list(methods))
    print_finish(machine, len(prompts), args.max_new_tokens, t_start)
    _print_summary(summary)
    doc = {"machine": machine, "target": args.target, "prompts_file": str(args.prompts),
           "max_new_tokens": args.max_new_tokens, "methods": {m: dict(vars(p)) for m, (_, p) in methods.items()},
           "rows": rows, "summary": summary}
    write_json(args.json, doc)
    return doc


if __name__ == "__main__":
    main()
