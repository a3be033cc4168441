"""The prophet on prompts this project did not write (presets/bench_unseen.yaml), against greedy, in one process.

    python benchmarks/bench_unseen.py                                 # the shipped head, defaults
    python benchmarks/bench_unseen.py --head old:OLD.safetensors --head new:NEW.safetensors
    python benchmarks/bench_unseen.py --variant fixed8:tree_nodes=8   # parameter variants of each head
    python benchmarks/bench_unseen.py --variant defaults: --variant measured:budget=measured
                                      # the fixed node budget against the one from the measured forward costs
    python benchmarks/bench_unseen.py --target smollm2-135m-instruct-fp16w --baseline smollm2-135m-instruct
                                      # the float16-weight model against its own greedy, and against float32's
    python benchmarks/bench_unseen.py --device cuda --dtype float32 --fast --strategy prompt_lookup \
        --strategy lookahead          # a GPU's fast path: every method and greedy itself with fast=true

Greedy and every (head, variant) run interleaved on each prompt after a warm-up, ``--repeats`` times, untraced;
speedup = greedy's median wall time / the method's (same tokens, so the same token count). Prints one line
per prompt, then per category and overall: the median and geometric mean of the speedups, the mean tokens per
target forward, the verified nodes per step and how many outputs equal greedy's. The CPU is named in the output
and the JSON. A variant with ``budget=measured`` times the target's forward-cost curve in the warm-up.
``--baseline`` times a second model's greedy in the same interleaving (e.g. the float32 model beside its
float16-weight preset) and adds every method's speedup against it ("vs baseline"); equality is always
checked against the target's own greedy. ``--strategy NAME[:KEY=V,...]`` adds other strategies (prompt lookup,
lookahead) as methods; ``--fast`` runs greedy and every method on the fast path (``fast=true``: static cache
and CUDA graphs on a GPU, the compiled forward where a CPU has it switched on), so the speed-ups are against
our fast greedy. ``--device``/``--dtype`` as for the CLI; on a GPU the output names the card.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from common import (add_prompt_args, add_run_args, by_category, keyvals, named_keyvals, print_finish,  # first: it
                    prompt_row, speedup_line, start, write_json)                    # puts the root on sys.path
from decoding.harness.runner import encode_prompt, run_one  # noqa: E402
from decoding.runtime.head import load_prophet, shipped_head  # noqa: E402
from decoding.runtime.models import load_model  # noqa: E402
from decoding.runtime.pair import ModelPair  # noqa: E402
from decoding.strategies import get_strategy  # noqa: E402


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_prompt_args(p)
    p.add_argument("--head", action="append", help="NAME:FILE (default: the shipped head)")
    p.add_argument("--variant", action="append", help="NAME:KEY=V[,KEY=V] prophet parameters (default: defaults)")
    p.add_argument("--repeats", type=int, default=2)
    add_run_args(p)
    p.add_argument("--baseline", default=None, help="another model whose greedy is timed too (speedups vs it)")
    p.add_argument("--strategy", action="append", default=[], metavar="NAME[:KEY=V,...]",
                   help="another strategy timed as a method (e.g. prompt_lookup, lookahead)")
    p.add_argument("--fast", action="store_true", help="greedy and every method with fast=true (the fast path)")
    p.add_argument("--device", default=None, help="cpu, cuda or auto (default)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16, ... (default: the device's)")
    return p.parse_args(argv)


def _variants(specs: list[str] | None) -> dict[str, dict]:
    return named_keyvals(specs or ["defaults:"])


def summarize(rows: list[dict], methods: list[str]) -> list[dict]:
    out = []
    for cat, rs in by_category(rows):
        for m in methods:
            s = [r["methods"][m]["speedup"] for r in rs]
            out.append({"category": cat, "method": m, "prompts": len(rs), "median": statistics.median(s),
                        "geomean": statistics.geometric_mean(s), "min": min(s), "max": max(s),
                        "tokens_per_forward": statistics.fmean(r["methods"][m]["tokens_per_forward"] for r in rs),
                        "nodes_per_step": statistics.fmean(r["methods"][m]["nodes_per_step"] for r in rs),
                        "equal": sum(r["methods"][m]["equal"] for r in rs)})
            if "vs_baseline" in rs[0]["methods"][m]:
                out[-1]["median_vs_baseline"] = statistics.median(r["methods"][m]["vs_baseline"] for r in rs)
    return out


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    target, machine, prompts = start(args, device=args.device, dtype=args.dtype)
    greedy, prophet = get_strategy("greedy"), get_strategy("prophet")
    heads = dict(h.split(":", 1) for h in args.head or [f"shipped:{shipped_head(target)}"])
    pairs = {name: ModelPair(target, None, prophet=load_prophet(Path(path), target)) for name, path in heads.items()}
    fast = {"fast": True} if args.fast else {}
    variants = {name: prophet.parse({**fast, **v}) for name, v in _variants(args.variant).items()}
    def name(h: str, v: str) -> str:
        return f"{h}/{v}" if len(pairs) > 1 and len(variants) > 1 else h if len(pairs) > 1 else v
    methods = {name(h, v): (prophet, pairs[h], params) for h in pairs for v, params in variants.items()}
    g_params, g_pair = greedy.parse(fast), ModelPair(target)
    for spec in args.strategy:          # other strategies, on the target alone
        sname, _, rest = spec.partition(":")
        other = get_strategy(sname)
        methods[sname] = (other, g_pair, other.parse({**fast, **keyvals(rest)}))
    if args.baseline:   # timed like a method; "greedy (TARGET)" below is the target's own greedy against it
        methods[f"greedy ({args.target})"] = (greedy, g_pair, g_params)
        b_pair = ModelPair(load_model(args.baseline))

    def timed(strategy, params, ids, pair, n=args.max_new_tokens):
        return run_one(strategy, params, ids, pair, max_new_tokens=n, trace=False)
    for text in (prompts[0][1], prompts[-1][1]):                              # 1. warm-up, untimed
        ids = encode_prompt(target.tokenizer, text, chat=True)
        timed(greedy, g_params, ids, g_pair, 16)
        if args.baseline:
            timed(greedy, g_params, encode_prompt(b_pair.target.tokenizer, text, chat=True), b_pair, 16)
        for strategy, pair, params in methods.values():
            timed(strategy, params, ids, pair, 16)
    rows, t_start = [], time.time()
    for i, (cat, text) in enumerate(prompts):
        ids = encode_prompt(target.tokenizer, text, chat=True)
        times: dict[str, list[float]] = {m: [] for m in ["greedy", "baseline", *methods]}
        results: dict = {}
        for _ in range(args.repeats):                                          # 2. interleaved repeats
            results["greedy"], seconds, _ = timed(greedy, g_params, ids, g_pair)
            times["greedy"].append(seconds)
            if args.baseline:
                b_ids = encode_prompt(b_pair.target.tokenizer, text, chat=True)
                results["baseline"], seconds, _ = timed(greedy, g_params, b_ids, b_pair)
                times["baseline"].append(seconds)
            for m, (strategy, pair, params) in methods.items():
                results[m], seconds, _ = timed(strategy, params, ids, pair)
                times[m].append(seconds)
        row = prompt_row(cat, text, list(methods), results, times)
        for m, values in row["methods"].items():
            res = results[m]
            values["nodes_per_step"] = res.stats.get("mean_nodes_per_step", 0.0)
            if "head_graphs" in res.stats:   # fast=true on CUDA: the head's draft calls replayed as graphs
                values["head_graph_replays"] = res.stats["head_graphs"]["replays"]
            if args.baseline:   # per token: the baseline's greedy may stop at another length
                b_rate = statistics.median(times["baseline"]) / max(1, len(results["baseline"].token_ids))
                rate = statistics.median(times[m]) / max(1, len(res.token_ids))
                values["vs_baseline"] = b_rate / rate
        rows.append(row)
        print(speedup_line(i, cat, row["methods"]), flush=True)
    summary = summarize(rows, list(methods))
    print_finish(machine, len(prompts), args.max_new_tokens, t_start, args.repeats)
    print("| category | method | median speedup vs greedy | geomean | range | tokens / target forward "
          "| nodes / step | = greedy |" + (" median vs baseline |" if args.baseline else ""))
    print("|---|---|---|---|---|---|---|---|" + ("---|" if args.baseline else ""))
    for s in summary:
        print(f"| {s['category']} ({s['prompts']}) | {s['method']} | {s['median']:.3f} | {s['geomean']:.3f} | "
              f"{s['min']:.2f}-{s['max']:.2f} | {s['tokens_per_forward']:.3f} | {s['nodes_per_step']:.1f} | "
              f"{s['equal']}/{s['prompts']} |" + (f" {s['median_vs_baseline']:.3f} |" if args.baseline else ""))
    doc = {"machine": machine, "target": args.target, "baseline": args.baseline, "fast": args.fast,
           "strategies": args.strategy, "device": str(target.device), "dtype": str(target.dtype),
           "prompts_file": str(args.prompts), "heads": heads,
           "variants": {k: dict(v) for k, v in _variants(args.variant).items()}, "repeats": args.repeats,
           "max_new_tokens": args.max_new_tokens, "rows": rows, "summary": summary}
    write_json(args.json, doc)
    return doc


if __name__ == "__main__":
    main()
