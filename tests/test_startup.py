"""The start's choices made behind the page (web/startup.py), with injected race steps and compiles.

What would break it: the page waiting for the compile (the eager choice not served first), a run during the
compile that runs compiled or does not say it ran eagerly, the compiled forward published while a race
computes, serving compiled when the eager config measured cheaper (or the reverse), a failed compile that
takes the app down, and a cached decision timed again. Also the race's own step: "quiet" and the version
choice read decode steps from the run's events, never the prefill.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from decoding.events import ForwardPass
from decoding.harness import steps as steps_mod
from decoding.harness.steps import decode_steps_ms, median_step_ms
from decoding.params import GreedyParams
from decoding.runtime import compiled, omp_pool, routes
from decoding.runtime.pair import ModelPair
from decoding.runtime.warmup import warm
from decoding.strategies.baselines import greedy
from decoding.runtime.models import ModelPreset
from decoding.runtime.routes import WIDTH, Config
from web import startup
from web.crowd import Computation, Line
from web.app_object import PlaygroundApp
from web.settings import Settings

from fake_proc import FakeProc
from tiny_models import prompt, tiny_causal

BASE = "base"
needs_compiler = pytest.mark.skipif(compiled.compiler_missing() is not None,
                                    reason=f"no compiled path here: {compiled.compiler_missing()}")


def _presets() -> dict:
    return {BASE: ModelPreset(BASE, "org/base", network=False),
            "base-fp16w": ModelPreset("base-fp16w", "org/base", network=False, base=BASE, weights="fp16")}


@pytest.fixture
def world(monkeypatch, tmp_path):
    """An app whose default target has two versions (tiny llamas), strategies chosen without timing."""
    models = {BASE: tiny_causal("llama", seed=1), "base-fp16w": tiny_causal("llama", seed=2)}
    monkeypatch.setattr(startup, "load_presets", _presets)
    monkeypatch.setattr(routes, "runs_here", lambda preset, device="cpu": True)
    monkeypatch.setattr(Settings, "load", lambda self, name: models[name])
    monkeypatch.setattr(startup, "chosen_strategies", lambda settings, **kw: settings)
    monkeypatch.setattr(startup, "machine_curve", lambda lm, fast=False: None)     # no curve: nothing timed
    monkeypatch.setattr(startup, "forget_models", lambda keep=(): [])
    app = PlaygroundApp(Settings(target=BASE))
    yield app, models, tmp_path / "routes.json"
    for lm in models.values():
        compiled.disable(lm)


def _table(**steps: float) -> dict:
    """Injected race steps: config label -> step ms (split 40/60 between c(1) and c(WIDTH))."""
    return {Config.parse(k.replace("__", "|").replace("_", "-")): {1: 0.4 * v, WIDTH: 0.6 * v}
            for k, v in steps.items()}


@needs_compiler
def test_the_eager_choice_serves_at_once_and_the_compiled_forward_only_when_ready(world, monkeypatch):
    app, models, file = world
    one_thread = []          # the winner's graph for a busy run: compiled before it is published, winner only
    monkeypatch.setattr(startup, "compile_one_thread", lambda lm, log: one_thread.append((lm, compiled.engine(lm))))
    table = _table(base__eager=200.0, base_fp16w__eager=150.0, base__compiled=100.0, base_fp16w__compiled=120.0)
    gate, inside, seen = threading.Event(), threading.Event(), []

    def compile_fn(lm, log):            # what compile_unpublished does, held until the test lets it finish
        reason = compiled.enable(lm, publish=False)
        seen.append(compiled.engine(lm))    # not published: even this thread sees none outside building()
        inside.set()
        gate.wait(60)
        return reason
    start = startup.Startup(app, measure=table.__getitem__, compile_fn=compile_fn, file=file)
    thread = start.start()
    assert inside.wait(60) and start.phase == "compiling"
    # the page serves the cheapest eager version while the compile runs, and says runs go eagerly
    assert app.settings.target == "base-fp16w" and not app.settings.compiled
    assert "eagerly" in app.settings.compiled_note and "Ran eagerly" in start.run_note()
    assert seen == [None] and compiled.engine(models[BASE]) is None
    gate.set()
    thread.join(60)
    assert start.done.is_set() and start.run_note() == ""
    # compiled float32 measured cheapest of all: it serves, published, and the page ticks fast for it
    assert app.settings.target == BASE and app.settings.compiled
    assert compiled.engine(models[BASE]) is not None and "on for" in app.settings.compiled_note
    assert "base (compiled)" in app.settings.target_note
    assert one_thread == [(models[BASE], None)]


@needs_compiler
def test_no_one_thread_graph_where_proc_cannot_tell_a_busy_machine(world, monkeypatch):
    """A container whose /proc counts the host's cores (``read_proc`` gives None) never sends a run to one thread, so
    its start compiles no graph for it (45 s at a first start on the Zen 5)."""
    app, models, file = world
    one_thread = []
    monkeypatch.setattr(startup, "compile_one_thread", lambda lm, log: one_thread.append(lm))
    table = _table(base__eager=200.0, base_fp16w__eager=150.0, base__compiled=100.0, base_fp16w__compiled=120.0)
    start = startup.Startup(app, measure=table.__getitem__, compile_fn=lambda lm, log: compiled.enable(lm, False),
                            file=file, cpu=lambda: None)
    start.run()
    assert app.settings.compiled and app.settings.target == BASE and one_thread == []


@needs_compiler
def test_a_busy_run_finds_its_one_thread_graph_compiled_before_the_forward_was_published():
    lm = tiny_causal("llama", seed=3)
    ids = prompt(6, 1)
    ref = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=8).token_ids
    try:
        with omp_pool.threads(2):                      # the app's count (the suite's workers run one each)
            assert compiled.enable(lm, publish=False) is None
            with compiled.building(lm):
                warm(lm, widths=(1,))
            engine, lines = lm.state.compiled, []
            assert engine.entries() == 1
            assert startup.compile_one_thread(lm, lines.append) is not None
            assert engine.entries() == 2 and "one thread" in lines[0]
            assert compiled.engine(lm) is None          # still this thread's alone until it is published
            compiled.publish(lm)
            with omp_pool.threads(1):                   # a run on a busy machine: nothing left to compile
                assert greedy(ids, ModelPair(lm), GreedyParams(fast=True), max_new_tokens=8).token_ids == ref
            assert engine.entries() == 2
            assert greedy(ids, ModelPair(lm), GreedyParams(fast=True), max_new_tokens=8).token_ids == ref
            assert engine.entries() == 2
        with omp_pool.threads(1):                       # a process on one thread has no other count to compile
            assert startup.compile_one_thread(lm) is None
    finally:
        compiled.disable(lm)


def test_strategies_chosen_on_a_curve_timed_busy_are_chosen_again_once_the_machine_is_quiet(world, monkeypatch):
    """A start made while two busy loops held the cores timed the curve busy (prompt lookup came out at 1.45x a
    one-position forward against 1.10x quiet, and was left out): the default strategies are chosen again from a
    curve timed anew, once no run is in line and /proc says the cores are free, and never from the kept one."""
    import dataclasses
    app, models, file = world
    proc, chosen, logs, histories = FakeProc(others=1.6), [], [], []
    narrow, wide = ("greedy", "prophet"), ("greedy", "prophet", "prompt_lookup", "lookahead")

    def curve(lm, fast=False):           # the curve, timed where none is kept
        return lm.state.forward_cost.setdefault(fast, f"curve timed with others at {proc.others}")

    def choose(settings, **kw):          # what the curve would say: drafting pays only when timed quiet
        chosen.append((proc.others, kw["curve"]))
        histories.append(kw["history"])
        quiet = proc.others <= 0.5
        return dataclasses.replace(settings, strategies=wide if quiet else narrow, strategies_note="",
                                   prophet_shape=(("tree_nodes", 4),) if quiet else (),
                                   prophet_note="prophet: drafts a tree of 4 nodes here" if quiet else "")

    class Curves(dict):                  # the busy curve must be dropped while no run computes (a run that
        def pop(self, *args):           # found it gone would time the curve itself, in a visitor's race)
            dropped.append(app.line._held)
            return super().pop(*args)
    dropped = []
    for lm in models.values():
        lm.state.forward_cost = Curves()
    monkeypatch.setattr(startup, "chosen_strategies", choose)
    monkeypatch.setattr(startup, "machine_curve", curve)
    start = startup.Startup(app, measure=_table(base__eager=200.0, base_fp16w__eager=150.0).__getitem__,
                            compile=False, file=file, log=logs.append, cpu=proc, retry_s=0.05)
    try:
        start.run()
        assert start.curve_busy == pytest.approx(0.8) and app.settings.strategies == narrow
        assert any("timed again once the machine is quiet" in line for line in logs)
        time.sleep(1.5)                          # past one look (each waits a second of /proc)
        assert len(chosen) == 1                  # still busy: not timed again
        proc.others = 0.0
        deadline = time.monotonic() + 30
        while app.settings.strategies != wide and time.monotonic() < deadline:
            time.sleep(0.05)
        assert app.settings.strategies == wide and start.curve_busy is None
        assert chosen[0] == (1.6, "curve timed with others at 1.6")
        assert chosen[-1] == (0.0, "curve timed with others at 0.0")    # timed anew, never the kept busy one
        assert dropped == [True]                 # ... dropped inside the line's hold
        # the busy start's races are neither pooled with this machine's earlier ones nor kept; the quiet one's are
        assert histories[0] is None and histories[-1].path == file.with_name("races.json")
        assert histories[-1].key["config"] == "base-fp16w|eager"      # the served config (the cheaper version)
        assert any("timed again on a quiet machine" in line for line in logs)
        time.sleep(0.3)
        assert len(chosen) == 2                  # done once a timing was quiet
        # each choice is logged by name (benchmarks/bench_start.py races the last one)
        assert [line for line in logs if line.startswith(startup.TICKED_LINE)] == [
            f"{startup.TICKED_LINE} greedy, prophet",
            f"{startup.TICKED_LINE} greedy, prophet, prompt_lookup, lookahead"]
        # and the prophet's step shape with them: the page's fields follow the last choice
        assert app.settings.prophet_shape == (("tree_nodes", 4),)
        assert [line for line in logs if line.startswith(startup.SHAPE_LINE)] == [
            f'{startup.SHAPE_LINE} {{"tree_nodes": 4}}: prophet: drafts a tree of 4 nodes here']
    finally:
        start.stopped.set()


def test_a_curve_timed_quiet_is_trusted_and_not_timed_again(world, monkeypatch):
    app, models, file = world
    chosen = []
    monkeypatch.setattr(startup, "chosen_strategies", lambda settings, **kw: chosen.append(1) or settings)
    start = startup.Startup(app, measure=_table(base__eager=200.0, base_fp16w__eager=150.0).__getitem__,
                            compile=False, file=file, cpu=FakeProc(others=0.05), retry_s=0.05)
    try:
        start.run()
        time.sleep(0.3)
        assert start.curve_busy is None and chosen == [1]
    finally:
        start.stopped.set()


def test_the_steps_are_timed_after_the_curve_a_run_at_a_time_with_runs_let_through_between(world, monkeypatch):
    """The shapes' steps and the default race are timed on the curve the start just timed (lookahead's auto window
    comes from it), each run holding the line (no visitor's run computes beside it) and releasing it after (a run
    waiting for the line goes between them, not after all of them); the steps reach the choice, and a start whose
    steps came out empty gives it none (it then models a step from the curve; the choice itself never times:
    tests/test_prophet_shape.py)."""
    app, models, file = world
    seen, held = [], []
    monkeypatch.setattr(startup, "machine_curve", lambda lm, fast=False: "the curve")

    def timed_steps(settings, curve, hold):
        seen.append((curve, app.line._held))           # not held around the whole timing
        for _ in range(3):
            with hold():
                held.append(app.line._held)            # each run alone
            held.append(app.line._held)
        return {"tree2": steps_mod.StepRatio(1.5, 0.02, 3)}
    got = []
    monkeypatch.setattr(startup, "timed_steps", timed_steps)
    monkeypatch.setattr(startup, "chosen_strategies", lambda settings, **kw: got.append(kw) or settings)
    start = startup.Startup(app, measure=_table(base__eager=200.0, base_fp16w__eager=150.0).__getitem__,
                            compile=False, file=file, cpu=FakeProc(others=0.05), retry_s=0.05)
    try:
        start.run()
        assert seen == [("the curve", False)] and held == [True, False] * 3
        history = got[0].pop("history")
        assert got == [{"curve": "the curve", "steps": {"tree2": steps_mod.StepRatio(1.5, 0.02, 3)}}]
        assert history.path == file.with_name("races.json")         # a quiet start: its races pooled and kept
        monkeypatch.setattr(startup, "timed_steps", lambda settings, curve, hold: None)
        start._choose_strategies()
        assert {k: v for k, v in got[-1].items() if k != "history"} == {"curve": "the curve", "steps": None}
    finally:
        start.stopped.set()


def _runs(steps_ms: list, wall_ms: float = 100.0, tokens: int = 24, forwards: int = 24) -> steps_mod.Timed:
    return steps_mod.Timed(list(steps_ms), wall_ms, tokens, forwards)


def test_step_ratios_hold_the_line_for_each_run_warm_ups_included(monkeypatch):
    entered = []

    @contextlib.contextmanager
    def hold():
        entered.append("in")
        yield
        entered.append("out")
    monkeypatch.setattr(steps_mod, "_timed_run", lambda name, params, ids, pair: lambda tokens: _runs([10.0, 10.0]))
    monkeypatch.setattr(steps_mod, "_prompt_ids", lambda lm: [1])
    steps_mod.step_ratios(None, {"a": ("prophet", None)}, None, repeats=3, hold=hold)
    assert entered == ["in", "out"] * 8                # 2 warm-ups, then greedy and "a" in each of 3 rounds


@needs_compiler
def test_an_eager_config_that_measures_cheaper_keeps_the_forward_eager(world):
    app, models, file = world
    table = _table(base__eager=200.0, base_fp16w__eager=90.0, base__compiled=100.0, base_fp16w__compiled=95.0)
    start = startup.Startup(app, measure=table.__getitem__,
                            compile_fn=lambda lm, log: compiled.enable(lm, publish=False), file=file)
    start.run()
    assert app.settings.target == "base-fp16w" and not app.settings.compiled
    assert "eager version measured cheaper" in app.settings.compiled_note
    assert compiled.engine(models[BASE]) is None and not isinstance(models[BASE].state.compiled, compiled.Engine)
    # the decision is cached: the next start times nothing and serves the same
    again = PlaygroundApp(Settings(target=BASE))
    startup.Startup(again, measure=lambda config: pytest.fail(f"timed {config} again"),
                    compile_fn=lambda lm, log: pytest.fail("compiled a config that does not serve"), file=file).run()
    assert again.settings.target == "base-fp16w" and not again.settings.compiled


def test_a_failed_compile_serves_eagerly_and_says_why(world, monkeypatch):
    app, models, file = world
    monkeypatch.setattr(compiled, "compiler_missing", lambda: None)
    table = _table(base__eager=200.0, base_fp16w__eager=150.0, base__compiled=100.0, base_fp16w__compiled=90.0)
    start = startup.Startup(app, measure=table.__getitem__,
                            compile_fn=lambda lm, log: "compiling failed (CalledProcessError)", file=file)
    start.run()
    assert start.done.is_set() and start.error is None
    assert app.settings.target == "base-fp16w" and not app.settings.compiled
    assert "compiling failed" in app.settings.compiled_note
    assert not file.exists()        # an incomplete ranking is not cached: the next start tries again


def test_without_a_compiler_only_eager_configs_are_timed(world, monkeypatch):
    app, models, file = world
    monkeypatch.setattr(compiled, "compiler_missing", lambda: "no C++ compiler on this machine")
    timed = []
    table = _table(base__eager=100.0, base_fp16w__eager=150.0)
    start = startup.Startup(app, measure=lambda c: timed.append(c) or table[c],
                            compile_fn=lambda lm, log: pytest.fail("no compiler"), file=file)
    start.run()
    assert sorted(timed) == sorted(table) and app.settings.target == BASE and not app.settings.compiled
    assert "C++ compiler" in app.settings.compiled_note


def test_a_versions_timing_holds_the_line_for_each_run_and_forward_and_never_computes_outside():
    """``steps.race_measure`` (the start's timing of a version): the load and every forward of the timing run inside
    the hold, one hold per timed run or forward, so a visitor's run waiting for the line goes between them (the
    whole config under one hold kept the first run of a busy start waiting through every timing)."""
    import contextlib
    from types import SimpleNamespace
    from decoding.harness.steps import race_measure
    from tiny_models import tiny_causal
    lm, state = tiny_causal(), {"inside": False, "holds": 0, "outside": 0, "loads": []}

    @contextlib.contextmanager
    def hold():
        assert not state["inside"]                      # never nested: each hold is one run or one forward
        state["inside"], state["holds"] = True, state["holds"] + 1
        try:
            yield
        finally:
            state["inside"] = False

    def counted(module, args, kwargs):
        state["outside"] += not state["inside"]
    handle = lm.model.register_forward_pre_hook(counted, with_kwargs=True)
    try:
        costs = race_measure(lambda preset: state["loads"].append(state["inside"]) or lm, 4, hold)(
            SimpleNamespace(preset="tiny", compiled=False))
    finally:
        handle.remove()
    assert set(costs) == {1, 4} and all(ms > 0 for ms in costs.values())
    assert state["loads"] == [True] and state["outside"] == 0
    # the load, greedy's warm-up and 3 runs, the curve's prefill, its warm-up and at least 3 passes over its widths
    assert state["holds"] >= 1 + 4 + 2 + 3 * 3


def test_publishing_waits_for_the_running_race_and_holds_the_next():
    """``Line.exclusive``: the start publishes the compiled forward only between races."""
    line = Line(slots=1)
    release, order = threading.Event(), []

    def racing(comp):
        order.append("race starts")
        release.wait(10)
        order.append("race ends")
    first = Computation("a", racing)
    line.submit(first)
    for _ in range(200):
        if order:
            break
        time.sleep(0.01)
    held = threading.Event()

    def publisher():
        with line.exclusive():
            order.append("published")
            held.set()
            time.sleep(0.2)
        order.append("released")
    threading.Thread(target=publisher, daemon=True).start()
    time.sleep(0.2)
    assert order == ["race starts"]           # the publisher waits for the running race
    release.set()
    assert held.wait(10)
    second = Computation("b", lambda comp: order.append("next race"))
    line.submit(second)
    assert second.done.wait(10) and first.done.wait(10)
    assert order == ["race starts", "race ends", "published", "released", "next race"]


def _events(prefill_ms: float, steps: list[float]) -> tuple[list, list]:
    events, times, t = [], [], 0.0
    t += prefill_ms
    events.append(ForwardPass(0, "target", 400, prefill_ms, "prefill"))
    times.append(t)
    for i, step in enumerate(steps):
        events.append(ForwardPass(i + 1, "target", 1, step * 0.9, "decode"))
        t += step
        times.append(t)
    return events, times


def test_a_runs_decode_steps_exclude_the_prefill_however_long():
    events, times = _events(2000.0, [80.0, 82.0, 79.0, 81.0])
    assert decode_steps_ms(events, times) == pytest.approx([80.0, 82.0, 79.0, 81.0])
    assert median_step_ms(events, times) == pytest.approx(80.5)
    as_dicts = [{"type": type(e).__name__, **e.__dict__} for e in events]
    assert median_step_ms(as_dicts, times) == pytest.approx(80.5)
    assert median_step_ms(events[:1], times[:1]) is None


def test_inductor_caches_where_the_readme_says_not_in_the_temporary_folder(monkeypatch, tmp_path):
    """Importing some of transformers' models makes inductor write its default folder (under /tmp, lost at every
    restart of a Space) into TORCHINDUCTOR_CACHE_DIR: that value is not taken for the operator's choice."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    from decoding.runtime import attention_kernels
    machine = attention_kernels.machine_folder()
    monkeypatch.setattr(attention_kernels, "PERSISTENT", tmp_path / "no-such-data")
    monkeypatch.delenv("DECODING_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    assert compiled.cache_dir() == tmp_path / "xdg" / "decoding-playground" / "inductor" / machine
    assert compiled.use_cache_dir() == compiled.cache_dir()          # pointing inductor there nests nothing
    import os
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(compiled.cache_dir())
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "operator"))       # the operator's own
    assert compiled.cache_dir() == tmp_path / "operator" / machine
    assert compiled.use_cache_dir() == tmp_path / "operator" / machine
    assert compiled.cache_dir() == tmp_path / "operator" / machine
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setattr(attention_kernels, "PERSISTENT", data)                      # a Space's /data
    assert compiled.cache_dir() == data / "decoding-playground" / "inductor" / machine


def test_each_cpu_and_instruction_cap_gets_its_own_inductor_folder(monkeypatch, tmp_path):
    """Inductor's graph cache does not key its entries by the kernels' instruction set: make test's AVX2-capped
    pass read back the first pass's int8-weight graphs and got garbage tokens (or an abort). The folder is keyed
    by the CPU's flags, the kernels' cap and PyTorch's version, so none of them can share a graph."""
    from decoding.runtime import attention_kernels, cpu
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "operator"))
    here = compiled.cache_dir()
    monkeypatch.setattr(cpu, "kernel_isa", lambda: "AVX2,ONEDNN_MAX_CPU_ISA=AVX2")
    capped = compiled.cache_dir()
    monkeypatch.setattr(cpu, "cpuinfo", lambda key: "fpu sse2 avx2" if key == "flags" else "")
    other_cpu = compiled.cache_dir()
    monkeypatch.setattr(attention_kernels.torch, "__version__", "9.9.9+cpu")
    other_torch = compiled.cache_dir()
    folders = [here, capped, other_cpu, other_torch]
    assert len(set(folders)) == 4, folders
    assert all(f.parent == tmp_path / "operator" for f in folders)
    assert other_torch.name.startswith("torch-9.9.9+cpu-cpu-")


@pytest.mark.parametrize("capability, flags, arch", [
    ("AVX512", "fpu avx2 avx512f amx_tile", "native"),         # an AMX Xeon, uncapped
    ("AVX2", "fpu avx2 avx512f amx_tile", "x86-64-v3"),        # the same machine under make test's AVX2 caps
    ("AVX2", "fpu avx2 avx_vnni", "x86-64-v3"),                # an AVX-VNNI client core, capped
    ("AVX2", "fpu avx2 fma f16c", "native"),                   # an AMD EPYC Zen 3: native is AVX2 already
    ("DEFAULT", "fpu sse2", "native")])
def test_the_projects_kernels_are_built_for_avx2_when_pytorchs_are_capped_there(monkeypatch, capability, flags,
                                                                                 arch):
    """Under make test's AVX2 caps, PyTorch's, oneDNN's, MKL's and inductor's code runs AVX2; the project's own C++
    kernels (attention, the float16-weight product) are built with -march=native, so the capped pass ran their
    AVX-512 code (16-float vectors, other sums) and never the code a Zen 3 builds. Capped, they target x86-64-v3,
    and the build's flags (part of its cache key) say so."""
    from decoding.runtime import attention_kernels
    monkeypatch.setattr(attention_kernels.torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(attention_kernels, "cpuinfo", lambda key: flags if key == "flags" else "")
    assert attention_kernels.target_arch() == arch
    assert f"-march={arch}" in attention_kernels._flags()


def test_a_page_built_before_the_choices_shows_them_when_it_loads():
    """``start_views`` (web/page_start.py): what a page built with the first settings changes on load once the start chose (the
    target, its head, the strategies, ``fast`` where the forward now runs compiled, the notes), and nothing for a
    page built with the settings it shows (a change would overwrite a visitor's form for nothing)."""
    from web.page_start import start_views
    built = Settings(target_note="being timed")
    assert start_views(built, built) == {}
    chosen = Settings(target="smollm2-135m-instruct-fp16w", target_note="fp16w <compiled> serves",
                      compiled=True, compiled_note="on", strategies=("greedy", "prophet"))
    views = start_views(chosen, built)
    assert views["model"] == "smollm2-135m-instruct-fp16w" and views["strategies"] == ["greedy", "prophet"]
    assert views[("fast", "greedy")] is True and views[("fast", "prophet")] is True
    assert "&lt;compiled&gt;" in views["target_note"]["value"] and views["target_note"]["visible"]
    notes_only = start_views(Settings(target_note="still timing, 40 s"), built)
    assert set(notes_only) == {"target_note", "compiled_note", "strategies_note"}     # the form stays the visitor's


def test_the_cpu_label_says_when_the_kernels_are_capped(monkeypatch):
    """Benchmark rows are keyed by ``cpu_label``: a run under the AVX2 caps must not replace the same CPU's
    uncapped rows (BENCHMARKS.md keeps both)."""
    from decoding.runtime import kernel_choice
    fields = {"flags": "fpu avx2 avx512f amx_bf16", "cpu family": "6", "model": "167", "model name": "Xeon"}
    monkeypatch.setattr(kernel_choice, "_cpuinfo", lambda key: fields.get(key, ""))
    monkeypatch.setattr(kernel_choice, "pytorch_isa", lambda: "AVX512")
    assert kernel_choice.cpu_label() == "Xeon (family 6 model 167; AMX)"
    monkeypatch.setattr(kernel_choice, "pytorch_isa", lambda: "AVX2")
    assert kernel_choice.cpu_label() == "Xeon (family 6 model 167; AMX, kernels capped at AVX2)"
