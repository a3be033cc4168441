"""Shared helpers for the benchmark scripts: timing, medians, environment, output."""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from decoding.harness.runner import encode_prompt, run_comparison  # noqa: E402
from decoding.runtime.head import prophet_for  # noqa: E402
from decoding.runtime.pair import ModelPair  # noqa: E402


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


def write_json(path: str | None, doc: dict) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)
        print(f"wrote {path}")


DEFAULT_PROMPT = "What are three good habits for getting better sleep?"      # the app's default example


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

