"""The prophet's step shape against greedy in one config of the default model: trees of several sizes and chains of
several lengths, on the default example and the unseen prompts (presets/bench_unseen.yaml), in one process.

    python benchmarks/bench_prophet_shapes.py [--config "smollm2-135m-instruct-fp16w|compiled"] [--per-category 2]

On a CPU where a wide forward is compute-bound (BENCHMARKS.md, "the compute floor") the default 8-node tree verifies
more positions than it pays for, and a short chain or a small tree is the better step. Every shape is raced against
greedy in the config's own mode (compiled configs with ``fast``), interleaved per prompt after a warm-up: speed-up =
greedy's wall time / the shape's (median of ``--repeats`` on the default example, of ``--unseen-repeats`` on each
unseen prompt), tokens per target forward (a count), and whether the output equals greedy's (it must). Prints one
line per prompt, then per shape the median over prompts; the CPU is named in the output and the JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEFAULT_PROMPT, ROOT, prophet_for  # noqa: E402  (first: the repository root on sys.path)

import torch  # noqa: E402

from decoding.harness.bench import load_prompt_set  # noqa: E402
from decoding.harness.runner import encode_prompt, run_comparison  # noqa: E402
from decoding.runtime import compiled, routes  # noqa: E402
from decoding.runtime.kernel_choice import cpu_label  # noqa: E402
from decoding.runtime.models import PRESETS_DIR, load_model  # noqa: E402
from decoding.runtime.pair import ModelPair  # noqa: E402
from decoding.runtime.warmup import warm  # noqa: E402

SHAPES = {"tree8": {}, "tree4": {"tree_nodes": 4}, "tree2": {"tree_nodes": 2},
          "chain1": {"tree": False, "draft_tokens": 1}, "chain2": {"tree": False, "draft_tokens": 2},
          "chain3": {"tree": False, "draft_tokens": 3}, "chain4": {"tree": False, "draft_tokens": 4}}


def parse_shape(text: str) -> tuple[str, dict]:
    """``NAME:KEY=V[,KEY=V]`` -> (name, prophet parameters), the values parsed by the prophet's own parser."""
    name, _, spec = text.partition(":")
    if not name or not spec:
        raise argparse.ArgumentTypeError(f"--shape takes NAME:KEY=V[,KEY=V], got {text!r}")
    from decoding.strategies import registry
    raw = dict(item.split("=", 1) for item in spec.split(",") if "=" in item)
    registry()["prophet"].parse(raw)                # refuses a bad key or value by name, before any work
    return name, raw


def race(lm, fast: bool, shapes: dict, prompts: list, repeats: int, unseen_repeats: int, max_new: int) -> dict:
    pair = ModelPair(lm, prophet=prophet_for(lm))
    plan = [("greedy", {"fast": fast})] + [("prophet", {"fast": fast, **p}) for p in shapes.values()]
    rows = []
    for label, text in prompts:
        ids = encode_prompt(lm.tokenizer, text, chat=True)
        run_comparison(ids, pair, plan, max_new_tokens=max_new, warmup=True, trace=False)
        speed: dict = {name: [] for name in shapes}
        for _ in range(repeats if label == "default" else unseen_repeats):
            got = run_comparison(ids, pair, plan, max_new_tokens=max_new, warmup=False, trace=False)
            for name, r in zip(shapes, got[1:]):
                speed[name].append(got[0].wall_s / r.wall_s)
        row = {"prompt": label, "greedy_tok_s": len(got[0].token_ids) / got[0].wall_s,
               "shapes": {name: {"speedup": statistics.median(speed[name]),
                                 "tokens_per_forward": len(r.token_ids) / max(1, r.target_forwards),
                                 "equal_greedy": bool(r.matches_greedy)} for name, r in zip(shapes, got[1:])}}
        rows.append(row)
        print(f"{label:10s} greedy {row['greedy_tok_s']:5.1f} tok/s  " + "  ".join(
            f"{n} {v['speedup']:.2f}x/{v['tokens_per_forward']:.2f}" + ("" if v["equal_greedy"] else " DIFFERS")
            for n, v in row["shapes"].items()), flush=True)
    summary = {name: {"median_speedup": statistics.median(r["shapes"][name]["speedup"] for r in rows),
                      "median_tokens_per_forward": statistics.median(r["shapes"][name]["tokens_per_forward"]
                                                                     for r in rows),
                      "equal_greedy": sum(r["shapes"][name]["equal_greedy"] for r in rows)} for name in shapes}
    return {"rows": rows, "summary": summary}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="smollm2-135m-instruct-fp16w|compiled", help="PRESET|eager or PRESET|compiled")
    ap.add_argument("--shape", action="append", type=parse_shape, default=None,
                    help="NAME:KEY=V[,KEY=V] prophet parameters (default: trees of 8, 4, 2 nodes, chains of 1-4)")
    ap.add_argument("--per-category", type=int, default=2, help="unseen prompts per category (0: the default example)")
    ap.add_argument("--category", action="append", default=None, help="only these categories (NAME or NAME:I,J)")
    ap.add_argument("--repeats", type=int, default=3, help="races on the default example")
    ap.add_argument("--unseen-repeats", type=int, default=1, help="races on each unseen prompt")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "prophet-shapes-cpu.json"))
    args = ap.parse_args(argv)
    config = routes.Config.parse(args.config)
    shapes = dict(args.shape) if args.shape else SHAPES
    lm = load_model(config.preset)
    if config.compiled:
        reason = compiled.enable(lm)
        if reason is not None:
            raise SystemExit(f"{config.label} cannot be compiled here: {reason}")
        warm(lm)
    prompts = [("default", DEFAULT_PROMPT)]
    if args.per_category or args.category:
        prompts += load_prompt_set(PRESETS_DIR / "bench_unseen.yaml", categories=args.category,
                                   per_category=args.per_category or None)
    print(f"CPU: {cpu_label()}; {torch.get_num_threads()} threads; {config.label}; {len(prompts)} prompts", flush=True)
    doc = {"cpu": cpu_label(), "config": config.key, "threads": torch.get_num_threads(), "torch": torch.__version__,
           "max_new_tokens": args.max_new_tokens, "measured_at": time.strftime("%Y-%m-%d"),
           **race(lm, config.compiled, shapes, prompts, args.repeats, args.unseen_repeats, args.max_new_tokens)}
    for name, s in doc["summary"].items():
        print(f"{name:8s} median {s['median_speedup']:.2f}x greedy, {s['median_tokens_per_forward']:.2f} tokens/forward, "
              f"{s['equal_greedy']}/{len(prompts)} equal greedy", flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    if config.compiled:
        compiled.disable(lm)
    return doc


if __name__ == "__main__":
    main()
