"""Run several strategies on one prompt, side by side, and measure them.

The runner owns everything around the decoding loops: text <-> ids, seeding,
warm-up, device synchronisation around timers, progress and cancellation
hooks, per-strategy failure isolation, the greedy reference used for speedups
and the exactness check, and the JSON shape written by ``--json``::

    {"environment": {...}, "prompt_ids": [...],
     "results": [{"strategy", "label", "params", "token_ids", "text", "pieces", "vocab",
                  "wall_s", "tokens_per_s", "speedup", "target_forwards",
                  "draft_forwards", "stats", "events", "times_ms", "lossless", "lossy",
                  "matches_greedy", "first_divergence", "differing_tokens", "target_logprob",
                  "stop_reason", "error"}]}

A lossy run (``acceptance`` lenient or typical, ``decoding/relaxed.py``) says ``"lossy": true`` and what it
cost (``harness/cost.py``): at temperature 0 ``first_divergence`` and ``differing_tokens`` against the greedy
reference; a sampled run (lossy or not) its ``target_logprob``.

``times_ms[i]`` is when ``events[i]`` was recorded, in milliseconds since the
strategy's timed run started (the wall-clock race replay). An observer passed to
``run_comparison`` (``RunObserver``: the app's ``web.live.Live``) hears of each
strategy as it starts and finishes, and gets its tracer, so another thread can
read the results so far and the running strategy's events (the app's live race).
"""

from __future__ import annotations

import dataclasses
import math
import platform
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol, Sequence

import torch

from decoding.context import RunContext
from decoding.events import BeamStep, JacobiIteration, TokenCommitted, event_to_dict
from decoding.harness.cost import differing_tokens, first_divergence, mean_target_logprob
from decoding.params import JacobiParams, LookaheadParams, check_max_new_tokens, params_to_dict
from decoding.result import Result
from decoding.runtime.kernel_choice import cpu_label, cpu_name
from decoding.runtime.pair import ModelPair
from decoding.runtime.session import Session
from decoding.runtime.widths import WidthChoice, jacobi_block, lookahead_window
from decoding.sampling import make_generator
from decoding.strategies import get_strategy
from decoding.strategies.strategy import Strategy
from decoding.tracer import NULL_TRACER, Tracer


class Cancelled(Exception):
    """Raised inside a run when the user pressed Stop or the time limit passed."""


# --------------------------------------------------------------------------- text

def encode_prompt(tokenizer: Any, text: str, chat: bool = False) -> list[int]:
    """Token ids for ``text``; with ``chat`` the model's chat template wraps it as a user turn."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("prompt must not be empty")
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("this model has no chat template; run without --chat")
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                            add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    return [int(i) for i in tokenizer(text, add_special_tokens=True)["input_ids"]]


def token_pieces(tokenizer: Any, ids: Sequence[int], context: int = 4) -> list[str]:
    """The text each token adds, so that ``"".join(pieces) == decode(ids)``.

    A token that ends inside a multi-byte character gets an empty piece and the
    token completing the character carries it. Each piece is decoded after a few
    tokens of left context, so tokenizers that drop a word's leading space when
    it starts a string still show it.
    """
    ids = list(ids)
    pieces: list[str] = []
    anchor = 0  # first token whose text has not been emitted yet
    for i in range(len(ids)):
        ctx = max(0, anchor - context)
        head = tokenizer.decode(ids[ctx:anchor], skip_special_tokens=False)
        full = tokenizer.decode(ids[ctx:i + 1], skip_special_tokens=False)
        if full.endswith("\ufffd") and i < len(ids) - 1:
            pieces.append("")  # incomplete character: wait for the next token
            continue
        pieces.append(full[len(head):] if full.startswith(head)
                      else tokenizer.decode(ids[anchor:i + 1], skip_special_tokens=False))
        anchor = i + 1
    return pieces


def _event_token_ids(events: Sequence[Any]) -> set[int]:
    ids: set[int] = set()
    for e in events:
        for name in ("token", "tokens", "guess", "accepted", "window", "candidates"):
            value = getattr(e, name, None)
            stack = [value]
            while stack:
                v = stack.pop()
                if isinstance(v, int) and not isinstance(v, bool):
                    ids.add(v)
                elif isinstance(v, tuple):
                    stack.extend(v)
    return ids


# --------------------------------------------------------------------------- results

@dataclass
class RunResult:
    strategy: str
    label: str
    params: dict
    token_ids: list[int]
    wall_s: float
    target_forwards: int
    draft_forwards: int = 0
    stats: dict = field(default_factory=dict)
    events: list = field(default_factory=list)
    times_ms: list[float] = field(default_factory=list)   # per event: ms since the timed run started
    lossless: bool = False
    text: str = ""
    pieces: list[str] = field(default_factory=list)
    vocab: dict[int, str] = field(default_factory=dict)
    stop_reason: str = ""
    error: Optional[str] = None
    speedup: Optional[float] = None
    matches_greedy: Optional[bool] = None
    first_divergence: Optional[int] = None
    # top-1 minus top-2 target logit at the first divergence (a near-tie in low precision
    # shows up as a tiny margin; a bug as a large one), and the two competing tokens
    divergence_margin: Optional[float] = None
    divergence_tokens: Optional[list[int]] = None
    reference: bool = False    # added by the runner as the greedy baseline
    lossy: bool = False        # relaxed acceptance (lenient, typical): may commit tokens greedy would not
    differing_tokens: Optional[int] = None   # a lossy greedy run: positions that differ from greedy's
    target_logprob: Optional[float] = None   # a sampled run: mean log p of its tokens under the target
    model: Optional[str] = None  # the model it ran on, when a comparison races two (``run_comparison``'s ``model``)

    @property
    def tokens_per_s(self) -> float:
        return len(self.token_ids) / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "events"}
        data["tokens_per_s"] = round(self.tokens_per_s, 3)
        data["vocab"] = {str(k): v for k, v in self.vocab.items()}
        data["events"] = [event_to_dict(e) for e in self.events]
        return data


def environment(pair: ModelPair, seed: int) -> dict:
    import transformers
    env = {
        "device": str(pair.target.device), "dtype": str(pair.target.dtype).replace("torch.", ""),
        "target": pair.target.describe(),
        "assistant": pair.assistant.describe() if pair.assistant else None,
        "prophet": {"kernels": pair.prophet.kernels, "dtype": str(pair.prophet.dtype).replace("torch.", "")}
        if pair.prophet is not None else None,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(), "seed": seed,
    }
    if pair.target.device.type == "cpu":   # the kernel per bucket of row counts is in target.kernel_buckets
        env["cpu"] = cpu_name()
        env["cpu_detail"] = cpu_label()
    if pair.target.device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(pair.target.device)
    return env


# --------------------------------------------------------------------------- hooks

class HookTracer(Tracer):
    """A tracer that also reports progress and enforces Stop / time limits at each event.

    When recording it also stamps each event with the wall-clock milliseconds since
    ``start()`` (``times``, parallel to ``events``), the clock of the real-time replay.
    """

    def __init__(self, on_tokens: Optional[Callable[[int], None]] = None,
                 should_stop: Optional[Callable[[], bool]] = None,
                 deadline: Optional[float] = None, record: bool = True) -> None:
        super().__init__()
        self.on_tokens, self.should_stop, self.deadline, self.record = on_tokens, should_stop, deadline, record
        self.done = 0
        self.times: list[float] = []
        self.t0 = time.perf_counter()

    def start(self) -> None:
        """Restart the event clock (right before the timed run)."""
        self.t0 = time.perf_counter()

    def emit(self, event: Any) -> None:
        if self.record:
            # the time first: a reader in another thread sees no event without its time
            self.times.append(round((time.perf_counter() - self.t0) * 1e3, 3))
            self.events.append(event)
        n = None
        if isinstance(event, TokenCommitted):
            n = event.position + 1
        elif isinstance(event, BeamStep) and event.tokens:
            n = len(event.tokens[0])
        elif isinstance(event, JacobiIteration):
            n = event.start + event.converged
        if n is not None and n > self.done:
            self.done = n
            if self.on_tokens:
                self.on_tokens(n)
        if self.should_stop is not None and self.should_stop():
            raise Cancelled("stopped by the user")
        if self.deadline is not None and time.perf_counter() > self.deadline:
            raise Cancelled("time limit reached")


class RunObserver(Protocol):
    """What ``run_comparison`` tells an observer (the app's live race, ``web.live.Live``)."""

    def plan(self, names: Sequence[tuple[str, str]], tokenizer: Any) -> None:
        """The (strategy, label) pairs about to run, in order."""

    def begin(self, rr: "RunResult", hook: Optional["HookTracer"], warming: bool) -> None:
        """A strategy starts its warm-up (``warming``, no tracer) or its timed run (its tracer)."""

    def finish(self, rr: "RunResult") -> None:
        """A strategy's result is complete."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --------------------------------------------------------------------------- running

def run_one(strategy: Strategy, params: Any, prompt_ids: Sequence[int], pair: ModelPair, *,
            max_new_tokens: int, seed: int = 0, trace: bool = True,
            tracer: Optional[Tracer] = None, context: Optional[RunContext] = None) -> tuple[Result, float, list]:
    """Run one strategy once; returns (result, wall seconds, events)."""
    if strategy.needs_assistant and pair.assistant is None and pair.prophet is None:
        raise ValueError(f"strategy {strategy.name!r} needs an assistant model")
    tr = tracer if tracer is not None else (Tracer() if trace else NULL_TRACER)
    rng = make_generator(seed, pair.target.device)
    _sync(pair.target.device)
    t0 = time.perf_counter()
    if isinstance(tr, HookTracer):
        tr.t0 = t0               # event times count from the same instant as the wall time
    result = strategy.generate(list(prompt_ids), pair, params, max_new_tokens=max_new_tokens,
                               tracer=tr, rng=rng, context=context)
    _sync(pair.target.device)
    return result, time.perf_counter() - t0, list(tr.events)


def _warm_up(strategy: Strategy, params: Any, prompt_ids: Sequence[int], pair: ModelPair, max_new_tokens: int,
             seed: int, context: Optional[RunContext]) -> None:
    """Allocate caches and kernels (and capture CUDA graphs) once per loaded model and strategy, untimed.

    Called right before the strategy's own timed run, so the first strategy's tokens
    are not held back by the warm-up of the others.
    """
    warmed = pair.target.state.warmed                           # marks die with the loaded target
    key = (pair.assistant.uid if pair.assistant else None, strategy.name, bool(getattr(params, "fast", False)))
    if key in warmed:
        return
    warmed.add(key)
    try:
        run_one(strategy, params, prompt_ids, pair, max_new_tokens=min(4, max_new_tokens),
                seed=seed, trace=False, context=_warmup_context(context))
    except Exception:  # the real run reports it
        pass


def run_comparison(prompt_ids: Sequence[int], pair: ModelPair, runs: Sequence[tuple[str, Any]], *,
                   max_new_tokens: int, seed: int = 0, warmup: bool = True, trace: bool = True,
                   reference: bool = True,
                   on_progress: Optional[Callable[[int, str, int], None]] = None,
                   should_stop: Optional[Callable[[], bool]] = None,
                   time_limit_s: Optional[float] = None,
                   context: Optional[RunContext] = None,
                   live: Optional[RunObserver] = None,
                   model: Optional[str] = None) -> list[RunResult]:
    """Run ``runs`` = [(strategy name, params dict or params object)] on one prompt.

    ``context`` (generation settings, a drafting history) applies to every run, the
    greedy reference included, so "identical to greedy" compares like with like.

    Parameters are validated before anything runs (a bad one raises ValueError).
    With ``reference`` a greedy run is added first when absent, so every result
    gets a speedup and lossless strategies an exactness verdict. A strategy that
    raises is reported in its own result's ``error``; the others still run.
    Strategies run one after the other (each timing stays honest), each warmed up
    right before its own timed run. ``on_progress(index, strategy, tokens_done)``
    is called as tokens commit; ``live`` (a :class:`RunObserver`) hears of each strategy.

    ``model`` names the target in every result (``RunResult.model``, and the label: "Jacobi · NAME") when the
    caller races the same plan on more than one model; each comparison keeps its own greedy reference.
    """
    max_new_tokens = check_max_new_tokens(max_new_tokens)
    if context is not None and context.generation is not None:
        context.generation.check_for(pair.target)
    plan = _plan(runs, reference)
    lanes = _lanes(plan, model)

    deadline = time.perf_counter() + time_limit_s if time_limit_s else None
    tokenizer = pair.target.tokenizer
    if live is not None:
        live.plan(lanes, tokenizer)
    results: list[RunResult] = []
    for index, (strategy, params, is_ref) in enumerate(plan):
        hook = None
        if trace or on_progress or should_stop or deadline or live:
            hook = HookTracer(on_tokens=(lambda n, i=index, s=strategy.name: on_progress(i, s, n))
                              if on_progress else None,
                              should_stop=should_stop, deadline=deadline, record=trace or live is not None)
        lossy = bool(getattr(params, "lossy", False))
        rr = RunResult(strategy.name, lanes[index][1], shown_params(params, pair), [], 0.0, 0,
                       lossless=strategy.lossless and not getattr(params, "temperature", 0) and not lossy,
                       reference=is_ref, model=model, lossy=lossy)
        if warmup:   # 1. warm this strategy up (once per process), untimed
            if live is not None:
                live.begin(rr, None, warming=True)
            _warm_up(strategy, params, prompt_ids, pair, max_new_tokens, seed, context)
        if live is not None:
            live.begin(rr, hook, warming=False)
        # 2. one timed run per strategy, each with its own seeded generator
        _timed_run(rr, strategy, params, prompt_ids, pair, max_new_tokens, seed, hook, context)
        if getattr(params, "temperature", 0) and not rr.error:    # what a sampled run's tokens cost, untimed
            rr.target_logprob = _safe_logprob(pair, prompt_ids, rr.token_ids, context, max_new_tokens)
        if not trace:
            rr.events, rr.times_ms = [], []
        if tokenizer is not None:
            rr.text = tokenizer.decode(rr.token_ids, skip_special_tokens=True)
            rr.pieces = token_pieces(tokenizer, rr.token_ids)
            ids = _event_token_ids(rr.events) | set(rr.token_ids)
            rr.vocab = {i: tokenizer.decode([i]) for i in sorted(ids)}
        results.append(rr)
        if live is not None:
            _compare_to_greedy(results)      # the finished columns show their speedup and verdict
            live.finish(rr)
        if rr.error and rr.stop_reason == "cancelled" and should_stop is not None and should_stop():
            break
    _compare_to_greedy(results)
    for r in results:
        if r.matches_greedy is False:
            _explain_divergence(r, results, prompt_ids, pair, max_new_tokens, context)
    return results


def _plan(runs: Sequence[tuple[str, Any]], reference: bool) -> list[tuple[Strategy, Any, bool]]:
    """(strategy, parsed params, is the added reference) in running order; raises ValueError on a bad one."""
    plan: list[tuple[Strategy, Any, bool]] = []
    for name, values in runs:
        strategy = get_strategy(name)
        params = values if isinstance(values, strategy.params_cls) else strategy.parse(values)
        plan.append((strategy, params, False))
    if reference and not any(s.name == "greedy" for s, _, _ in plan):
        greedy = get_strategy("greedy")
        # the reference runs in the race's mode: fast (static cache; compiled on a CPU where it is switched on)
        # when the strategies run fast, so "identical to greedy" and the speed-ups compare like with like
        fast = any(getattr(params, "fast", False) for _, params, _ in plan)
        plan.insert(0, (greedy, greedy.parse({"fast": True} if fast else {}), True))
    return plan


def planned_lanes(runs: Sequence[tuple[str, Any]], model: Optional[str] = None,
                  reference: bool = True) -> list[tuple[str, str]]:
    """The (strategy, label) pairs ``run_comparison(runs, model=model)`` will run, in order (the live race
    shows a second model's lanes as waiting while the first model runs)."""
    return _lanes(_plan(runs, reference), model)


def _lanes(plan: list[tuple[Strategy, Any, bool]], model: Optional[str]) -> list[tuple[str, str]]:
    """(strategy name, result label) of each entry of ``plan``."""
    return [(s.name, lane_label(s.label or s.name, model)) for s, _, _ in plan]


MODEL_IN_LABEL = 60    # characters of a model's name a result's label shows (a trace's label holds at most 128)


def lane_label(label: str, model: Optional[str]) -> str:
    """A result's label: the strategy's, and the model's name after it when a comparison races two models
    (a Hub id shows its name without the organisation; a long name is cut)."""
    if not model:
        return label
    name = model.rsplit("/", 1)[-1]
    return f"{label} · {name if len(name) <= MODEL_IN_LABEL else name[:MODEL_IN_LABEL - 1] + '…'}"


UNUSED_KNOBS = {"lenience": "lenient", "posterior_threshold": "typical", "posterior_alpha": "typical"}   # -> its rule


def shown_params(params: Any, pair: ModelPair) -> dict:
    """The parameters as the run uses them: a tree's 0 (= the device's default shape) resolved to its numbers,
    an automatic lookahead window or Jacobi block to ``auto→N`` (``runtime/widths.py``; the curve it needs is
    timed here, once per model, before the warm-up and the timed run); of the acceptance rule's knobs only the
    rule's own (``decoding/relaxed.py``: ``lenience`` for lenient, ε and δ for typical, none for exact)."""
    values = params_to_dict(params)
    for knob, rule in UNUSED_KNOBS.items():
        if knob in values and values.get("acceptance") != rule:
            del values[knob]
    if values.get("tree") and "tree_topk" in values and "tree_nodes" in values:
        values["tree_topk"], values["tree_nodes"] = params.tree_shape(pair.target.device)
    if isinstance(params, LookaheadParams) and not params.window:
        values["window"] = _auto_width(lookahead_window, params, pair)
    if isinstance(params, JacobiParams) and not params.block_size:
        values["block_size"] = _auto_width(jacobi_block, params, pair)
    return values


def _auto_width(resolve: Callable[..., WidthChoice], params: Any, pair: ModelPair) -> Any:
    """``auto→N``: the width the run will choose (the same curve, kept on the model); 0 if that fails."""
    try:
        return resolve(pair.target, params).shown.partition("=")[2]
    except Exception:          # noqa: BLE001: the run itself raises it, in its own result
        return 0


def _timed_run(rr: RunResult, strategy: Strategy, params: Any, prompt_ids: Sequence[int], pair: ModelPair,
               max_new_tokens: int, seed: int, hook: Optional[HookTracer], context: Optional[RunContext]) -> None:
    """Run one strategy into ``rr``: tokens, counts, events and their times, or its error."""
    t0 = time.perf_counter()
    try:
        result, rr.wall_s, rr.events = run_one(strategy, params, prompt_ids, pair,
                                               max_new_tokens=max_new_tokens, seed=seed,
                                               tracer=hook if hook is not None else NULL_TRACER,
                                               context=context)
        rr.token_ids, rr.target_forwards = list(result.token_ids), result.target_forwards
        rr.draft_forwards, rr.stats, rr.stop_reason = result.draft_forwards, dict(result.stats), result.stop_reason
    except Cancelled as exc:
        rr.wall_s, rr.error, rr.stop_reason = time.perf_counter() - t0, str(exc), "cancelled"
        rr.events = list(hook.events) if hook else []
        rr.token_ids = _committed_tokens(rr.events)
    except Exception as exc:  # isolate failures: the other columns still show
        rr.wall_s = time.perf_counter() - t0
        rr.error = f"{type(exc).__name__}: {exc}"
        rr.stop_reason = "error"
        if isinstance(exc, torch.cuda.OutOfMemoryError) and torch.cuda.is_available():
            torch.cuda.empty_cache()
    rr.times_ms = list(hook.times[:len(rr.events)]) if hook is not None and hook.record else []


def _warmup_context(context: Optional[RunContext]) -> Optional[RunContext]:
    """The run's context without its history: a warm-up must not teach a history drafter the answer."""
    return None if context is None else RunContext(generation=context.generation)


def _explain_divergence(r: RunResult, results: list[RunResult], prompt_ids: Sequence[int],
                        pair: ModelPair, max_new_tokens: int, context: Optional[RunContext]) -> None:
    """Fill ``divergence_margin``: the target's top-2 logit gap (after the run's processors) where outputs differ."""
    base = next(x for x in results if x.strategy == "greedy" and not x.error)
    pos = r.first_divergence
    try:
        session = Session(pair.target)
        logits = session.prefill(list(prompt_ids) + base.token_ids[:pos])[0]
        proc = (context or RunContext()).processors(pair.target, prompt_ids, max_new_tokens)
        if proc is not None:
            logits = proc(base.token_ids[:pos], logits)
        top = torch.topk(logits, 2)
        r.divergence_margin = round(float(top.values[0] - top.values[1]), 6)
        r.divergence_tokens = [int(t) for t in top.indices]
    except Exception:  # a diagnosis must never break a run
        r.divergence_margin = None


def _committed_tokens(events: Sequence[Any]) -> list[int]:
    tokens: dict[int, int] = {}
    for e in events:
        if isinstance(e, TokenCommitted):
            tokens[e.position] = e.token
    return [tokens[i] for i in range(len(tokens)) if i in tokens]


def _compare_to_greedy(results: list[RunResult]) -> None:
    base = next((r for r in results if r.strategy == "greedy" and not r.error), None)
    if base is None:
        return
    for r in results:
        if r.error:
            continue
        if base.tokens_per_s > 0 and r.tokens_per_s > 0:
            r.speedup = round(r.tokens_per_s / base.tokens_per_s, 4)
        if r.lossless:
            r.first_divergence = first_divergence(r.token_ids, base.token_ids)
            r.matches_greedy = r.first_divergence is None
        elif r.lossy and not r.params.get("temperature"):   # what relaxed acceptance changed (no verdict)
            r.first_divergence = first_divergence(r.token_ids, base.token_ids)
            r.differing_tokens = differing_tokens(r.token_ids, base.token_ids)


def _safe_logprob(pair: ModelPair, prompt_ids: Sequence[int], tokens: Sequence[int],
                  context: Optional[RunContext], max_new_tokens: int) -> Optional[float]:
    """``cost.mean_target_logprob``; None if it fails (a measurement must never break a run)."""
    try:
        return mean_target_logprob(pair, prompt_ids, tokens, context, max_new_tokens)
    except Exception:  # noqa: BLE001
        return None


def summarize(results: Sequence[RunResult]) -> list[dict]:
    """One row per result for tables: strategy, tokens, seconds, tok/s, speedup, forwards."""
    rows = []
    for r in results:
        rows.append({
            **({"model": r.model} if any(x.model for x in results) else {}),
            "strategy": r.strategy + (" (reference)" if r.reference else ""),
            "tokens": len(r.token_ids), "seconds": round(r.wall_s, 3),
            "tok/s": round(r.tokens_per_s, 2),
            "speedup": None if r.speedup is None or math.isnan(r.speedup) else round(r.speedup, 2),
            "target fwd": r.target_forwards, "draft fwd": r.draft_forwards,
            "= greedy": _verdict_cell(r),
            "error": r.error or "",
        })
    return rows


def _verdict_cell(r: RunResult) -> str:
    """The summary's "= greedy" cell: the exactness verdict, or what a lossy run changed."""
    if r.lossy:
        if r.differing_tokens is not None:
            where = "" if r.first_divergence is None else f", first at pos {r.first_divergence}"
            return f"lossy: {r.differing_tokens} differ{where}"
        return "lossy" + ("" if r.target_logprob is None else f" (mean log p {r.target_logprob:.3f})")
    return {True: "yes", None: "-",
            False: f"no (pos {r.first_divergence}, top-2 margin {r.divergence_margin})"}[r.matches_greedy]
