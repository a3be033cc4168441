"""The compiled CPU forward against the eager one, on this machine, in one process, interleaved.

    python benchmarks/bench_compiled.py [--target NAME] [--repeats 3] [--json benchmarks/results/compiled-cpu.json]

For one model (default: the version of the app's default target this machine's start would serve):

1. the compile cost: every width graph, timed from the start of ``compiled.warm`` (cold, or from inductor's
   disk cache when an earlier run left it);
2. forward cost by width T, eager (the loop's growing cache) and compiled (the static cache), after a 128-token
   prefill, interleaved, medians; and T / 1 for each;
3. greedy tokens/s, eager and compiled, against transformers' ``generate`` on the float32 model with its
   default kernels (what a plain transformers user runs), on the app's default example, 64 tokens;
4. the default example's race in both modes (every strategy against greedy in the same mode, after a warm-up,
   medians of ``--repeats``), with a prophet step over a greedy step, and whether every output equals greedy's;
5. with ``--unseen N``: the prophet on the first N prompts per category of ``presets/bench_unseen.yaml`` (prompts
   the project did not write), compiled, against compiled greedy: median speedup, tokens per forward, equality.

The CPU is named in the output and the JSON.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from common import DEFAULT_PROMPT, default_race, filler_ids, generate_new_tokens, interleaved_ms, write_json  # first: repository root on sys.path

from decoding.harness.bench import load_prompt_set
from decoding.harness.runner import encode_prompt, run_comparison
from decoding.runtime import compiled
from decoding.runtime.head import prophet_for
from decoding.runtime.kernel_choice import cpu_label
from decoding.runtime.models import PRESETS_DIR, default_target, load_model
from decoding.runtime.pair import ModelPair
from decoding.runtime.session import Session
from decoding.runtime.warmup import warm

WIDTHS = (1, 2, 4, 6, 9, 10, 13, 16, 17, 25, 33)
PROMPT = DEFAULT_PROMPT      # the app's default example
RACE = ("prophet", "prompt_lookup", "lookahead", "jacobi", "suffix")
GENERATE = "generate (float32, transformers' kernels)"


def forward_costs(lm, repeats: int) -> dict:
    sessions = {"eager": Session(lm), "compiled": Session(lm, fast=True, max_len=128 + max(WIDTHS) + 1)}
    for session in sessions.values():
        session.prefill(filler_ids(lm.vocab_size, 128))
    out: dict = {}
    for t in WIDTHS:
        ids = {name: s.tensor([filler_ids(lm.vocab_size, t)]) for name, s in sessions.items()}
        times, _ = interleaved_ms(list(sessions), repeats, lambda n: sessions[n].forward(ids[n]),
                                  after=lambda n: sessions[n].crop(128))
        for name, ms in times.items():
            out.setdefault(name, {})[t] = statistics.median(ms)
    return out


def race(lm, fast: bool, repeats: int, max_new: int) -> dict:
    result = default_race(lm, [(name, {"fast": fast}) for name in RACE], repeats, max_new, PROMPT)
    return {k: v for k, v in result.items() if k != "ids"}


def unseen(lm, per_category: int, repeats: int, max_new: int) -> dict:
    prompts = load_prompt_set(PRESETS_DIR / "bench_unseen.yaml", None, per_category)
    pair = ModelPair(lm, prophet=prophet_for(lm))
    rows = []
    for cat, text in prompts:
        ids = encode_prompt(lm.tokenizer, text, chat=True)
        runs = [("greedy", {"fast": True}), ("prophet", {"fast": True})]
        run_comparison(ids, pair, runs, max_new_tokens=16, warmup=False, trace=False)
        walls: dict = {"greedy": [], "prophet": []}
        for _ in range(repeats):
            results = run_comparison(ids, pair, runs, max_new_tokens=max_new, warmup=False, trace=False)
            for r in results:
                walls[r.strategy].append(r.wall_s)
        rows.append({"category": cat, "speedup": statistics.median(walls["greedy"]) / statistics.median(walls["prophet"]),
                     "tokens_per_forward": len(results[1].token_ids) / max(1, results[1].target_forwards),
                     "equal": bool(results[1].matches_greedy)})
        print(f"  {cat:10s} prophet {rows[-1]['speedup']:.2f}x, {rows[-1]['tokens_per_forward']:.2f} tokens/forward"
              f"{'' if rows[-1]['equal'] else ' (DIFFERS)'}", flush=True)
    return {"prompts": len(rows), "median_speedup": statistics.median(r["speedup"] for r in rows),
            "tokens_per_forward": statistics.mean(r["tokens_per_forward"] for r in rows),
            "equal": sum(r["equal"] for r in rows), "rows": rows}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default=None, help="default: the app's default target, its bfloat16-weight version "
                                                  "where this CPU runs it")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--forward-repeats", type=int, default=9)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--unseen", type=int, default=0, help="prompts per category of presets/bench_unseen.yaml")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--forwards-only", action="store_true", help="only the compile cost and the cost by width")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    base = default_target()
    name = args.target
    if name is None:
        from decoding.runtime.kernels import bf16_available
        name = f"{base}-bf16w" if bf16_available() else base
    lm = load_model(name)
    plain = load_model(base, kernels="default")
    machine = f"{cpu_label()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    print(f"CPU: {machine}; model {name}", flush=True)
    reason = compiled.enable(lm)
    if reason:
        raise SystemExit(f"the compiled path is off here: {reason}")
    t0 = time.perf_counter()
    took = warm(lm, progress=lambda i, n: print(f"  compiled width {i}/{n}", flush=True))
    compile_s = time.perf_counter() - t0
    print(f"compile: {compile_s:.0f} s for {compiled.engine(lm).stats()['graphs']} graphs ({took})", flush=True)

    costs = forward_costs(lm, args.forward_repeats)
    print("\n| mode | " + " | ".join(f"T={t}" for t in WIDTHS) + " | T=10 / T=1 | T=16 / T=1 | T=17 / T=1 |")
    print("|---|" + "---:|" * (len(WIDTHS) + 3))
    for mode, row in costs.items():
        print(f"| {mode} | " + " | ".join(f"{row[t]:.1f}" for t in WIDTHS)
              + f" | {row[10] / row[1]:.2f} | {row[16] / row[1]:.2f} | {row[17] / row[1]:.2f} |")
    if args.forwards_only:
        doc = {"cpu": cpu_label(), "machine": machine, "model": name, "compile_s": round(compile_s, 1),
               "forward_ms": costs, "engine": compiled.engine(lm).stats()}
        write_json(args.json, doc)
        return doc

    ids = encode_prompt(lm.tokenizer, PROMPT, chat=True)
    calls = {"eager greedy": lambda: run_comparison(ids, ModelPair(lm), [("greedy", {})], max_new_tokens=args.max_new_tokens,
                                                     warmup=False, trace=False)[0].token_ids,
             "compiled greedy": lambda: run_comparison(ids, ModelPair(lm), [("greedy", {"fast": True})],
                                                        max_new_tokens=args.max_new_tokens, warmup=False,
                                                        trace=False)[0].token_ids,
             GENERATE: lambda: generate_new_tokens(plain, ids, max_new_tokens=args.max_new_tokens)}
    for fn in calls.values():
        fn()
    times, last = interleaved_ms(list(calls), args.repeats, lambda n: calls[n]())
    tps = {n: len(last[n]) / (statistics.median(ms) / 1e3) for n, ms in times.items()}
    gen = tps[GENERATE]
    print("\n| greedy | tok/s | / generate |\n|---|---:|---:|")
    for n, v in tps.items():
        print(f"| {n} | {v:.1f} | {v / gen:.2f} |")

    races = {mode: race(lm, mode == "compiled", args.repeats, args.max_new_tokens) for mode in ("eager", "compiled")}
    print("\n| mode | greedy tok/s | " + " | ".join(RACE) + " | prophet step / greedy step | all = greedy |")
    print("|---|---:|" + "---:|" * len(RACE) + "---:|---|")
    for mode, r in races.items():
        print(f"| {mode} | {r['greedy_tok_s']:.1f} | " + " | ".join(f"{r['speedup'][k]:.2f}x" for k in RACE)
              + f" | {r['prophet_step_over_greedy_step']:.2f} | "
              + ("yes" if all(r['equal_greedy'].values()) else
                 "no: " + ", ".join(k for k, v in r['equal_greedy'].items() if not v)) + " |")
    doc = {"cpu": cpu_label(), "machine": machine, "model": name, "compile_s": round(compile_s, 1),
           "compile_by_width": took, "forward_ms": costs, "greedy_tok_s": tps, "races": races,
           "engine": compiled.engine(lm).stats()}
    if args.unseen:
        print(f"\nthe prophet on presets/bench_unseen.yaml ({args.unseen} per category), compiled:", flush=True)
        doc["unseen"] = u = unseen(lm, args.unseen, args.repeats, args.max_new_tokens)
        print(f"median {u['median_speedup']:.2f}x over compiled greedy, {u['tokens_per_forward']:.2f} tokens/forward, "
              f"{u['equal']}/{u['prompts']} equal to greedy")
    write_json(args.json, doc)
    return doc


if __name__ == "__main__":
    main()
