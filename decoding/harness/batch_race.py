"""The batch race: ``B`` prompts decoded as one batch (``strategies/batched.py``) against the same prompts decoded one
after another, strategy by strategy, on one model pair.

For every strategy it times both (each warmed up first, the single-row runs untraced, the batch traced: its
``BatchStep`` events are the view's), checks that every row's tokens are its prompt's single-row greedy tokens,
and reports the throughput of each (all rows' tokens over the wall time) and their ratio. The single-row runs
are the registry's own strategies (``run_one``), so their accepted lengths are what a row of the batch must
reproduce.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from decoding.context import RunContext
from decoding.events import BatchStep, event_to_dict
from decoding.harness.bench import load_prompt_set
from decoding.harness.runner import run_one
from decoding.runtime.pair import ModelPair
from decoding.strategies import get_strategy
from decoding.strategies.batched import BATCHABLE, batch_generate, check_batch
from decoding.tracer import Tracer

Progress = Callable[[str], None]


def batch_prompts(first: str, batch: int, path: Optional[Path] = None) -> list[str]:
    """The visitor's prompt, then prompts of the example set (``path``, default presets/prompts.yaml) taken one
    category at a time in turn (so the rows differ in kind and length), ``batch`` in all, none repeated."""
    batch = check_batch(batch)
    by_category: dict[str, list[str]] = {}
    for category, text in load_prompt_set(path):
        by_category.setdefault(category, []).append(text)
    out = [first]
    queues = list(by_category.values())
    while len(out) < batch and any(queues):
        for queue in queues:
            if queue and len(out) < batch:
                text = queue.pop(0)
                if text not in out:
                    out.append(text)
    if len(out) < batch:
        raise ValueError(f"the example set holds {len(out) - 1} other prompts; batch {batch} needs {batch - 1}")
    return out


def _timed_batch(name: str, prompts: list[list[int]], pair: ModelPair, params: Any, max_new_tokens: int,
                 context: Optional[RunContext]) -> tuple[list, float, list]:
    tracer = Tracer()
    t0 = time.perf_counter()
    results = batch_generate(name, prompts, pair, params, max_new_tokens=max_new_tokens, tracer=tracer,
                             context=context)
    return results, time.perf_counter() - t0, [e for e in tracer.events if isinstance(e, BatchStep)]


def _singles(name: str, prompts: list[list[int]], pair: ModelPair, params: Any, max_new_tokens: int,
             context: Optional[RunContext]) -> tuple[list, float]:
    strategy, total, results = get_strategy(name), 0.0, []
    for ids in prompts:
        result, seconds, _ = run_one(strategy, params, ids, pair, max_new_tokens=max_new_tokens, trace=False,
                                     context=context)
        results.append(result)
        total += seconds
    return results, total


def _reference_index(runs: Sequence[tuple[str, Any]]) -> list[int]:
    """The index of the greedy run (default parameters) whose timed single-row runs are the reference, if any."""
    default = get_strategy("greedy").parse({})
    return [i for i, (name, params) in enumerate(runs) if name == "greedy" and params == default][:1]


def progress_steps(runs: Sequence[tuple[str, Any]], warmup: bool = True) -> int:
    """How many messages :func:`race_batch` says to its ``progress`` for ``runs`` (a progress bar's length): an
    untimed greedy reference where greedy is not raced, then per strategy its warm-up, its rows one after another
    and its batch."""
    return (0 if _reference_index(runs) else 1) + len(runs) * (3 if warmup else 2)


def race_batch(prompts: Sequence[Sequence[int]], pair: ModelPair, runs: Sequence[tuple[str, Any]], *,
               max_new_tokens: int, warmup: bool = True, context: Optional[RunContext] = None,
               progress: Optional[Progress] = None) -> list[dict]:
    """Each ``(strategy name, params object)`` of ``runs`` over ``prompts`` as one batch and row by row; one entry
    per strategy (see :func:`_entry`), in the order of ``runs``. Greedy's single-row runs are the reference: its own
    timed ones where greedy with its default parameters is among ``runs`` (it then runs first), else untimed ones.
    ``progress`` hears a message as each of the :func:`progress_steps` steps starts."""
    prompts, runs = [list(p) for p in prompts], list(runs)
    check_batch(len(prompts))
    for name, _ in runs:
        if name not in BATCHABLE:
            raise ValueError(f"a batch runs {', '.join(BATCHABLE)}; got strategy {name!r}")
    say = progress or (lambda msg: None)
    # greedy raced with its default parameters runs first, and its timed single-row runs are the reference;
    # otherwise the reference runs untimed before the others (never both: that ran every row twice)
    timed_reference = _reference_index(runs)
    reference = None
    if not timed_reference:
        say(f"greedy reference: {len(prompts)} single-row runs")
        reference, _ = _singles("greedy", prompts, pair, get_strategy("greedy").parse({}), max_new_tokens, context)
    entries: dict[int, dict] = {}
    for i in timed_reference + [i for i in range(len(runs)) if i not in timed_reference]:
        name, params = runs[i]
        if warmup:       # kernels, caches and drafters warmed once, untimed
            say(f"{name}: warm-up")
            batch_generate(name, prompts, pair, params, max_new_tokens=min(4, max_new_tokens), context=context)
            _singles(name, prompts[:1], pair, params, min(4, max_new_tokens), context)
        say(f"{name}: {len(prompts)} rows one after another" + (" (the greedy reference)" if reference is None
                                                                  else ""))
        singles, single_s = _singles(name, prompts, pair, params, max_new_tokens, context)
        reference = singles if reference is None else reference
        say(f"{name}: the batch of {len(prompts)}")
        rows, batch_s, steps = _timed_batch(name, prompts, pair, params, max_new_tokens, context)
        entries[i] = _entry(name, rows, singles, reference, batch_s, single_s, steps)
    return [entries[i] for i in range(len(runs))]


def _entry(name: str, rows: list, singles: list, reference: list, batch_s: float, single_s: float,
           steps: list) -> dict:
    """A strategy's race: throughput of the batch and of the rows run one after another, and per row its tokens,
    whether they equal greedy's, its accepted lengths in the batch and alone, and the steps it waited."""
    tokens = sum(len(r.token_ids) for r in rows)
    single_tokens = sum(len(r.token_ids) for r in singles)
    per_row = [{"row": i, "tokens": len(r.token_ids), "token_ids": list(r.token_ids),
                "equals_greedy": r.token_ids == ref.token_ids, "equals_single": r.token_ids == one.token_ids,
                "steps": r.stats["steps"], "waited_steps": r.stats["waited_steps"],
                "accepted_lengths": r.stats["accepted_lengths"],
                "single_accepted_lengths": one.stats.get("accepted_lengths", [0] * (one.target_forwards - 1)),
                "target_forwards": r.target_forwards, "single_target_forwards": one.target_forwards}
               for i, (r, one, ref) in enumerate(zip(rows, singles, reference))]
    batch_tps = tokens / batch_s if batch_s > 0 else 0.0
    single_tps = single_tokens / single_s if single_s > 0 else 0.0
    return {"strategy": name, "batch": len(rows), "tokens": tokens, "batch_s": round(batch_s, 3),
            "single_s": round(single_s, 3), "batch_tokens_per_s": round(batch_tps, 2),
            "single_tokens_per_s": round(single_tps, 2),
            "throughput_ratio": round(batch_tps / single_tps, 3) if single_tps else None,
            "batch_forwards": rows[0].stats["batch_forwards"] if rows else 0,
            "single_forwards": sum(r.target_forwards for r in singles),
            "rows_equal_greedy": sum(r["equals_greedy"] for r in per_row), "rows": per_row,
            "events": [event_to_dict(e) for e in steps]}


def summary_rows(entries: Sequence[dict]) -> list[dict]:
    """One line per strategy for the CLI's table."""
    return [{"strategy": e["strategy"], "batch": e["batch"], "tokens": e["tokens"],
             "batch tok/s": e["batch_tokens_per_s"], "one-by-one tok/s": e["single_tokens_per_s"],
             "ratio": e["throughput_ratio"], "forwards (batch / one-by-one)": f"{e['batch_forwards']} / "
             f"{e['single_forwards']}", "rows = greedy": f"{e['rows_equal_greedy']}/{e['batch']}",
             "waited steps per row": " ".join(str(r["waited_steps"]) for r in e["rows"])} for e in entries]

