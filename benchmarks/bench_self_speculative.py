"""Self-speculative decoding against greedy on the unseen prompts (presets/bench_unseen.yaml), in one process.

    python benchmarks/bench_self_speculative.py                          # exit_layer default (half), 24, auto
    python benchmarks/bench_self_speculative.py --variant e20:exit_layer=20 --per-category 2 --threads 1

1. The draft's cost on this machine: a one-position forward of the draft (the target's layers the variant
   keeps, its final norm and LM head) against a one-position forward of the whole target, after a
   ``--context``-token prefill, interleaved, median of ``--cost-repeats``; beside it the share of layers the
   draft runs. A draft of E of L layers costs E / L of a forward only where the forward's time is spent in
   the layers' weight reads; the LM head and each forward's fixed overhead are paid by every draft forward.
2. Greedy and every variant, interleaved per prompt after a warm-up, ``--repeats`` times, untraced: speed-up =
   greedy's median wall time / the variant's (same tokens), tokens per target forward, acceptance (alpha).

Prints one line per prompt, then per variant the median speed-up and tokens per target forward, the geometric
mean speed-up, the mean alpha and how many outputs equal greedy's. The CPU is named in the output and the JSON.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from common import (add_prompt_args, add_run_args, named_keyvals, print_finish, prompt_row, speedup_line,  # first:
                    start, write_json)                                        # it puts the root on sys.path
from decoding.drafting.selfdraft import kept_layers, resolve_form, search  # noqa: E402
from decoding.harness.runner import encode_prompt, run_one  # noqa: E402
from decoding.runtime.forward_cost import filler_ids  # noqa: E402
from decoding.runtime.kvcache import crop_each_layer  # noqa: E402
from decoding.runtime.layers import check_layers, layer_view  # noqa: E402
from decoding.runtime.pair import ModelPair  # noqa: E402
from decoding.runtime.session import Session  # noqa: E402
from decoding.strategies import get_strategy  # noqa: E402

DEFAULT_VARIANTS = ["half:", "exit24:exit_layer=24", "auto:skip_layers=auto"]


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_prompt_args(p)
    p.add_argument("--variant", action="append", help="NAME:KEY=V[,KEY=V] self_speculative parameters")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--context", type=int, default=128, help="prefilled tokens before the timed draft forwards")
    p.add_argument("--cost-repeats", type=int, default=9)
    add_run_args(p)
    return p.parse_args(argv)


@torch.inference_mode()
def draft_costs(lm, forms: dict, context: int, repeats: int) -> dict:
    """``{name: (draft ms, full ms)}``: one-position forwards of each draft view and of the whole model on one
    cache after ``context`` filler tokens, interleaved; medians."""
    session = Session(lm, "target")
    session.prefill(filler_ids(lm.vocab_size, context))
    base = session.length
    views = {name: layer_view(lm.model, kept_layers(form)) for name, form in forms.items()}
    times: dict = {name: [] for name in [*views, "full"]}
    token = session.tensor([[filler_ids(lm.vocab_size, 1)[0]]])
    for i in range(repeats + 1):                      # the first pass warms up
        for name, model in [*views.items(), ("full", lm.model)]:
            session.model = model
            t0 = time.perf_counter()
            session.forward(token, last_only=True)
            if i:
                times[name].append((time.perf_counter() - t0) * 1e3)
            crop_each_layer(session.cache, base)
    full = statistics.median(times["full"])
    return {name: (statistics.median(times[name]), full) for name in views}


def _forms(lm, variants: dict, strategy, first_prompt: list[int]) -> dict:
    """Each variant's draft layers (``auto``: the set its search picks on the first prompt)."""
    forms = {}
    for name, values in variants.items():
        params = strategy.parse(values)
        layers = check_layers(lm.model)
        forms[name] = resolve_form(params, layers) or search(lm, first_prompt, layers, params.draft_tokens)
    return forms


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    target, machine, prompts = start(args)
    greedy, selfspec = get_strategy("greedy"), get_strategy("self_speculative")
    variants = named_keyvals(args.variant or DEFAULT_VARIANTS)
    methods = {name: selfspec.parse(values) for name, values in variants.items()}
    pair, g_params = ModelPair(target), greedy.parse({})
    # 1. what a draft forward costs against a full one
    forms = _forms(target, variants, selfspec, encode_prompt(target.tokenizer, prompts[0][1], chat=True))
    costs = draft_costs(target, forms, args.context, args.cost_repeats)
    cost_rows = {}
    for name, (draft_ms, full_ms) in costs.items():
        share = len(kept_layers(forms[name])) / forms[name].layers
        cost_rows[name] = {"draft_ms": round(draft_ms, 2), "full_ms": round(full_ms, 2),
                           "ratio": round(draft_ms / full_ms, 3), "layer_share": round(share, 3),
                           "skipped": list(forms[name].skipped), "exit_layer": forms[name].exit_layer}
        print(f"draft cost {name}: {draft_ms:.1f} ms vs full {full_ms:.1f} ms = {draft_ms / full_ms:.2f} "
              f"(layers run: {share:.2f})", flush=True)

    def timed(strategy, params, ids, n=args.max_new_tokens):
        return run_one(strategy, params, ids, pair, max_new_tokens=n, trace=False)
    for text in dict.fromkeys((prompts[0][1], prompts[-1][1])):          # 2. warm-up, untimed (once a prompt)
        ids = encode_prompt(target.tokenizer, text, chat=True)
        timed(greedy, g_params, ids, 16)
        for params in methods.values():
            timed(selfspec, params, ids, 16)
    rows, t_start = [], time.time()
    for i, (cat, text) in enumerate(prompts):
        ids = encode_prompt(target.tokenizer, text, chat=True)
        times: dict = {m: [] for m in ["greedy", *methods]}
        results: dict = {}
        for _ in range(args.repeats):                                      # 3. interleaved repeats
            results["greedy"], seconds, _ = timed(greedy, g_params, ids)
            times["greedy"].append(seconds)
            for m, params in methods.items():
                results[m], seconds, _ = timed(selfspec, params, ids)
                times[m].append(seconds)
        row = prompt_row(cat, text, list(methods), results, times)
        for m, values in row["methods"].items():
            stats = results[m].stats
            values.update(alpha=stats.get("alpha", 0.0), skipped=stats.get("skipped"),
                          exit_layer=stats.get("exit_layer"))
        rows.append(row)
        print(speedup_line(i, cat, row["methods"]), flush=True)
    summary = []
    for m in methods:
        vals = [r["methods"][m] for r in rows]
        summary.append({"method": m, "prompts": len(vals),
                        "median_speedup": statistics.median(v["speedup"] for v in vals),
                        "geomean_speedup": statistics.geometric_mean(v["speedup"] for v in vals),
                        "median_tokens_per_forward": statistics.median(v["tokens_per_forward"] for v in vals),
                        "mean_alpha": statistics.fmean(v["alpha"] for v in vals),
                        "equal": sum(v["equal"] for v in vals)})
    print_finish(machine, len(prompts), args.max_new_tokens, t_start, args.repeats)
    print("| variant | draft / full forward (layers run) | median speed-up vs greedy | geomean | "
          "median tokens / target forward | mean alpha | = greedy |")
    print("|---|---|---|---|---|---|---|")
    for s in summary:
        c = cost_rows[s["method"]]
        print(f"| {s['method']} | {c['ratio']:.2f} ({c['layer_share']:.2f}) | {s['median_speedup']:.3f} | "
              f"{s['geomean_speedup']:.3f} | {s['median_tokens_per_forward']:.3f} | {s['mean_alpha']:.3f} | "
              f"{s['equal']}/{s['prompts']} |")
    doc = {"machine": machine, "target": args.target, "variants": variants, "repeats": args.repeats,
           "max_new_tokens": args.max_new_tokens, "prompts_file": str(args.prompts), "draft_cost": cost_rows,
           "rows": rows, "summary": summary}
    write_json(args.json, doc)
    return doc


if __name__ == "__main__":
    main()
