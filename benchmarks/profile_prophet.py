"""Where a prophet step spends its time on this machine, and what it costs against a greedy step, from the
runs' own events.

    python benchmarks/profile_prophet.py [--per-category 2] [--variant fixed8:tree_nodes=8]
    python benchmarks/profile_prophet.py --attention sdpa_gqa_cpu --attention sdpa   # an A/B, interleaved
    python benchmarks/profile_prophet.py --target smollm2-135m-instruct-bf16w       # bfloat16 weights (AMX)
    python benchmarks/profile_prophet.py --target smollm2-135m-instruct-bf16w --compiled   # the compiled forward

Runs the prophet (traced) on prompts of presets/bench_unseen.yaml after a warm-up and sums its events:
``StepTiming`` splits every propose-verify step into drafting, the target's verify forward and the rest
(acceptance, cache compaction, committing: bookkeeping); ``ForwardPass`` gives the head's calls (how many,
how many positions, how long) and the target's verify forwards by width. Greedy runs on the same prompts,
interleaved with the prophet's, give a greedy step (its one-position forwards). Prints ms per step, shares,
and a prophet step over a greedy step (issue 26's measure).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from decoding.events import ForwardPass, StepTiming  # noqa: E402
from decoding.harness.bench import load_prompt_set  # noqa: E402
from decoding.harness.runner import encode_prompt, run_one  # noqa: E402
from decoding.runtime.gqa_attention import NAME as GROUPED  # noqa: E402
from decoding.runtime.kernel_choice import cpu_label  # noqa: E402
from decoding.runtime.models import PRESETS_DIR, load_model  # noqa: E402
from decoding.runtime.pair import ModelPair  # noqa: E402
from decoding.strategies import get_strategy  # noqa: E402


def profile(events: list, wall_s: float) -> dict:
    steps = [e for e in events if isinstance(e, StepTiming)]
    fwd = [e for e in events if isinstance(e, ForwardPass)]
    draft_calls = [e for e in fwd if e.model == "draft"]
    verify = [e for e in fwd if e.model == "target" and e.kind != "prefill"]
    by_width: dict[int, list[float]] = defaultdict(list)
    for e in verify:
        by_width[e.positions].append(e.ms)
    n = max(1, len(steps))
    return {"steps": len(steps), "wall_ms": wall_s * 1e3,
            "prefill_ms": sum(e.ms for e in fwd if e.kind == "prefill"),
            "draft_ms": sum(s.draft_ms for s in steps), "verify_ms": sum(s.verify_ms for s in steps),
            "overhead_ms": sum(s.overhead_ms for s in steps),
            "head_calls_per_step": len(draft_calls) / n, "head_call_ms": statistics.fmean(e.ms for e in draft_calls)
            if draft_calls else 0.0, "head_positions_per_step": sum(e.positions for e in draft_calls) / n,
            "verify_width": statistics.fmean(e.positions for e in verify) if verify else 0.0,
            "verify_ms_by_width": {w: statistics.median(v) for w, v in sorted(by_width.items())},
            "accepted_per_step": statistics.fmean(s.accepted for s in steps) if steps else 0.0}


def greedy_steps(events: list) -> list[float]:
    """The ms of each of a greedy run's one-position decode forwards (its events)."""
    return [e.ms for e in events if isinstance(e, ForwardPass) and e.model == "target" and e.kind != "prefill"
            and e.positions == 1]


def _accumulate(total: dict, widths: dict, prof: dict) -> None:
    for k, v in prof.items():
        if k == "verify_ms_by_width":
            for w, ms in v.items():
                widths[w].append(ms)
        elif k in ("head_call_ms", "verify_width", "head_calls_per_step", "head_positions_per_step",
                   "accepted_per_step"):
            total[k] += v * prof["steps"]
        else:
            total[k] += v


def report(title: str, total: dict, widths: dict, greedy_ms: list[float]) -> dict:
    """Print one configuration's per-step split; returns its prophet step and greedy step in ms."""
    steps = max(1.0, total["steps"])
    print(f"{title}, {int(steps)} steps (traced: tracing adds its own time to the bookkeeping)")
    for k in ("draft_ms", "verify_ms", "overhead_ms"):
        print(f"  {k:12s} {total[k] / steps:7.2f} ms/step  {100 * total[k] / total['wall_ms']:5.1f}% of wall")
    rest = total["wall_ms"] - total["draft_ms"] - total["verify_ms"] - total["overhead_ms"]
    print(f"  {'other':12s} {rest / steps:7.2f} ms/step  {100 * rest / total['wall_ms']:5.1f}% (prefill "
          f"{total['prefill_ms'] / steps:.2f} ms/step, the loop outside the steps)")
    print(f"  head calls per step {total['head_calls_per_step'] / steps:.2f}, "
          f"{total['head_call_ms'] / steps:.2f} ms each, {total['head_positions_per_step'] / steps:.1f} positions "
          f"per step; verify width {total['verify_width'] / steps:.1f}; accepted per step "
          f"{total['accepted_per_step'] / steps:.2f}")
    step = (total["draft_ms"] + total["verify_ms"] + total["overhead_ms"]) / steps
    g_step = statistics.fmean(greedy_ms) if greedy_ms else float("nan")
    print(f"  a prophet step {step:.2f} ms (drafting + verify forward + bookkeeping); a greedy step "
          f"{g_step:.2f} ms (mean of {len(greedy_ms)} one-position forwards of greedy runs on the same prompts, "
          f"interleaved) -> {step / g_step:.2f}x a greedy step")
    print("  verify forward ms by width: " + ", ".join(f"{w}: {statistics.median(v):.1f}"
                                                     for w, v in sorted(widths.items()) if len(v) >= 3))
    return {"step_ms": step, "greedy_step_ms": g_step}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=Path, default=PRESETS_DIR / "bench_unseen.yaml")
    p.add_argument("--per-category", type=int, default=2)
    p.add_argument("--variant", default="defaults:", help="NAME:KEY=V[,KEY=V] prophet parameters")
    p.add_argument("--attention", action="append",
                   help=f"the target's attention implementation (default: what load_model set, {GROUPED}); "
                        f"twice, e.g. --attention {GROUPED} --attention sdpa, for an interleaved A/B")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--compiled", action="store_true",
                   help="the compiled CPU forward (runtime/compiled.py) for greedy and the prophet (fast=true)")
    p.add_argument("--target", default="smollm2-135m-instruct",
                   help="the target preset, e.g. smollm2-135m-instruct-bf16w (bfloat16 weights on AMX)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    lm = load_model(args.target)
    original = lm.model.config._attn_implementation
    attentions = args.attention or [original]
    strategy = get_strategy("prophet")
    name, _, rest = args.variant.partition(":")
    given = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
    if args.compiled:
        from decoding.runtime import compiled
        from decoding.runtime.warmup import warm
        reason = compiled.enable(lm)
        if reason:
            raise SystemExit(f"the compiled path is off here: {reason}")
        warm(lm)
        given.setdefault("fast", "true")
    params = strategy.parse(given)
    pair = ModelPair(lm)
    prompts = load_prompt_set(args.prompts, None, args.per_category)
    greedy = get_strategy("greedy")
    g_params = greedy.parse({"fast": "true"} if args.compiled else {})
    for impl in attentions:
        lm.model.set_attn_implementation(impl)
        for s, sp in ((greedy, g_params), (strategy, params)):
            run_one(s, sp, encode_prompt(lm.tokenizer, prompts[0][1], chat=True), pair, max_new_tokens=16)
    totals: dict = {a: defaultdict(float) for a in attentions}
    widths: dict = {a: defaultdict(list) for a in attentions}
    greedy_ms: dict = {a: [] for a in attentions}     # a greedy step: one one-position forward, same process
    for i, (_, text) in enumerate(prompts):
        ids = encode_prompt(lm.tokenizer, text, chat=True)
        for impl in (attentions if i % 2 == 0 else attentions[::-1]):
            lm.model.set_attn_implementation(impl)
            _, _, g_events = run_one(greedy, g_params, ids, pair, max_new_tokens=args.max_new_tokens)
            greedy_ms[impl] += greedy_steps(g_events)
            _, seconds, events = run_one(strategy, params, ids, pair, max_new_tokens=args.max_new_tokens)
            _accumulate(totals[impl], widths[impl], profile(events, seconds))
    lm.model.set_attn_implementation(original)
    return {impl: report(f"CPU: {cpu_label()}, {torch.get_num_threads()} threads; prophet {name} on {len(prompts)} "
                         f"prompts, {lm.name}, attention {impl}", totals[impl], widths[impl], greedy_ms[impl])
            for impl in attentions}


if __name__ == "__main__":
    main()
