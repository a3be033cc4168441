"""The versions of the default model on this CPU: what a forward costs by width, greedy against transformers'
``generate``, the default example's race, and which version the app would choose; one process, interleaved.

    python benchmarks/bench_routes.py [--repeats 3] [--json benchmarks/results/routes-cpu.json]

Candidates are the default preset and its reduced-weight siblings that load here (``routes.versions``:
float16 weights on FBGEMM, bfloat16 weights on oneDNN/AMX), each exact against its own greedy. For each:

1. forward cost by width T (the loop's own session and growing cache after a 128-token prefill, the cache
   cropped back after each, medians of ``--forward-repeats``), and T / 1;
2. greedy tokens/s against ``generate`` on the float32 model with transformers' default kernels (what a plain
   transformers user runs) on the default example, 64 tokens;
3. the default example's race (the app's default comparison plus Jacobi and suffix decoding), ``--repeats``
   runs after a warm-up, each strategy's median speedup over that version's greedy, and a prophet step over a
   greedy step (the prophet's wall time per target forward over greedy's);
4. the choice ``routes.choose`` makes from ``routes.WIDTH``-position and one-position costs.

The CPU is named in the output and the JSON.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from common import DEFAULT_PROMPT, default_race, filler_ids, generate_new_tokens, interleaved_ms, write_json  # first: repository root on sys.path

from decoding.harness.runner import run_comparison
from decoding.runtime.kernel_choice import cpu_label
from decoding.runtime.models import default_target, load_model, load_presets
from decoding.runtime.pair import ModelPair
from decoding.runtime.routes import WIDTH, Config, decide, versions
from decoding.runtime.session import Session

WIDTHS = (1, 2, 4, 6, 9, 10, 13, 17, 25, 33)
PROMPT = DEFAULT_PROMPT      # the app's default example
GENERATE = "generate (float32, transformers' kernels)"
RACE = [("prophet", {}), ("prompt_lookup", {}), ("lookahead", {}), ("jacobi", {}), ("suffix", {})]


def forward_costs(models: dict, repeats: int) -> dict:
    sessions = {}
    for name, lm in models.items():
        session = Session(lm)
        session.prefill(filler_ids(lm.vocab_size, 128))
        sessions[name] = session
    out = {}
    for t in WIDTHS:
        ids = {name: s.tensor([filler_ids(s.lm.vocab_size, t)]) for name, s in sessions.items()}
        times, _ = interleaved_ms(list(models), repeats,
                                  lambda n: sessions[n].forward(ids[n], last_only=t == 1),
                                  after=lambda n: sessions[n].crop(128))
        for name, ms in times.items():
            out.setdefault(name, {})[t] = statistics.median(ms)
    return out


def race(lm, repeats: int, max_new: int) -> dict:
    return default_race(lm, RACE, repeats, max_new, PROMPT)


def greedy_vs_generate(models: dict, plain, ids: list[int], max_new: int, repeats: int) -> dict:
    calls = {name: (lambda lm=lm: run_comparison(ids, ModelPair(lm), [], max_new_tokens=max_new, warmup=False,
                                                 trace=False)[0].token_ids) for name, lm in models.items()}
    calls[GENERATE] = lambda: generate_new_tokens(plain, ids, max_new_tokens=max_new)
    times, last = interleaved_ms(list(calls), repeats, lambda n: calls[n]())
    return {name: len(last[name]) / (statistics.median(ms) / 1e3) for name, ms in times.items()}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default=None, help="the base preset (default: the app's default target)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--forward-repeats", type=int, default=9)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    base = args.target or default_target()
    names = versions(base, load_presets())
    models = {name: load_model(name) for name in names}
    plain = load_model(base, kernels="default")
    print(f"CPU: {cpu_label()}, {torch.get_num_threads()} threads, torch {torch.__version__}; candidates {names}")
    costs = forward_costs(models, args.forward_repeats)
    print("| version | " + " | ".join(f"T={t}" for t in WIDTHS) + f" | T={WIDTH} / T=1 | T=17 / T=1 |")
    print("|---|" + "---:|" * (len(WIDTHS) + 2))
    for name, row in costs.items():
        print(f"| {name} | " + " | ".join(f"{row[t]:.1f}" for t in WIDTHS)
              + f" | {row[WIDTH] / row[1]:.2f} | {row[17] / row[1]:.2f} |")
    races = {name: race(lm, args.repeats, args.max_new_tokens) for name, lm in models.items()}
    ids = races[base]["ids"]
    tps = greedy_vs_generate(models, plain, ids, args.max_new_tokens, args.repeats)
    gen = tps[GENERATE]
    print("\n| version | greedy tok/s | / generate | " + " | ".join(k for k, _ in RACE)
          + " | prophet step / greedy step | all = greedy |")
    print("|---|---:|---:|" + "---:|" * len(RACE) + "---:|---|")
    for name, r in races.items():
        print(f"| {name} | {tps[name]:.1f} | {tps[name] / gen:.2f} | "
              + " | ".join(f"{r['speedup'][k]:.2f}x" for k, _ in RACE)
              + f" | {r['prophet_step_over_greedy_step']:.2f} | {all(r['equal_greedy'].values())} |")
    print(f"generate: {gen:.1f} tok/s")
    chosen = decide({Config(n): {1: c[1], WIDTH: c[WIDTH]} for n, c in costs.items()}, Config(base)).label
    print(f"routes.choose would run {chosen} by default here")
    doc = {"cpu": cpu_label(), "threads": torch.get_num_threads(), "torch": torch.__version__,
           "forward_ms": costs, "greedy_tok_s": tps,
           "races": {n: {k: v for k, v in r.items() if k != "ids"} for n, r in races.items()}, "chosen": chosen}
    write_json(args.json, doc)
    return doc


if __name__ == "__main__":
    main()
