"""Shared helpers for the benchmark scripts: timing, medians, environment, output."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from decoding.harness.bench import load_prompt_set  # noqa: E402
from decoding.harness.examples import default_example  # noqa: E402
from decoding.harness.runner import encode_prompt, run_comparison  # noqa: E402
from decoding.runtime.head import prophet_for  # noqa: E402
from decoding.runtime.kernel_choice import cpu_label  # noqa: E402
from decoding.runtime.models import PRESETS_DIR, LoadedModel, load_model  # noqa: E402
from decoding.runtime.pair import ModelPair  # noqa: E402

UNSEEN_PROMPTS = PRESETS_DIR / "bench_unseen.yaml"


def timed(fn: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    """Run ``fn`` once between device synchronisations; (result, seconds)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, time.perf_counter() - t0


def median(values: list[float]) -> float:
    return statistics.median(values)


def filler_ids(vocab_size: int, n: int) -> list[int]:
    """``n`` spread-out token ids below ``vocab_size``: a context to time forwards after (no meaning needed)."""
    return [(100 + (i * 7919) % 20000) % vocab_size for i in range(n)]


def interleaved_ms(names: list[str], repeats: int, call: Callable[[str], Any],
                   after: Callable[[str], Any] | None = None) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Time ``call(name)`` for every name, ``repeats`` rounds after a warm-up round, the order flipping every
    round; ``after(name)`` runs untimed after each call (e.g. crop the forward's positions off again).
    Returns each name's milliseconds and its last call's result."""
    times: dict[str, list[float]] = {n: [] for n in names}
    last: dict[str, Any] = {}
    for r in range(repeats + 1):                         # the first round warms up
        for n in (names if r % 2 else names[::-1]):
            t0 = time.perf_counter()
            last[n] = call(n)
            if r:
                times[n].append((time.perf_counter() - t0) * 1e3)
            if after is not None:
                after(n)
    return times, last


def gain_summary(gains: list[float]) -> dict:
    """Median, geometric mean, smallest and largest of per-prompt ratios."""
    return {"median_gain": statistics.median(gains), "geomean_gain": statistics.geometric_mean(gains),
            "min_gain": min(gains), "max_gain": max(gains)}


def generate_new_tokens(lm: Any, prompt_ids: list[int], max_new_tokens: int, **kwargs: Any) -> list[int]:
    """transformers' generate, new tokens only, cut after the first EOS."""
    from decoding.harness.bench import hf_generate
    kwargs.pop("do_sample", None)
    return hf_generate(lm, prompt_ids, max_new_tokens, **kwargs)


def remeasure_kernels(lm: Any, spec: str, repeats: int) -> None:
    """Time the CPU linear kernels again for ``lm`` and replace its cached choice (decoding/runtime/kernel_choice.py)."""
    from decoding.runtime.kernel_choice import cache_file, configure
    from decoding.runtime.models import cache_root, resolve_source
    kind = resolve_source(spec)[2]
    lm.state.kernel_choice = configure(lm.model, "auto", name=lm.name, remeasure=True, repeats=repeats,
                                           budget_s=float("inf"),
                                           file=cache_file(cache_root(), lm.name, kind == "bundled"))


def add_prompt_args(p: argparse.ArgumentParser, default: Path = UNSEEN_PROMPTS) -> None:
    """``--prompts FILE``, ``--category NAME[:I,J]`` (repeatable) and ``--per-category N``: which prompts of a
    prompt set run (:func:`prompt_set` reads them)."""
    p.add_argument("--prompts", type=Path, default=default)
    p.add_argument("--category", action="append", help="only these categories (NAME or NAME:I,J)")
    p.add_argument("--per-category", type=int, default=None)


def add_run_args(p: argparse.ArgumentParser, target: str = "smollm2-135m-instruct") -> None:
    """``--max-new-tokens``, ``--threads``, ``--target`` and ``--json OUT``: what every prompt-set script takes."""
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--target", default=target)
    p.add_argument("--json", type=Path, default=None)


def prompt_set(args: argparse.Namespace) -> list[tuple[str, str]]:
    """[(category, text)] the arguments of :func:`add_prompt_args` pick."""
    return load_prompt_set(args.prompts, args.category, args.per_category)


def keyvals(text: str) -> dict[str, str]:
    """``"K=V,K=V"`` -> {K: V} (an empty text -> {})."""
    return {k: v for k, v in (kv.split("=", 1) for kv in text.split(",") if kv)}


def named_keyvals(specs: list[str]) -> dict[str, dict[str, str]]:
    """``["NAME:K=V,K=V", "OTHER:"]`` -> {NAME: {K: V}, OTHER: {}}."""
    return {name: keyvals(rest) for name, _, rest in (spec.partition(":") for spec in specs)}


def machine_label(lm: LoadedModel) -> str:
    """The machine a model runs on, for the output and the JSON: the GPU and dtype, or the CPU and its threads."""
    if lm.device.type == "cuda":
        gpu = torch.cuda.get_device_name(lm.device)
        where = f"{gpu} (GPU, {str(lm.dtype).replace('torch.', '')}), host {cpu_label()}"
    else:
        where = f"{cpu_label()}, {torch.get_num_threads()} threads"
    return f"{where}, torch {torch.__version__}"


def start(args: argparse.Namespace, **load: Any) -> tuple[LoadedModel, str, list[tuple[str, str]]]:
    """Set ``--threads``, load ``--target`` (``load``: device, dtype), print the machine and the load average;
    (target, machine label, prompts)."""
    torch.set_num_threads(args.threads)
    target = load_model(args.target, **load)
    machine = machine_label(target)
    print(f"machine: {machine}, load average {os.getloadavg()[0]:.1f} at start", flush=True)
    return target, machine, prompt_set(args)


def print_finish(machine: str, prompts: int, max_new: int, started: float, repeats: Optional[int] = None) -> None:
    """The closing line: machine, how much ran, how long it took and the load average at the end."""
    counted = f"{prompts} prompts, {max_new} new tokens" + (f", {repeats} repeats" if repeats is not None else "")
    print(f"\nmachine: {machine}; {counted}, {time.time() - started:.0f} s, "
          f"load average {os.getloadavg()[0]:.1f} at the end")


def versus_greedy(result: Any, greedy_ids: list[int], greedy_s: list[float], method_s: list[float]) -> dict:
    """A method's run against greedy's on one prompt: the speed-up (greedy's median wall time over the method's),
    tokens per target forward and whether its tokens equal greedy's."""
    return {"speedup": statistics.median(greedy_s) / statistics.median(method_s),
            "tokens_per_forward": len(result.token_ids) / max(1, result.target_forwards),
            "equal": result.token_ids == greedy_ids}


def prompt_row(category: str, text: str, methods: list[str], results: dict, times: dict) -> dict:
    """One prompt's row: each method's run (``results[m]``, wall times ``times[m]``) :func:`versus_greedy`
    (``results["greedy"]``, ``times["greedy"]``)."""
    ref = results["greedy"].token_ids
    return {"category": category, "prompt": text[:80], "tokens": len(ref),
            "methods": {m: versus_greedy(results[m], ref, times["greedy"], times[m]) for m in methods}}


def speedup_line(i: int, category: str, methods: dict[str, dict]) -> str:
    """One prompt's line: each method's speed-up and tokens per target forward, marked where it differs."""
    return f"{i:2d} {category:10s} " + " ".join(
        f"{m}:{v['speedup']:.2f}x/{v['tokens_per_forward']:.2f}{'' if v['equal'] else ' (DIFFERS)'}"
        for m, v in methods.items())


def by_category(rows: list[dict]) -> Iterator[tuple[str, list[dict]]]:
    """(category, its rows) in first-seen order, then ("all", every row)."""
    for category in [*dict.fromkeys(r["category"] for r in rows), "all"]:
        yield category, [r for r in rows if category in ("all", r["category"])]


def write_json(path: str | Path | None, doc: dict) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)
        print(f"wrote {path}")


DEFAULT_PROMPT = default_example()[1]      # the app's default example (decoding/harness/examples.py)


def default_race(lm: Any, runs: list, repeats: int, max_new: int, prompt: str = DEFAULT_PROMPT) -> dict:
    """The app's default example raced ``repeats`` times after a warm-up (``runs``: (strategy, params); greedy
    is added first, in the runs' mode): each strategy's median speedup over greedy, greedy's tokens/s, whether
    each output equals greedy's, and a prophet step over a greedy step (wall time per target forward)."""
    pair = ModelPair(lm, prophet=prophet_for(lm))
    ids = encode_prompt(lm.tokenizer, prompt, chat=True)
    run_comparison(ids, pair, runs, max_new_tokens=max_new, warmup=True, trace=False)
    speed: dict = {name: [] for name, _ in runs}
    step: list = []
    same, tps = {}, []
    for _ in range(repeats):
        results = run_comparison(ids, pair, runs, max_new_tokens=max_new, warmup=False, trace=False)
        greedy = results[0]
        tps.append(len(greedy.token_ids) / greedy.wall_s)
        for r in results[1:]:
            speed[r.strategy].append(greedy.wall_s / r.wall_s)
            same[r.strategy] = bool(r.matches_greedy)
            if r.strategy == "prophet":
                step.append((r.wall_s / r.target_forwards) / (greedy.wall_s / greedy.target_forwards))
    return {"greedy_tok_s": statistics.median(tps), "ids": ids,
            "speedup": {k: statistics.median(v) for k, v in speed.items()}, "runs": speed,
            "equal_greedy": same, "prophet_step_over_greedy_step": statistics.median(step) if step else None}

