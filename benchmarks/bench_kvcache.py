"""transformers' DynamicCache (a torch.cat of the whole cache at every forward) against the growing cache
(decoding/runtime/kvcache.py: a buffer with headroom, views into it), in one process.

    python benchmarks/bench_kvcache.py [--forward-repeats 15] [--repeats 3] [--json FILE]

1. One-position decode forwards after a context of 256-4096 tokens, both caches interleaved (the forward's
   position is cropped off after each timing), medians; the logits are compared for bit-identity.
2. Whole runs on long prompts made from the Python standard library's own source (text this project did not
   write; ``--source-chars`` characters of each module, asked to be summarized through the chat template):
   greedy, prompt lookup and the prophet on each cache, interleaved per prompt (the order flips every repeat),
   untraced, after a warm-up. Per run: the stock cache's median time over the growing one's (> 1: growing is
   faster) and whether every output is identical.

The CPU is named in the output and the JSON.
"""

from __future__ import annotations

import argparse
import inspect

import torch
from transformers import DynamicCache, EncoderDecoderCache

from common import filler_ids, gain_summary, interleaved_ms, median, write_json  # first: it puts the repository root on sys.path

import decoding.runtime.session as session_mod
from decoding.harness.runner import encode_prompt, environment, run_one
from decoding.runtime.kernel_choice import cpu_label
from decoding.runtime.kvcache import new_dynamic_cache
from decoding.runtime.models import load_model
from decoding.runtime.pair import ModelPair
from decoding.runtime.session import Session
from decoding.strategies import get_strategy

CONTEXTS = (256, 1024, 2048, 4096)
SOURCES = ("textwrap", "argparse", "difflib")         # standard-library modules: long, not ours


def stock_cache(encoder_decoder: bool = False):
    """What the session made before: transformers' own dynamic cache."""
    return EncoderDecoderCache(DynamicCache(), DynamicCache()) if encoder_decoder else DynamicCache()


CACHES = {"stock": stock_cache, "growing": new_dynamic_cache}


def use(name: str) -> None:
    session_mod.new_dynamic_cache = CACHES[name]


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--forward-repeats", type=int, default=15)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--source-chars", type=int, action="append",
                   help="characters of each module's source per prompt (default: 1500, 6000, 14000)")
    p.add_argument("--strategy", action="append", help="strategies to time (default: greedy, prompt_lookup, prophet)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def forwards(lm, contexts: tuple[int, ...], repeats: int) -> list[dict]:
    """One-position forwards after each context length, both caches interleaved; ms medians."""
    rows = []
    for n in contexts:
        sessions = {}
        for name in CACHES:
            use(name)
            s = Session(lm)
            s.prefill(filler_ids(lm.vocab_size, n))
            sessions[name] = s
        length = {name: s.length for name, s in sessions.items()}
        ids = {name: s.tensor([[42]]) for name, s in sessions.items()}
        times, logits = interleaved_ms(list(CACHES), repeats, lambda name: sessions[name].forward(ids[name]),
                                       after=lambda name: sessions[name].crop(length[name]))
        row = {"context": n, "stock_ms": median(times["stock"]), "growing_ms": median(times["growing"]),
               "bit_identical": bool(torch.equal(logits["stock"], logits["growing"]))}
        row["speedup"] = row["stock_ms"] / row["growing_ms"]
        rows.append(row)
        print(f"context {n:5d}: stock {row['stock_ms']:6.2f} ms, growing {row['growing_ms']:6.2f} ms "
              f"-> {row['speedup']:.3f}x; logits identical: {row['bit_identical']}", flush=True)
    use("growing")
    return rows


def prompts(sizes: list[int]) -> list[tuple[str, str]]:
    """(label, prompt): each module's source cut to each size, to be summarized."""
    out = []
    for mod in SOURCES:
        text = inspect.getsource(__import__(mod))
        for size in sizes:
            out.append((f"{mod}[:{size}]", f"Summarize what this Python code does:\n\n{text[:size]}"))
    return out


def runs(lm, names: list[str], args: argparse.Namespace) -> list[dict]:
    pair = ModelPair(lm)
    strategies = {n: get_strategy(n) for n in names}
    params = {n: s.parse({}) for n, s in strategies.items()}

    def once(name, ids, cache, n=args.max_new_tokens):
        use(cache)
        res, seconds, _ = run_one(strategies[name], params[name], ids, pair, max_new_tokens=n, trace=False)
        return res, seconds

    cases = prompts(args.source_chars or [1500, 6000, 14000])
    ids0 = encode_prompt(lm.tokenizer, cases[0][1], chat=True)                 # warm-up
    for n in names:
        for cache in CACHES:
            once(n, ids0, cache, 16)
    rows = []
    for label, text in cases:
        ids = encode_prompt(lm.tokenizer, text, chat=True)
        row = {"prompt": label, "prompt_tokens": len(ids)}
        for n in names:
            times, out = {c: [] for c in CACHES}, {}
            for r in range(args.repeats):
                for cache in (list(CACHES) if r % 2 else list(CACHES)[::-1]):
                    out[cache], seconds = once(n, ids, cache)
                    times[cache].append(seconds)
            stock, growing = median(times["stock"]), median(times["growing"])
            row[n] = {"stock_s": stock, "growing_s": growing, "gain": stock / growing,
                      "identical": out["stock"].token_ids == out["growing"].token_ids}
        rows.append(row)
        print(f"{label:18s} {len(ids):5d} tokens  " + "  ".join(
            f"{n}: {row[n]['gain']:.3f}x{'' if row[n]['identical'] else ' DIFFERS'}" for n in names), flush=True)
    use("growing")
    return rows


def summarize(rows: list[dict], names: list[str]) -> dict:
    out = {}
    for n in names:
        out[n] = {"runs": len(rows), **gain_summary([r[n]["gain"] for r in rows]),
                  "identical": sum(r[n]["identical"] for r in rows)}
        s = out[n]
        print(f"{n}: growing over stock median {s['median_gain']:.3f}x (geomean {s['geomean_gain']:.3f}, "
              f"{s['min_gain']:.3f}-{s['max_gain']:.3f}); identical {s['identical']}/{s['runs']}")
    return out


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    print(f"CPU: {cpu_label()}, {torch.get_num_threads()} threads, torch {torch.__version__}", flush=True)
    lm = load_model(args.target)
    names = args.strategy or ["greedy", "prompt_lookup", "prophet"]
    doc = {"cpu": cpu_label(), "environment": environment(ModelPair(lm), 0), "args": vars(args),
           "forwards": forwards(lm, CONTEXTS, args.forward_repeats)}
    rows = runs(lm, names, args) if args.repeats > 0 else []
    doc.update(runs=rows, summary=summarize(rows, names) if rows else {})
    write_json(args.json, doc)
    return doc


if __name__ == "__main__":
    main()
