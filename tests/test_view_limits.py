"""Views must cost what they show: every view of the largest traces the import allows, under a memory cap.

Each case builds a trace at the import checks' limits (``visualize/checks.py``, ``visualize/traces.py``:
the most numbers per event in every shape, the most events, the longest strings, the deepest and widest
trees), writes it to a file, imports it with ``import_trace_file`` as the app does, and draws every view
of ``visualize/page.py`` (and the race's live columns, the Jacobi heatmap, the sweep figure), serialized
as the browser gets them. All of it runs in a subprocess without torch, its address space capped by
``RLIMIT_AS``; per case the harness measures CPU seconds (not wall-clock: the test machine is shared),
the peak RSS growth (``/proc/self/clear_refs`` resets the peak) and the largest view sent, and reports a
failure instead of dying. The control run puts back the old lookahead mask (the whole grid built, then
cut) and requires the harness to report it failed: over the RSS budget, out of memory or out of time.

Run by hand: ``python tests/test_view_limits.py cases`` prints one JSON line per case.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from view_limits_cases import (EVIL, M, beams_and_sampling, chains_and_trees, crafted_many, crafted_wide, draft_tree,
                               jacobi_copies_crosstok, long_params, longest_strings, lookahead_shapes, lookahead_step,
                               make_result, most_events, over_the_cap, row, row_4000, widest_row)

ROOT = Path(__file__).resolve().parents[1]
ADDRESS_SPACE = 2**30            # RLIMIT_AS of the subprocess (the cases peak near 200 MB)
CPU_STOP_S = 30                  # a case still running after this much CPU time is stopped and failed
# every case, import and every view: a few CPU seconds, a few hundred MB, no view sent over 1 MB
LIMITS = {"cpu_import_s": 6.0, "cpu_s": 10.0, "peak_mb": 300, "view_mb": 1.0}
# the cases: imported and drawn as the app does on import within 2 s; under 100 MB with every view
CRAFTED = {"cpu_import_s": 2.0, "cpu_s": 10.0, "peak_mb": 100, "view_mb": 1.0}


CASES = {                        # name: (trace builder, limits, expected outcome)
    "crafted_wide": (crafted_wide, CRAFTED, "refused"), "widest_row": (widest_row, CRAFTED, "drawn"),
    "crafted_many": (crafted_many, CRAFTED, "drawn"),
    "lookahead_shapes": (lookahead_shapes, LIMITS, "drawn"), "chains_and_trees": (chains_and_trees, LIMITS, "drawn"),
    "beams_and_sampling": (beams_and_sampling, LIMITS, "drawn"),
    "jacobi_copies_crosstok": (jacobi_copies_crosstok, LIMITS, "drawn"), "most_events": (most_events, LIMITS, "drawn"),
    "longest_strings": (longest_strings, LIMITS, "drawn"), "long_params": (long_params, LIMITS, "drawn"),
    "over_the_cap": (over_the_cap, LIMITS, "refused"), "sweep": (None, LIMITS, "drawn"),
    "row_4000": (row_4000, CRAFTED, "drawn")}     # the measurement: drawn by the control only
CONTROL = ["row_4000", "widest_row"]


# --------------------------------------------------------------------------- the harness (in the subprocess)
def _status(key: str) -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith(key)) / 1024


def _sizes(views: dict, out: dict) -> None:
    """Record each view's size as sent (HTML text, figure JSON); no raw markup from the trace may be in it."""
    for name, value in views.items():
        text = value if isinstance(value, str) else value.to_json() if value is not None else ""
        if "<img" in text:
            raise AssertionError(f"{name}: unescaped markup from the trace")
        out[name] = max(out.get(name, 0), len(text))


def draw_everything(doc: dict) -> dict:
    """The views of the page at the first and a middle replay step and at the end (the last step is
    ``first_views``), the wall-clock race, the live columns, the Jacobi heatmap: view -> bytes."""
    from visualize import iterations, page, race
    out: dict = {}
    steps = sorted({e["step"] for r in doc["results"] for e in r["events"]})
    for step in [steps[0], steps[len(steps) // 2]] if steps else []:
        _sizes(page.step_html(doc, step), out)
        for strategy in page.drafted(doc)[:3] or [None]:
            _sizes({f"{k}@{strategy}": v for k, v in page.step_figures(doc, step, strategy).items()}, out)
    _sizes({f"{k}@end": v for k, v in page.step_html(doc, None).items()}, out)
    for strategy in page.drafted(doc)[:3]:
        _sizes({f"inspector@{strategy}": page.inspector_view(doc, strategy, 10**9)}, out)
    _sizes({f"race_{k}": v for k, v in page.race_views(doc, race.race_length_ms(doc["results"]) / 2, 1.0).items()},
           out)
    snapshot = {"done": doc["results"][:-1], "running": dict(doc["results"][-1], running=True), "waiting": []}
    _sizes({"live": race.live_columns_html(snapshot)}, out)
    for r in doc["results"]:
        if iterations.has_iterations(r):
            _sizes({"jacobi_view": iterations.jacobi_view(r), "jacobi_heatmap": iterations.jacobi_heatmap(r),
                    "jacobi_heatmap@1": iterations.jacobi_heatmap(r, 1)}, out)
    return out


def _sweep_views() -> dict:
    from visualize.charts import sweep_figure
    points = [{"values": [x, y, z], "speedup": 1 + x / 100, "tokens_per_target_forward": 2.0}
              for x in range(300) for y in range(300) for z in (EVIL, "b")]
    line = [{"values": [x], "speedup": 1.0} for x in range(5000)]
    return {"sweep": sweep_figure({"strategy": EVIL, "keys": ["a", "b", EVIL], "points": points}),
            "sweep_line": sweep_figure({"strategy": "s", "keys": [EVIL], "points": line})}


def first_views(doc: dict) -> dict:
    """What the app draws when a trace is imported (``web/handlers._outputs``): view -> bytes."""
    from visualize import page, race
    out: dict = {}
    top, choices = page.top_step(doc), page.drafted(doc)
    _sizes({**page.chart_views(doc), **page.step_html(doc, top),
            **page.step_figures(doc, top, choices[0] if choices else None),
            "clock": page.race_views(doc, race.race_length_ms(doc["results"]), None)["clock"]}, out)
    if choices:
        _sizes({"inspector": page.inspector_view(doc, choices[0], 1)}, out)
    return out


def warm_up() -> None:
    """Draw a small trace once: plotly's first figure of each kind loads its validators (not a case's cost)."""
    from visualize.traces import export_trace, import_trace
    tree = draft_tree(2, 3, True)
    small = [dict(e, step=2) for e in (tree, lookahead_step(2, [row(4)] * 2, [[1, 2]]))]
    small += [{"type": "BeamStep", "step": 1, "tokens": [[1], [2]], "scores": [-1.0, -2.0], "finished": 0},
              {"type": "SamplingFilter", "step": 1, "position": 0, "tokens": [1, 2], "p_raw": [0.5, 0.5]},
              {"type": "Distribution", "step": 2, "position": 1, "tokens": [1, 2], "p_target": [0.5, 0.5]},
              {"type": "JacobiIteration", "step": 1, "block": 0, "iteration": 0, "start": 0, "guess": [1, 2],
               "converged": 1}]
    warm = make_result("warm", small, stats={"accepted_lengths": [1]})
    draw_everything(import_trace(export_trace({"results": [warm]})))


def run_case(name: str, workdir: str, every: bool = True) -> dict:
    """Build, write, import and draw one case: its outcome, CPU seconds and peak RSS growth for the import
    with the views the app draws then (``cpu_import_s``, ``peak_import_mb``) and with every view, and its
    largest view. ``every``: False draws only what the import draws."""
    import gc
    import time
    from visualize.traces import _give_back, import_trace_file
    build = CASES[name][0]
    path = os.path.join(workdir, f"{name}.json")
    if build is not None:
        with open(path, "w") as fh:
            json.dump(build(), fh, separators=(",", ":"))
    gc.collect()
    _give_back()                                   # the builder's garbage is not the case's
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")                              # the peak RSS starts again from here (Linux 4.0+)
    before, cpu = _status("VmRSS"), time.process_time()
    report = {"case": name, "mb": round(os.path.getsize(path) / 2**20, 2) if build else 0.0}
    try:
        sizes: dict = {}
        if build is None:
            _sizes(_sweep_views(), sizes)
        else:
            doc = import_trace_file(path)
            sizes.update(first_views(doc))
            report["cpu_import_s"] = round(time.process_time() - cpu, 3)
            report["peak_import_mb"] = round(_status("VmHWM") - before, 1)
            for view, size in (draw_everything(doc) if every else {}).items():
                sizes[view] = max(size, sizes.get(view, 0))
        report["outcome"], report["biggest"] = "drawn", max(sizes.items(), key=lambda kv: kv[1])
    except ValueError as exc:
        report["outcome"], report["error"] = "refused", str(exc)[:200]
    except BaseException as exc:                   # MemoryError under RLIMIT_AS, the CPU stop, a crash
        report["outcome"], report["error"] = "failed", f"{type(exc).__name__}: {str(exc)[:200]}"
    report["cpu_s"] = round(time.process_time() - cpu, 3)
    report["peak_mb"] = round(_status("VmHWM") - before, 1)
    report.setdefault("cpu_import_s", report["cpu_s"])
    report.setdefault("peak_import_mb", report["peak_mb"])
    return report


def old_mask_figure(result: dict, step=None):
    """The lookahead mask as it was before issue 25: the whole size x size grid built, then cut to 160 rows."""
    import plotly.graph_objects as go
    from visualize import masks
    e = masks.step_at(result, step)
    if e is None:
        return go.Figure()
    window = [list(lv) for lv in e.get("window") or () if lv]
    width = min((len(lv) for lv in window), default=0)
    _, parents = masks.paths_tree(e.get("candidates") or ())
    allowed, _, first = masks.step_layout(1, parents, len(window), width)
    z = [r[:masks.MAX_ROWS] for r in masks.kinds(allowed, 1, first, width)[:masks.MAX_ROWS]]
    return go.Figure(go.Heatmap(z=z))


def main(mode: str, names: list) -> None:
    import resource
    import signal
    import tempfile
    sys.modules["torch"] = None                    # the views never import torch: an import attempt fails
    sys.path.insert(0, str(ROOT))
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))

    def stop(*_):
        raise TimeoutError(f"over {CPU_STOP_S} CPU seconds")
    signal.signal(signal.SIGPROF, stop)
    warm_up()
    if mode == "control":                         # the page draws the old mask
        import visualize.page
        visualize.page.mask_figure = old_mask_figure
    with tempfile.TemporaryDirectory() as workdir:
        for name in names or [n for n in CASES if n not in CONTROL or mode == "control"]:
            signal.setitimer(signal.ITIMER_PROF, CPU_STOP_S)
            report = run_case(name, workdir, every=mode == "cases")
            signal.setitimer(signal.ITIMER_PROF, 0)
            print(json.dumps(report), flush=True)


def _start(mode: str, names: list) -> subprocess.Popen:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, __file__, mode, *names], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=ROOT)


def _reports(proc: subprocess.Popen) -> list[dict]:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-2000:]
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def runs() -> dict:
    """The cases in two subprocesses and the control in a third, run side by side (CPU time is per process)."""
    names = [n for n in CASES if n != "row_4000"]
    alone = ["most_events", "long_params", "sweep", "over_the_cap", "crafted_wide"]   # about half the work
    procs = {"cases": [_start("cases", alone), _start("cases", [n for n in names if n not in alone])],
             "control": [_start("control", CONTROL)]}
    return {mode: sorted((r for p in ps for r in _reports(p)), key=lambda r: list(CASES).index(r["case"]))
            for mode, ps in procs.items()}


def _verdict(report: dict) -> list[str]:
    """What is wrong with one case's report (nothing: [])."""
    _, limits, expected = CASES[report["case"]]
    wrong = []
    if report["outcome"] != expected:
        wrong.append(f"{report['outcome']} (expected {expected}): {report.get('error')}")
    for key in ("cpu_import_s", "cpu_s"):
        if report[key] > limits[key]:
            wrong.append(f"{key} {report[key]} > {limits[key]}")
    if report["peak_mb"] > limits["peak_mb"]:
        wrong.append(f"peak RSS +{report['peak_mb']} MB > {limits['peak_mb']}")
    if report.get("biggest") and report["biggest"][1] > limits["view_mb"] * 2**20:
        wrong.append(f"view {report['biggest'][0]} is {report['biggest'][1] / 2**20:.1f} MB")
    return wrong


# --------------------------------------------------------------------------- the tests
def test_every_view_of_the_largest_traces_costs_what_it_shows(runs):
    reports = runs["cases"]
    assert [r["case"] for r in reports] == [n for n in CASES if n != "row_4000"]
    problems = {r["case"]: _verdict(r) for r in reports if _verdict(r)}
    assert not problems, json.dumps(reports, indent=1)
    refused = {r["case"]: r["error"] for r in reports if r["outcome"] == "refused"}
    assert f"results[0].events[0] holds {M + 1} numbers; the limit is {M}" in refused["over_the_cap"]
    assert "results[0].events[0] holds" in refused["crafted_wide"] and f"the limit is {M}" in refused["crafted_wide"]


def test_the_harness_catches_a_view_that_builds_its_whole_input(runs):
    reports = runs["control"]
    assert sorted(r["case"] for r in reports) == sorted(CONTROL)
    for r in reports:
        assert _verdict(r), r                      # the old mask: out of memory, out of time, or over budget


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
