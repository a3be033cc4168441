"""The start's choices, made behind the page: the version and mode that serve the default target, and the
strategies the page ticks by default. No Gradio here.

The page is served first. :class:`Startup` then works in a background thread of the app (``app.main``):

1. the eager configs of the default target (``runtime/routes.py``: each version, eager) are timed as the race runs
   them (``harness/steps.race_measure``: each timed run and forward alone on the line, a visitor's run let through
   between them) and the cheapest serves at once; an earlier start's decision on this machine (cached per CPU,
   threads, torch and candidates) skips the timing;
2. where a C++ compiler exists, each version that compiles gets its forward compiled, *unpublished*: only this
   thread's forwards use it (``compiled.building``), to time it; visitors' runs stay eager meanwhile, and the page
   and each run's message say so;
   the winner's forward for a run on one thread too (``compile_one_thread``: a busy machine's runs go on one);
3. the cheapest config of all serves: its compiled forward is published while no run computes
   (``Line.exclusive``: no race switches mode half-way), the page ticks ``fast`` for it;
4. the default comparison is chosen on that config's measured forward-cost curve and its raced steps
   (``harness/pays.py``), pooled with this machine's earlier quiet starts' races (``web/race_history.py``).

Each step replaces ``app.settings`` (a frozen :class:`~web.settings.Settings`) whole; a page opened later shows the
new defaults (``app.py`` refreshes them on load), and every request reads the settings it was made under.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import torch

from decoding.harness.pays import PROPHET_SHAPES, choose_prophet_shape, default_comparison
from decoding.harness.steps import StepRatio, race_measure, step_ratios
from decoding.runtime import attention_kernels, compiled, kernels, omp_pool, routes
from decoding.runtime.head import prophet_for
from decoding.runtime.models import cache_root, forget_models, load_presets, pick_device
from decoding.runtime.pair import ModelPair, has_prophet
from decoding.runtime.routes import WIDTH, Config, RouteChoice
from decoding.runtime.warmup import warm
from decoding.runtime.widths import machine_curve
from decoding.strategies import registry
from web.compute import decode_probe
from web.quiet import CpuReader, baselines_of, others_share, read_proc
from web.race_history import RaceHistory, history_for, params_text
from web.requests import DEFAULT_MAX_NEW
from web.settings import DEFAULT_STRATEGIES, Settings

Log = Callable[[str], None]
DONE_LINE = "start-up done in"   # logged once when the background start has finished (benchmarks wait for it)
TICKED_LINE = "default comparison here:"   # logged with the strategies the page ticks, each time they are chosen
SHAPE_LINE = "prophet step here:"         # logged with the prophet's parameters the page starts on (JSON), and why
RETRY_S = 30.0        # a curve timed busy: how often the start looks for a quiet moment to time it again
ROUNDS = 2            # interleaved rounds of timing every config once the compiled ones are ready (min kept)
# each prophet shape's timed runs (``timed_steps``; each run holds the line, visitors' runs go between them): 16-token
# runs ranked the 8-node tree within 4 % of the 2-node one under the AVX2 caps, where 48-token races ran it 14 % slower;
# 6 rounds: with 3 the narrower shape within the rounds' noise of the best won at one CPU-table run of two (tree4 1.25×
# greedy on unseen prompts, tree8 1.34×); 6 cost a few seconds more on a Zen 5 and halve the rounds' variance
SHAPE_TOKENS, SHAPE_ROUNDS = 24, 6
# the default race the verdicts rest on: the page's default length (a lookahead pool and a prompt lookup's matches
# grow with the output: 24-token runs would judge a shorter race than the page runs)
RACE_TOKENS, RACE_ROUNDS = DEFAULT_MAX_NEW, 3


def routes_file() -> Path:
    return cache_root().parent / "routes.json"


def chosen_strategies(settings: Settings, *, curve: Optional[Callable[[float], float]] = None,
                      steps: Optional[Mapping[str, StepRatio]] = None,
                      history: Optional[RaceHistory] = None) -> Settings:
    """``settings`` with the page's default comparison for this machine (``decoding/harness/pays.py``): the
    strategies of ``DEFAULT_STRATEGIES`` expected to run at least as fast as greedy on the default target's
    measured forward-cost curve in its served mode (``runtime/widths.machine_curve``; ``curve``: injected), and
    one line for each one left out, which stays selectable; and the prophet's step shape (``pays.choose_prophet_shape``:
    the 8-node tree where a wide forward is cheap, a small tree or a short chain where it is not), which the page's
    prophet fields start on and the prophet's verdict judges. ``steps``: what the start timed here
    (``timed_steps``): each shape's step, by shape name, and the default race, by strategy name; with them the shape
    rests on the timed steps and each raced strategy's verdict on its race, without them on the curve's model of
    a step. ``history``: this machine's earlier starts' races and shape timings (``web/race_history.py``), pooled
    with this start's for the verdicts and the shape, and this start's kept. Without a curve (a GPU): all, and the
    library's shape."""
    if curve is None:
        curve = machine_curve(settings.load(settings.default_target()), fast=settings.compiled)
    if curve is None:
        return dataclasses.replace(settings, strategies=DEFAULT_STRATEGIES, strategies_note="", ticked_note="",
                                   prophet_shape=(), prophet_note="")
    if history is not None and steps:       # the shapes' steps pooled with this machine's last starts', and kept
        steps = history.shapes(steps, [shape.name for shape in PROPHET_SHAPES])
    shape = choose_prophet_shape(curve, steps=steps)
    raced = {name: steps[name] for name in DEFAULT_STRATEGIES if steps and name in steps}
    params, previous, judged = {"prophet": params_text(dict(shape.shape.params))}, None, dict(raced)
    if history is not None and raced:
        judged, previous = history.pool(raced, params)
    if "prophet" not in judged and shape.step is not None:
        judged["prophet"] = shape.step
    chosen = default_comparison(curve, [name for name in DEFAULT_STRATEGIES if name in registry()],
                                {"prophet": shape.shape.parsed()}, judged or None, previous)
    if history is not None and raced:
        history.record(raced, params, chosen.strategies)
    return dataclasses.replace(settings, strategies=chosen.strategies, strategies_note=chosen.note,
                               ticked_note="\n".join(chosen.kept_notes), prophet_shape=shape.shape.params,
                               prophet_note=shape.reason)


def timed_steps(settings: Settings, curve: Optional[Callable[[float], float]],
                hold: Callable[[], Any] = contextlib.nullcontext) -> Optional[dict[str, StepRatio]]:
    """What the default comparison is chosen from, timed on the default target in the served mode
    (``harness/steps.step_ratios``: the default example, each run against greedy in the same rounds, each run
    inside ``hold``): every prophet step shape's step (by shape name; ``SHAPE_TOKENS``-token runs), then the page's
    default race at its default length, the prophet at the shape those steps choose on ``curve`` (by strategy
    name). None off the CPU or without a curve (nothing is judged there), or where a run fails (the curve's model
    of a step stands in)."""
    lm = settings.load(settings.default_target())
    if curve is None or getattr(lm.device, "type", str(lm.device)) != "cpu":
        return None
    fast, spec = bool(settings.compiled), registry()
    try:
        head = has_prophet(lm.name)
        pair = ModelPair(lm, prophet=prophet_for(lm) if head else None)
        steps: dict[str, StepRatio] = shape_steps(lm, pair, fast, hold) if head else {}
        shape = choose_prophet_shape(curve, steps=steps).shape
        race = {name: (name, spec[name].parse({**(dict(shape.params) if name == "prophet" else {}), "fast": fast}))
                for name in DEFAULT_STRATEGIES
                if name != "greedy" and name in spec and (head or name != "prophet")}
        steps.update(step_ratios(lm, race, pair, tokens=RACE_TOKENS, repeats=RACE_ROUNDS, hold=hold))
        return steps or None
    except Exception:               # noqa: BLE001: the curve's model of the step stands in
        return None


def shape_steps(lm: Any, pair: ModelPair, fast: bool,
                hold: Callable[[], Any] = contextlib.nullcontext) -> dict[str, StepRatio]:
    """Every prophet step shape's step over greedy's (by shape name), timed on the default example in the mode
    ``fast`` (``SHAPE_TOKENS``-token runs, ``SHAPE_ROUNDS`` rounds): what ``pays.choose_prophet_shape`` picks the
    start's shape from (and ``benchmarks/bench_cpu_table.py`` the shape of the app's own mode)."""
    spec = registry()["prophet"]
    shapes = {shape.name: ("prophet", spec.parse({**dict(shape.params), "fast": fast})) for shape in PROPHET_SHAPES}
    return step_ratios(lm, shapes, pair, tokens=SHAPE_TOKENS, repeats=SHAPE_ROUNDS, hold=hold)


def compile_unpublished(lm: Any, log: Optional[Log] = None) -> Optional[str]:
    """Compile ``lm``'s forward for this thread only (``compiled.enable(publish=False)`` + ``warm``); the reason
    it stays eager, or None. Inductor's disk cache (``compiled.cache_dir``) makes a later start's compile cheap."""
    reason = compiled.enable(lm, publish=False)
    if reason is not None:
        return reason
    if log:
        log(f"compiling {lm.name}'s forward in the background (a minute or two on 2 cores at the first start, "
            f"seconds later: inductor's cache in {compiled.cache_dir()})")
    try:
        with compiled.building(lm):
            warm(lm, progress=(lambda i, n: log(f"compiled forward {i}/{n}")) if log else None)
    except Exception as exc:            # a compiler that fails here leaves the version eager
        compiled.disable(lm)
        return f"compiling failed ({type(exc).__name__})"
    return None


def compile_one_thread(lm: Any, log: Optional[Log] = None) -> Optional[float]:
    """Compile ``lm``'s unpublished forward for a run on one thread as well (``web/contention.py``: a run on a busy
    machine goes on one), while only this thread sees it (``compiled.building``): dynamo keeps a graph per thread
    count, and a visitor's first busy run compiled it otherwise (18 s in one process, 46 s through the app while
    the cores were busy). The count is the process's: a visitor's (eager) run meanwhile computes on one thread too, and
    is not recorded (``web.compute.quiet_timing``); holding the line instead would make it wait (45 s at a first
    start, 5 s from inductor's cache). The seconds it took, or None where the process runs on one thread anyway."""
    if torch.get_num_threads() <= 1:
        return None
    t0 = time.perf_counter()
    with compiled.building(lm), omp_pool.threads(1):
        warm(lm, widths=(1,))
    took = time.perf_counter() - t0
    if log is not None:
        log(f"{lm.name}: compiled forward for a run on one thread ready too ({took:.0f} s)")
    return took


class Startup:
    """One app's background start (see the module docstring). ``measure`` and ``compile`` are injectable (tests);
    ``pinned``: the operator named the target (``--target``), so only its modes are compared."""

    def __init__(self, app: Any, *, compile: bool = True, pinned: Optional[str] = None,
                 measure: Optional[routes.Measure] = None, compile_fn: Optional[Callable[..., Optional[str]]] = None,
                 file: Optional[Path] = None, log: Optional[Log] = None, cpu: CpuReader = read_proc,
                 retry_s: float = RETRY_S) -> None:
        self.app, self.compile, self.pinned = app, compile, pinned
        self.cpu, self.retry_s = cpu, retry_s      # /proc (injected: tests), how often a busy curve is tried again
        self.stopped = threading.Event()           # set: the curve is no longer tried again (the app closes, tests)
        self.curve_busy: Optional[float] = None    # others' share of the cores while the served curve was timed
        # the app's own measure holds the line per timed run and forward (a visitor's run goes between), not per config
        self._holds = measure is None
        self._measure = measure or race_measure(app.settings.load, WIDTH, app.line.exclusive)
        self.busy: list[str] = []          # configs timed while other processes held the cores (not cached)
        self.compile_fn = compile_fn or compile_unpublished
        self.file, self.log = file, log or (lambda msg: None)
        self.phase = "starting"            # starting -> timing -> compiling -> ready
        self.started = time.monotonic()
        self.done = threading.Event()
        self.error: Optional[BaseException] = None
        self.reasons: dict = {}            # compiled configs that stayed eager -> why
        # what the page says until the first choice is made
        self._set(target_note=("the fastest version and mode of this model on this CPU are being timed in the "
                               "background (once per machine); runs go eagerly meanwhile"),
                  compiled_note="" if compile else "compiled CPU forward: off, turned off at start (--no-compile)")

    def measure(self, config: Config) -> dict:
        """One config's race step, each timing while no visitor's run computes (``Line.exclusive``: a run would slow
        it, and it the run), and while /proc watches the other processes (``web/quiet.py``)."""
        costs, share = self._watched(lambda: self._measure(config), exclusive=not self._holds)
        if share is not None:
            self.busy.append(f"{config.label} (others used {share:.0%} of the cores)")
        return costs

    def _watched(self, work: Callable[[], Any], exclusive: bool = True) -> tuple[Any, Optional[float]]:
        """``work()`` while no run computes (``Line.exclusive``; ``exclusive=False``: ``work`` holds the line itself
        where it must) and /proc watches the other processes: its result, and the others' share of the cores when
        it was over the quiet limit (the timing is then not trusted), else None."""
        limits = self.app.limits.quiet
        with self.app.line.exclusive() if exclusive else contextlib.nullcontext():
            before = self.cpu()
            result = work()
            share = others_share(before, self.cpu(), limits.window_s)
        return result, (share if share is not None and share > limits.cpu_share else None)

    def _remember(self, configs: list[Config], choice: RouteChoice) -> None:
        """Cache the decision, unless a timing was made while the machine was busy (then the next start times again)."""
        if self.busy:
            self.log(f"not cached: timed while the machine was busy: {'; '.join(self.busy)}")
            return
        routes.remember(self.file, configs, choice)

    # ------------------------------------------------------------------ what the page and runs are told
    def run_note(self) -> str:
        """What a run made before the start finished is told (empty once it has)."""
        if self.done.is_set() or self.phase not in ("compiling", "timing", "starting"):
            return ""
        took = time.monotonic() - self.started
        return (f" Ran eagerly: this machine's fastest configuration is still being {'compiled' if self.phase == 'compiling' else 'timed'} "
                f"({took:.0f} s since the start); later runs use it once it is ready.")

    def _set(self, **changes: Any) -> Settings:
        self.app.settings = dataclasses.replace(self.app.settings, **changes)
        return self.app.settings

    # ------------------------------------------------------------------ the work
    def start(self, then: Optional[Callable[[], None]] = None) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(then,), name="startup", daemon=True)
        thread.start()
        return thread

    def run(self, then: Optional[Callable[[], None]] = None) -> None:
        try:
            self._choose()
        except Exception as exc:       # noqa: BLE001: the page keeps serving its eager defaults
            self.error = exc
            self.log(f"start-up choices failed ({type(exc).__name__}: {exc}); serving eagerly")
            self._set(compiled=False, compiled_note=f"compiled CPU forward: off, the start failed "
                                                    f"({type(exc).__name__})")
        finally:
            self.phase = "ready"
            self.log(f"{DONE_LINE} {time.monotonic() - self.started:.0f} s")
            self.done.set()
        if then is not None:
            then()

    def _configs(self) -> tuple[str, list[Config]]:
        can = self.compile and compiled.compiler_missing() is None
        if self.pinned:
            configs = [Config(self.pinned)] + ([Config(self.pinned, True)] if can else [])
            return self.pinned, configs
        base = self.app.settings.default_target()
        return base, routes.candidates(base, load_presets(), device=pick_device().type, can_compile=can)

    def _choose(self) -> None:
        base, configs = self._configs()
        hit = routes.cached(base, configs, self.file) if len(configs) > 1 else None
        eager = [c for c in configs if not c.compiled]
        if hit is not None:
            choice = hit
            self._serve_eager(hit.config if not hit.config.compiled else Config(hit.config.preset), hit)
        elif len(configs) == 1:
            choice = RouteChoice(configs[0], base, "only-one")
        else:
            self.phase = "timing"
            final = len(eager) == len(configs)
            choice = routes.rank(base, eager, measure=self.measure, progress=self.log, final=final)
            self._serve_eager(choice.config, choice)
            if final:
                self._remember(configs, choice)
        to_compile = [c for c in configs if c.compiled and (hit is None or c == hit.config)]
        if to_compile:
            choice = self._compiled_stage(base, configs, to_compile, choice, timed=hit is None)
            # only where /proc can tell a busy machine (web/contention.py reads it): elsewhere no run goes on one thread
            if choice.config.compiled and choice.config not in self.reasons and self.cpu() is not None:
                compile_one_thread(self.app.settings.load(choice.config.preset), self.log)
        self._serve(choice, configs)
        self._seed_quiet()
        self.curve_busy = self._choose_strategies()
        if self.curve_busy is not None:
            self.log(f"the default strategies were chosen on a forward-cost curve timed while other processes used "
                     f"{self.curve_busy:.0%} of the cores: it is timed again once the machine is quiet")
            threading.Thread(target=self._retime_when_quiet, name="curve-retime", daemon=True).start()

    def _choose_strategies(self, again: bool = False) -> Optional[float]:
        """The page's default comparison from the served config's forward-cost curve (``chosen_strategies``),
        timed while no run computes and while /proc watches the other processes. ``again``: the kept curve is
        dropped and timed anew. Returns the others' share of the cores when it was over the quiet limit (the
        verdicts are then not trusted), else None."""
        settings = self.app.settings
        lm = settings.load(settings.default_target())
        fast = bool(settings.compiled)

        def curve() -> Any:
            if again:           # dropped inside the hold: no run finds the curve gone and times it itself
                lm.state.forward_cost.pop(fast, None)
            return machine_curve(lm, fast=fast)
        # the curve first, alone on the cores; then the shapes' steps and the default race, each run alone but runs
        # let through between them (a slow CPU times them for tens of seconds); then the choice, which times nothing
        # (so neither holds the line nor is watched)
        cost, curve_busy = self._watched(curve)
        steps, steps_busy = self._watched(lambda: timed_steps(settings, cost, hold=self.app.line.exclusive),
                                          exclusive=False)
        busy = max((b for b in (curve_busy, steps_busy) if b is not None), default=None)
        served = Config(settings.default_target(), fast).key
        history = None if busy is not None else history_for(self.file, served, RACE_TOKENS)
        chosen = chosen_strategies(settings, curve=cost, steps=steps, history=history)
        self._set(strategies=chosen.strategies, strategies_note=chosen.strategies_note,
                  ticked_note=chosen.ticked_note, prophet_shape=chosen.prophet_shape, prophet_note=chosen.prophet_note)
        if chosen.prophet_note:
            self.log(f"{SHAPE_LINE} {json.dumps(dict(chosen.prophet_shape))}: {chosen.prophet_note}")
        self.log(f"{TICKED_LINE} {', '.join(chosen.strategies)}")
        for line in self.app.settings.ticked_note.splitlines():
            self.log(f"ticked by default here: {line}")
        for line in self.app.settings.strategies_note.splitlines():
            self.log(f"not ticked by default here: {line}")
        return busy

    def _retime_when_quiet(self) -> None:
        """Every ``retry_s``: when no visitor's run is in line and the other processes left the cores free for a second,
        time the curve again and choose the default strategies from it; done once a timing was quiet."""
        limits = self.app.limits.quiet
        while not self.stopped.wait(self.retry_s):
            if not self.app.line.idle():
                continue
            before = self.cpu()
            time.sleep(max(1.0, limits.window_s))
            share = others_share(before, self.cpu(), limits.window_s)
            if share is None or share > limits.cpu_share:
                continue
            try:
                self.curve_busy = self._choose_strategies(again=True)
            except Exception as exc:    # noqa: BLE001: the strategies chosen at start stay
                self.log(f"timing the forward-cost curve again failed ({type(exc).__name__}: {exc}); the default "
                         f"strategies chosen at start stay")
                return
            if self.curve_busy is None:
                self.log(f"forward-cost curve timed again on a quiet machine; default strategies now: "
                         f"{', '.join(self.app.settings.strategies)}")
                return

    def _seed_quiet(self) -> None:
        """The served config's quiet baseline (``web/quiet.py``), taken now rather than after a visitor's run."""
        if not self.app.settings.quiet_recordings:
            return
        settings = self.app.settings
        model, fast = settings.default_target(), settings.compiled
        found = baselines_of(self.app).seed((model, fast), decode_probe(settings.load, model, fast),
                                            self.app.limits.quiet)
        if found is not None:
            self.log(f"greedy's decode step here: {found.ms:.0f} ms" + (
                "" if found.share is None else f" (others used {found.share:.0%} of the cores"
                + (": not trusted, measured again after a run)" if found.share > self.app.limits.quiet.cpu_share
                   else ")")))

    def _serve_eager(self, config: Config, choice: RouteChoice) -> None:
        compiling = self.compile and compiled.compiler_missing() is None
        self._set(target=config.preset, target_note=choice.reason, compiled=False,
                  compiled_note=("compiled CPU forward: being prepared in the background; runs go eagerly until it "
                                 "is ready" if compiling else self.app.settings.compiled_note))
        self.log(choice.reason)

    def _compiled_stage(self, base: str, configs: list[Config], to_compile: list[Config], choice: RouteChoice,
                        timed: bool) -> RouteChoice:
        self.phase = "compiling"
        costs, reasons = dict(choice.costs), {}
        for config in to_compile:
            reason = self.compile_fn(self.app.settings.load(config.preset), self.log)
            if reason is not None:
                reasons[config] = reason
                self.log(f"{config.label}: stays eager, {reason}")
        self.reasons.update(reasons)
        if timed:
            # every config timed again, interleaved with the compiled ones, each keeping its cheapest figures: the
            # eager ones were timed earlier, under other conditions (a start loads, converts and measures kernels)
            ready = [c for c in configs if not (c.compiled and c in reasons)]
            for round_ in range(ROUNDS):
                for config in (ready if round_ % 2 else ready[::-1]):
                    self.log(f"timing {config.label}'s race step on this CPU")
                    c = self.measure(config)
                    old = costs.get(config.key)
                    c1, cw = (c[1], c[WIDTH]) if old is None else (min(c[1], old["c1_ms"]), min(c[WIDTH], old["cW_ms"]))
                    costs[config.key] = routes.cost_entry(c1, cw)
        if not timed:                       # the cached decision stands if its compile worked
            return choice if choice.config not in reasons else RouteChoice(Config(choice.config.preset), base,
                                                                            "cache", choice.costs)
        measured = [c for c in configs if c.key in costs]
        final = routes.rank(base, measured, measure=self.measure, earlier=costs)
        if not reasons:
            self._remember(configs, final)
        return final

    def _serve(self, choice: RouteChoice, configs: list[Config]) -> None:
        """Publish the chosen config's compiled forward while no run computes; drop the other engines."""
        winner = choice.config
        for config in configs:
            if config.compiled and config != winner:
                lm = self.app.settings.load(config.preset)
                if compiled.engine(lm) is None:       # never published: drop the unused graphs
                    compiled.disable(lm)
        reasons = self.reasons
        lm = self.app.settings.load(winner.preset)
        with self.app.line.exclusive():
            if winner.compiled and compiled.publish(lm):
                stats = compiled.engine(lm).stats()
                note = (f"compiled CPU forward: on for {lm.name} (inductor; {stats['graphs']} graphs, compiled in "
                        f"{stats['compile_s']:.0f} s; attention: {stats['attention']}); it measured the cheapest "
                        f"race step here")
                products = (attention_kernels.half_note() if lm.weights == "fp16" else
                            kernels.bf16_note() if lm.weights == "bf16" else
                            kernels.w8a8_note() if lm.weights == "w8a8" else "")
                note += f"; {products}" if products else ""
                self._set(target=winner.preset, target_note=choice.reason, compiled=True, compiled_note=note)
            else:
                why = next(iter(reasons.values()), None) if reasons else None
                if not self.compile:
                    why = "turned off at start (--no-compile)"
                elif any(c.compiled for c in configs) and why is None:
                    why = "the eager version measured cheaper here"
                note = "compiled CPU forward: off, " + (why or compiled.why_not(lm) or "this model stays eager")
                self._set(target=winner.preset, target_note=choice.reason, compiled=False, compiled_note=note)
        if choice.source in ("measured", "partial"):
            forget_models(keep=(winner.preset,))    # the versions timed but not served are not kept loaded
        self.log(choice.reason)
        self.log(self.app.settings.compiled_note)
