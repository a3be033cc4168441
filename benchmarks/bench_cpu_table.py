"""The CPU table of BENCHMARKS.md: one row per (CPU, config of the default model), every figure measured here.

    python benchmarks/bench_cpu_table.py [--repeats 3] [--unseen 4] [--json benchmarks/results/cpu-table.json]

For every config the app can serve on this machine (``runtime/routes.candidates``: each version of the default
model that loads here, eager, and compiled where a C++ compiler exists and its linears compile), in one process:

* forward cost by width: a verify forward over 1, 4 and 16 positions (``forward_cost``, the curve the app times),
  and the 16-position forward's cost in one-position forwards;
* the cores' measured multiply-add rates (``attention_kernels.fma_gflops``: registers only, and with one operand
  from L1 per multiply-add as a product's inner loop has) and the floor the second puts under a 16-position
  forward: its products' operations at that rate (``forward_cost.compute_floor_ms``), in one-position forwards,
  so a c(16)/c(1) that no kernel can beat here reads as such; for the int8 version the rate is its product's own
  inner step (``attention_kernels.i8_gmacs``: VNNI's ``vpdpbusd``, or AVX2's four-instruction step), so its floor
  counts byte multiply-adds, not float32 ones;
* greedy as the race runs it: tokens/s and its median decode step (``harness/steps``), and transformers'
  ``generate`` on the same loaded model (greedy / ``generate``, each run's seconds a token: above 1, ours is
  faster);
* the prophet's step in greedy steps (its wall time per target forward / greedy's), on the default example;
* the default race: every default strategy on the default example, median speed-up over ``--repeats`` runs
  (each against greedy in the same run and the same mode), and whether each equals greedy;
* with ``--unseen N``: the prophet's median speed-up on N prompts of each category of presets/bench_unseen.yaml, with
  the library's default step (an 8-node tree) and with the shape the app's start would choose for the config
  (``app_shape``: every shape's step timed on the default example, as the start does; the app's own mode).

The rows of the JSON are keyed by CPU label and config; a run replaces this CPU's rows and keeps every other
CPU's (the table keeps the CPUs no longer reached). It prints the whole table as Markdown.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Optional

from common import DEFAULT_PROMPT, ROOT, default_race  # first: repository root on sys.path

import torch

from decoding.harness.bench import load_prompt_set
from decoding.harness.examples import DEFAULT_EXAMPLE
from decoding.harness.pays import ShapeChoice, choose_prophet_shape
from decoding.harness.runner import encode_prompt, run_comparison
from decoding.harness.steps import greedy_steps_ms
from decoding.runtime import attention_kernels, compiled, routes
from decoding.runtime.forward_cost import compute_floor_ms, forward_cost
from decoding.runtime.head import prophet_for
from decoding.runtime.kernel_choice import cpu_label
from decoding.runtime.models import PRESETS_DIR, default_target, load_model, load_presets
from decoding.runtime.pair import ModelPair
from decoding.runtime.warmup import warm
from web.settings import DEFAULT_STRATEGIES
from web.startup import shape_steps

PROMPT = DEFAULT_PROMPT      # the app's default example
CHAT_EXAMPLE = "chat:0"      # the default example of the rows measured before 2026-11-30 (they name none)
WIDTHS = (1, 4, 16)


def _race(lm, fast: bool, strategies: list[str], repeats: int, max_new: int, prompt: str = PROMPT,
          prophet: Optional[dict] = None) -> dict:
    runs = [(name, {"fast": fast, **((prophet or {}) if name == "prophet" else {})}) for name in strategies]
    got = default_race(lm, runs, repeats, max_new, prompt=prompt)
    return {"speedup": got["speedup"], "prophet_step_in_greedy_steps": got["prophet_step_over_greedy_step"],
            "greedy_tok_s": got["greedy_tok_s"], "equal_greedy": got["equal_greedy"]}


def _generate_ratio(lm, fast: bool, repeats: int, max_new: int) -> float:
    pair, ids = ModelPair(lm), encode_prompt(lm.tokenizer, PROMPT, chat=True)
    plan = [("greedy", {"fast": fast}), ("hf_greedy", {})]
    run_comparison(ids, pair, plan, max_new_tokens=max_new, warmup=True, trace=False)
    ratios = []
    for _ in range(repeats):
        ours, hf = run_comparison(ids, pair, plan, max_new_tokens=max_new, warmup=False, trace=False)
        ratios.append(_per_token(hf) / _per_token(ours))
    return statistics.median(ratios)


def _per_token(run) -> float:
    """A run's seconds a token. ``generate`` runs the model eagerly and ours in the race's mode: an int8 version's
    compiled greedy writes another text than its eager one (34 tokens against 57 on the summary), so whole runs'
    times are not comparable (that ratio read 2.96 on the summary, 1.81 on the bug fix)."""
    return run.wall_s / max(1, len(run.token_ids))


def _unseen(lm, fast: bool, per_category: int, max_new: int, prophet: Optional[dict] = None) -> dict:
    chosen = [text for _, text in load_prompt_set(PRESETS_DIR / "bench_unseen.yaml", per_category=per_category)]
    speedups, same = [], 0
    for text in chosen:
        got = _race(lm, fast, ["prophet"], 1, max_new, prompt=text, prophet=prophet)
        speedups.append(got["speedup"]["prophet"])
        same += int(got["equal_greedy"]["prophet"])
    return {"prompts": len(chosen), "median": statistics.median(speedups), "equal_greedy": same}


def app_shape(lm, fast: bool, curve) -> ShapeChoice:
    """The prophet's step shape the app's start would choose for this config: every shape's step timed as the start
    times them (``web/startup.shape_steps``), and ``pays.choose_prophet_shape`` on them and the config's curve (the
    row keeps its reason: every shape's timed step)."""
    steps = shape_steps(lm, ModelPair(lm, prophet=prophet_for(lm)), fast)
    return choose_prophet_shape(curve, steps=steps)


def fma_rates() -> tuple:
    """The cores' multiply-add rates, GFLOP/s (one operand from L1, registers only), and their rate of the int8
    product's inner step (billions of byte multiply-adds a second, ``attention_kernels.i8_gmacs``): properties of
    the CPU, not of a config, so ``main`` measures them once for every row."""
    attention_kernels.load_default()
    return (attention_kernels.fma_gflops(loads=True), attention_kernels.fma_gflops(loads=False),
            attention_kernels.i8_gmacs())


def measure(config: routes.Config, args: argparse.Namespace) -> dict:
    lm = load_model(config.preset)
    t0 = time.perf_counter()
    if config.compiled:
        reason = compiled.enable(lm)
        if reason is not None:
            return {"error": reason}
        warm(lm)
    compile_s = time.perf_counter() - t0
    fast = config.compiled
    curve = forward_cost(lm, max(WIDTHS), fast=fast)
    strategies = [s for s in DEFAULT_STRATEGIES if s != "greedy"]
    steps = greedy_steps_ms(lm, fast)
    peak, registers, i8 = getattr(args, "fma", None) or fma_rates()
    # the products' floor at the rate of the config's own arithmetic: float32 multiply-adds, or the int8 product's
    # byte multiply-adds (2 operations each, as product_flops counts them)
    rate = (2 * i8 if i8 else None) if lm.weights == "w8a8" else peak
    row = {"cpu": cpu_label(), "config": config.key, "label": config.label, "threads": torch.get_num_threads(),
           "torch": torch.__version__, "compile_s": round(compile_s, 1),
           "forward_ms": {str(w): round(curve(w), 2) for w in WIDTHS},
           "forward_16_over_1": round(curve(16) / curve(1), 3),
           "fma_gflops": None if peak is None else round(peak, 1),
           "fma_gflops_registers": None if registers is None else round(registers, 1),
           "i8_gmacs": None if i8 is None else round(i8, 1),
           "floor_16_over_1": None if rate is None else round(compute_floor_ms(lm.model, 16, rate) / curve(1), 3),
           "greedy_step_ms": round(statistics.median(steps), 2),
           "greedy_over_generate": round(_generate_ratio(lm, fast, args.repeats, args.max_new_tokens), 3),
           "example": f"{DEFAULT_EXAMPLE[0]}:{DEFAULT_EXAMPLE[1]}",     # which prompt the default race ran on
           **_race(lm, fast, strategies, args.repeats, args.max_new_tokens),
           "measured_at": time.strftime("%Y-%m-%d")}
    if args.unseen:
        row["prophet_unseen"] = _unseen(lm, fast, args.unseen, args.max_new_tokens)
        choice = app_shape(lm, fast, curve)         # the app's own mode: the shape its start would choose here
        shape = choice.shape
        row["prophet_shape"], row["prophet_shape_reason"] = shape.name, choice.reason
        row["prophet_unseen_app"] = _unseen(lm, fast, args.unseen, args.max_new_tokens, prophet=dict(shape.params))
    if config.compiled:
        compiled.disable(lm)
    return row


def _prophet_step(row: dict) -> float:
    step = row.get("prophet_step_in_greedy_steps") or (row.get("step_in_greedy_steps") or {}).get("prophet")
    return float("nan") if step is None else step


def _maybe(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def markdown(rows: list[dict]) -> str:
    strategies = [s for s in DEFAULT_STRATEGIES if s != "greedy"]
    head = ("| CPU | config | default example | c(1) ms | c(4) | c(16) | c(16)/c(1) | FMA GFLOP/s (registers / L1 operand) | c(16) floor / c(1) | greedy tok/s | greedy/generate | "
            "prophet step (greedy steps) | " + " | ".join(f"{s} (default example)" for s in strategies)
            + " | prophet, unseen | prophet, unseen, the start's shape |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if "error" in r:
            continue
        f = r["forward_ms"]
        race = " | ".join(f"{r['speedup'].get(s, float('nan')):.2f}×" + ("" if r["equal_greedy"].get(s, True)
                                                                           else " (differs)") for s in strategies)
        unseen, app = r.get("prophet_unseen"), r.get("prophet_unseen_app")
        lines.append(f"| {r['cpu']} | {r['label']} | {r.get('example', CHAT_EXAMPLE)} | {f['1']:.1f} | {f['4']:.1f} | {f['16']:.1f} | "
                     f"{r['forward_16_over_1']:.2f} | {_maybe(r.get('fma_gflops_registers'), '.0f')} / "
                     f"{_maybe(r.get('fma_gflops'), '.0f')} | "
                     f"{_maybe(r.get('floor_16_over_1'), '.2f')} | {r['greedy_tok_s']:.1f} | {r['greedy_over_generate']:.2f} | "
                     f"{_prophet_step(r):.2f} | {race} | "
                     + (f"{unseen['median']:.2f}× ({unseen['prompts']} prompts)" if unseen else "–") + " | "
                     + (f"{app['median']:.2f}× ({r['prophet_shape']})" if app else "–") + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--unseen", type=int, default=0, help="prompts per category of bench_unseen.yaml (0: none)")
    ap.add_argument("--config", action="append", default=None, help="only these configs (PRESET|eager, ...)")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "cpu-table.json"))
    args = ap.parse_args(argv)
    configs = routes.candidates(default_target(), load_presets(), can_compile=compiled.compiler_missing() is None)
    if args.config:
        configs = [routes.Config.parse(k) for k in args.config]
    path = Path(args.json)
    rows = json.loads(path.read_text())["rows"] if path.exists() else []
    print(f"CPU: {cpu_label()}; {torch.get_num_threads()} threads; configs: {', '.join(c.label for c in configs)}",
          flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    args.fma = fma_rates()
    for config in configs:
        row = measure(config, args)
        print(json.dumps(row), flush=True)
        rows = [r for r in rows if (r.get("cpu"), r.get("config")) != (row["cpu"], row["config"])] + [row]
        path.write_text(json.dumps({"rows": rows}, indent=1) + "\n")       # each row kept as soon as measured
    print(markdown(rows))
    return rows


if __name__ == "__main__":
    main()
