"""Which example prompt gives every drafter of the default comparison something to draft? The page's default comparison
(and suffix decoding beside it) raced on a few of the example prompts (presets/prompts.yaml), in the served config of
the default model, each strategy against greedy in the same run: median speed-up over ``--repeats`` runs after a
warm-up, and whether each output equals greedy's (it must). The page's default example is the prompt the start judges
the default comparison on (``decoding/harness/examples.py``): a chat question leaves prompt lookup and lookahead
nothing to copy, a task on a given text gives every drafter something.

    python benchmarks/bench_default_example.py [--config "smollm2-135m-instruct-w8a8|compiled"] [--repeats 3] \\
        [--json benchmarks/results/default-example-zen5.json]

``--drift SECONDS`` races only the default example, one run of each strategy after another, for that long, and
prints every run's speed-ups and their range: how far a verdict raced once can sit from the same race a minute
later in the same process.
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import default_race, write_json  # first: repository root on sys.path

from decoding.harness.examples import DEFAULT_EXAMPLE, default_example, example_prompts
from decoding.runtime import compiled, routes
from decoding.runtime.kernel_choice import cpu_label
from decoding.runtime.models import load_model
from decoding.runtime.warmup import warm

# (category, index) of presets/prompts.yaml: a chat question, three code edits, three summaries (the default example
# among them, marked in the table)
PROMPTS = (("chat", 0), ("code", 2), ("code", 4), ("code", 7), ("summarization", 0), ("summarization", 1),
           ("summarization", 2))
STRATEGIES = ("prophet", "prompt_lookup", "lookahead", "suffix")
CONFIG = "smollm2-135m-instruct-w8a8|compiled"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=CONFIG, help=f"PRESET|eager or PRESET|compiled (default {CONFIG}: what the "
                                                       "start serves on an AMD EPYC Zen 5)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--drift", type=float, default=0.0, metavar="SECONDS",
                    help="race the default example over and over for this long (one run each) instead")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.repeats < 1 or not 1 <= args.max_new_tokens <= 512 or args.drift < 0:
        ap.error("--repeats must be >= 1, --max-new-tokens in 1..512 and --drift >= 0")
    try:
        config = routes.Config.parse(args.config)
    except ValueError:
        ap.error(f"--config takes PRESET|eager or PRESET|compiled, got {args.config!r}")
    lm = load_model(config.preset)
    fast = config.compiled
    if fast:
        reason = compiled.enable(lm)
        if reason is not None:
            ap.error(f"{config.label} cannot be compiled here: {reason}")
        warm(lm)
    if args.drift > 0:
        return drift(lm, fast, default_example()[1], args)
    prompts = example_prompts()
    out = {"cpu": cpu_label(), "config": config.key, "repeats": args.repeats,
           "max_new_tokens": args.max_new_tokens, "default_example": list(DEFAULT_EXAMPLE), "rows": [],
           "measured_at": time.strftime("%Y-%m-%d")}
    print(f"CPU: {out['cpu']}; {out['config']}; {args.max_new_tokens} tokens, medians of {args.repeats}")
    print("| prompt | greedy tok/s | " + " | ".join(STRATEGIES) + " |")
    print("|---|---:|" + "---:|" * len(STRATEGIES))
    for category, index in PROMPTS:
        got = default_race(lm, [(name, {"fast": fast}) for name in STRATEGIES], args.repeats, args.max_new_tokens,
                           prompt=prompts[category][index])
        row = {"prompt": f"{category}:{index}", "default": (category, index) == tuple(DEFAULT_EXAMPLE),
               "greedy_tok_s": round(got["greedy_tok_s"], 1),
               "speedup": {k: round(v, 3) for k, v in got["speedup"].items()}, "equal_greedy": got["equal_greedy"]}
        out["rows"].append(row)
        mark = " (the default example)" if row["default"] else ""
        print(f"| {row['prompt']}{mark} | {row['greedy_tok_s']:.0f} | " + " | ".join(
            f"{row['speedup'][s]:.2f}×" + ("" if row["equal_greedy"][s] else " (differs)") for s in STRATEGIES)
            + " |", flush=True)
    if args.json:
        write_json(args.json, out)
    return out


def drift(lm, fast: bool, prompt: str, args: argparse.Namespace) -> dict:
    """``--drift``: one race of the default example after another for ``args.drift`` seconds (a warm-up first)."""
    plan = [(name, {"fast": fast}) for name in STRATEGIES]
    default_race(lm, plan, 1, args.max_new_tokens, prompt=prompt)
    runs, t0 = [], time.monotonic()          # the clock starts after the warm-up: every run counted is timed
    while time.monotonic() - t0 < args.drift:
        got = default_race(lm, plan, 1, args.max_new_tokens, prompt=prompt)
        runs.append({"at_s": round(time.monotonic() - t0, 1), "greedy_tok_s": round(got["greedy_tok_s"], 1),
                     "speedup": {k: round(v, 3) for k, v in got["speedup"].items()}})
        print(f"{runs[-1]['at_s']:6.0f} s  greedy {runs[-1]['greedy_tok_s']:.0f} tok/s  " + "  ".join(
            f"{k} {v:.2f}×" for k, v in runs[-1]["speedup"].items()), flush=True)
    speeds = {k: [r["speedup"][k] for r in runs] for k in STRATEGIES}
    summary = {k: {"min": min(v), "median": statistics.median(v), "max": max(v)} for k, v in speeds.items()} if runs else {}
    for k, v in summary.items():
        print(f"{k}: {v['min']:.2f}-{v['max']:.2f}× (median {v['median']:.2f}) over {len(runs)} runs")
    out = {"cpu": cpu_label(), "config": args.config, "example": "%s:%d" % DEFAULT_EXAMPLE, "drift_s": args.drift,
           "max_new_tokens": args.max_new_tokens, "runs": runs, "summary": summary,
           "measured_at": time.strftime("%Y-%m-%d")}
    if args.json:
        write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
