"""Does the app's default comparison keep what pays here? For each version of the default model that loads on
this CPU: its measured forward-cost curve (the one the app times at start), the verdict of each default strategy
(``decoding/harness/pays.py``: kept, or left out with why), and the default example's race (every default
strategy at its defaults, auto widths included; medians of ``--repeats`` runs after a warm-up, each against
greedy in the same run). Prints one table; ``--json`` keeps the numbers.

    python benchmarks/bench_default_comparison.py --repeats 3 --json benchmarks/results/default-comparison-cpu.json
"""

from __future__ import annotations

import argparse
import statistics

from common import DEFAULT_PROMPT, write_json  # first: repository root on sys.path

from decoding.harness.pays import verdicts
from decoding.harness.runner import encode_prompt, run_comparison
from decoding.runtime.head import prophet_for
from decoding.runtime.kernel_choice import cpu_label
from decoding.runtime.models import default_target, load_model, load_presets
from decoding.runtime.pair import ModelPair
from decoding.runtime.routes import versions
from decoding.runtime.widths import machine_curve
from web.settings import DEFAULT_STRATEGIES

PROMPT = DEFAULT_PROMPT      # the app's default example


def race(lm, strategies: list[str], repeats: int, max_new: int) -> dict:
    pair = ModelPair(lm, prophet=prophet_for(lm))
    ids = encode_prompt(lm.tokenizer, PROMPT, chat=True)
    plan = [(name, {}) for name in strategies]
    run_comparison(ids, pair, plan, max_new_tokens=max_new, warmup=True, trace=False)
    speed: dict = {name: [] for name in strategies}
    same: dict = {}
    for _ in range(repeats):
        results = run_comparison(ids, pair, plan, max_new_tokens=max_new, warmup=False, trace=False)
        greedy = results[0]
        for r in results[1:]:
            speed[r.strategy].append(greedy.wall_s / r.wall_s)
            same[r.strategy] = bool(r.matches_greedy)
    return {"speedup": {k: statistics.median(v) for k, v in speed.items()}, "runs": speed, "equal_greedy": same}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    presets = load_presets()
    strategies = [s for s in DEFAULT_STRATEGIES if s != "greedy"]
    out = {"cpu": cpu_label(), "prompt": PROMPT, "versions": {}}
    print(f"CPU: {out['cpu']}; the default example, {args.max_new_tokens} tokens, medians of {args.repeats}")
    print(f"{'version':34s} {'per path':>9s}  " + "  ".join(f"{s:>26s}" for s in strategies))
    for name in versions(default_target(), presets):
        lm = load_model(name)
        machine_curve(lm)                       # the first forwards of each width build their kernels
        lm.state.forward_cost.clear()
        curve = machine_curve(lm)               # timed as the app times it at start
        told = {v.strategy: v for v in verdicts(curve, strategies)}
        raced = race(lm, strategies, args.repeats, args.max_new_tokens)
        cells = [f"{'kept' if told[s].pays else 'left out'} {told[s].speedup:.2f}× / raced {raced['speedup'][s]:.2f}×"
                 for s in strategies]
        print(f"{name:34s} {curve.per_path_ms:7.2f}ms  " + "  ".join(f"{c:>26s}" for c in cells))
        out["versions"][name] = {"curve": curve.record(), "per_path_ms": curve.per_path_ms,
                                 "predicted": {s: told[s].speedup for s in strategies},
                                 "kept": [s for s in strategies if told[s].pays], **raced}
    if args.json:
        write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
