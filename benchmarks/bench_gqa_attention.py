"""Masked multi-position forwards on the CPU: transformers' sdpa (a copy of the keys per query head) against
the grouped kernel (decoding/runtime/gqa_attention.py), in one process.

    python benchmarks/bench_gqa_attention.py [--repeats 3] [--per-category 4] [--json FILE]

1. A tree verify forward (one pending token + a 10-node tree, the prophet's usual width) after a context of
   128-2048 tokens, both implementations interleaved, medians of ``--forward-repeats``; the two forwards'
   logits are compared for bit-identity.
2. The prophet (defaults) and lookahead (defaults) on prompts of presets/bench_unseen.yaml, chat template,
   ``--max-new-tokens``: greedy, then each strategy on the stock attention and on the grouped one, interleaved
   per prompt (the order of the two flips every repeat), untraced, after a warm-up. Per prompt: the stock
   run's median time over the grouped run's (> 1: the grouped kernel is faster), both speedups over greedy
   (greedy's one-position forwards take the same path under both), and whether all outputs are identical.

The CPU is named in the output and the JSON.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from common import filler_ids, gain_summary, interleaved_ms, median, write_json  # first: it puts the repository root on sys.path

from decoding.harness.bench import load_prompt_set
from decoding.harness.runner import encode_prompt, environment, run_one
from decoding.runtime.attention import tree_forward
from decoding.runtime.gqa_attention import NAME
from decoding.runtime.kernel_choice import cpu_label
from decoding.runtime.models import PRESETS_DIR, load_model
from decoding.runtime.pair import ModelPair
from decoding.runtime.session import Session
from decoding.strategies import get_strategy
from decoding.tree import TokenTree

STOCK = "sdpa"
CONTEXTS = (128, 512, 1024, 2048)
# one pending token and a 10-node tree of depth 4 (the prophet's verify forwards average ~11 positions)
TREE = TokenTree((5, 6, 7, 8, 9, 10, 11, 12, 13, 14), (-1, -1, 0, 0, 1, 2, 2, 4, 5, 7))


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--forward-repeats", type=int, default=9)
    p.add_argument("--per-category", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--strategy", action="append", help="strategies to time (default: prophet, lookahead)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def forwards(lm, contexts: tuple[int, ...], repeats: int) -> list[dict]:
    """Tree verify forwards after each context length, both attentions interleaved; ms medians."""
    rows = []
    for n in contexts:
        sessions = {}
        for impl in (STOCK, NAME):
            lm.model.set_attn_implementation(impl)
            s = Session(lm)
            s.prefill(filler_ids(lm.vocab_size, n))
            sessions[impl] = s
        length = {impl: s.length for impl, s in sessions.items()}

        def call(impl: str):
            lm.model.set_attn_implementation(impl)
            return tree_forward(sessions[impl], [42], TREE)
        times, logits = interleaved_ms([STOCK, NAME], repeats, call,
                                       after=lambda impl: sessions[impl].crop(length[impl]))
        row = {"context": n, "positions": 1 + len(TREE), "stock_ms": median(times[STOCK]),
               "grouped_ms": median(times[NAME]), "bit_identical": bool(torch.equal(logits[STOCK], logits[NAME]))}
        row["speedup"] = row["stock_ms"] / row["grouped_ms"]
        rows.append(row)
        print(f"context {n:5d}: stock {row['stock_ms']:6.2f} ms, grouped {row['grouped_ms']:6.2f} ms "
              f"-> {row['speedup']:.3f}x; logits identical: {row['bit_identical']}", flush=True)
    return rows


def runs(lm, names: list[str], args: argparse.Namespace) -> list[dict]:
    pair = ModelPair(lm)
    greedy = get_strategy("greedy")
    strategies = {n: get_strategy(n) for n in names}
    params = {n: s.parse({}) for n, s in strategies.items()}
    prompts = load_prompt_set(PRESETS_DIR / "bench_unseen.yaml", None, args.per_category)

    def once(strategy, p, ids, impl, n=args.max_new_tokens):
        lm.model.set_attn_implementation(impl)
        res, seconds, _ = run_one(strategy, p, ids, pair, max_new_tokens=n, trace=False)
        return res, seconds

    ids0 = encode_prompt(lm.tokenizer, prompts[0][1], chat=True)           # warm-up
    once(greedy, greedy.parse({}), ids0, NAME, 16)
    for n, s in strategies.items():
        for impl in (STOCK, NAME):
            once(s, params[n], ids0, impl, 16)
    rows = []
    for i, (cat, text) in enumerate(prompts):
        ids = encode_prompt(lm.tokenizer, text, chat=True)
        g_times, times, out = [], {(n, impl): [] for n in names for impl in (STOCK, NAME)}, {}
        for r in range(args.repeats):
            ref, seconds = once(greedy, greedy.parse({}), ids, NAME)
            g_times.append(seconds)
            for n in names:
                for impl in ((STOCK, NAME) if r % 2 else (NAME, STOCK)):
                    out[(n, impl)], seconds = once(strategies[n], params[n], ids, impl)
                    times[(n, impl)].append(seconds)
        row = {"category": cat, "prompt": text[:80], "tokens": len(ref.token_ids), "greedy_s": median(g_times)}
        for n in names:
            stock, grouped = median(times[(n, STOCK)]), median(times[(n, NAME)])
            row[n] = {"stock_s": stock, "grouped_s": grouped, "gain": stock / grouped,
                      "vs_greedy_stock": row["greedy_s"] / stock, "vs_greedy_grouped": row["greedy_s"] / grouped,
                      "identical": out[(n, STOCK)].token_ids == out[(n, NAME)].token_ids == ref.token_ids}
        rows.append(row)
        print(f"{i:2d} {cat:10s} " + "  ".join(
            f"{n}: {row[n]['gain']:.3f}x ({row[n]['vs_greedy_stock']:.2f}x -> {row[n]['vs_greedy_grouped']:.2f}x "
            f"greedy){'' if row[n]['identical'] else ' DIFFERS'}" for n in names), flush=True)
    return rows


def summarize(rows: list[dict], names: list[str]) -> dict:
    out = {}
    for n in names:
        out[n] = {"prompts": len(rows), **gain_summary([r[n]["gain"] for r in rows]),
                  "median_vs_greedy_stock": statistics.median(r[n]["vs_greedy_stock"] for r in rows),
                  "median_vs_greedy_grouped": statistics.median(r[n]["vs_greedy_grouped"] for r in rows),
                  "identical": sum(r[n]["identical"] for r in rows)}
        s = out[n]
        print(f"{n}: grouped over stock median {s['median_gain']:.3f}x (geomean {s['geomean_gain']:.3f}, "
              f"{s['min_gain']:.3f}-{s['max_gain']:.3f}); vs greedy {s['median_vs_greedy_stock']:.2f}x -> "
              f"{s['median_vs_greedy_grouped']:.2f}x; identical {s['identical']}/{s['prompts']}")
    return out


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    print(f"CPU: {cpu_label()}, {torch.get_num_threads()} threads, torch {torch.__version__}", flush=True)
    lm = load_model(args.target)
    original = lm.model.config._attn_implementation
    names = args.strategy or ["prophet", "lookahead"]
    doc = {"cpu": cpu_label(), "environment": environment(ModelPair(lm), 0), "args": vars(args),
           "forwards": forwards(lm, CONTEXTS, args.forward_repeats)}
    rows = runs(lm, names, args) if args.per_category > 0 else []
    doc.update(runs=rows, summary=summarize(rows, names) if rows else {})
    lm.model.set_attn_implementation(original)
    write_json(args.json, doc)
    return doc


if __name__ == "__main__":
    main()
