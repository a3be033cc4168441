"""Choosing the CPU linear kernel per bucket of row counts (decoding/runtime/kernel_choice.py): timing, table, cache."""

from __future__ import annotations

import json

import pytest
import torch

from decoding.runtime import kernel_choice, kernels
from decoding.runtime.kernel_choice import PROBE_ROWS, configure

from tiny_models import tiny_causal

pytestmark = pytest.mark.skipif(not kernels.available(), reason="this PyTorch build has no oneDNN linear ops")

MIXED = ("default", "default", "packed", "packed", "packed", "packed")


class FakeTimer:
    """Default kernel faster below 4 rows, packed from 4 rows on; records every call."""

    def __init__(self, packed_from: int = 4) -> None:
        self.packed_from = packed_from
        self.calls: list[tuple[tuple, int, str]] = []

    def __call__(self, layer, kind, x) -> float:
        rows = x.numel() // x.shape[-1]
        self.calls.append((kernels.shape_of(layer), rows, kind))
        fast = "packed" if rows >= self.packed_from else "default"
        return 1e-3 if kind == fast else 2e-3


def _shape_counts(model) -> dict:
    counts: dict = {}
    for _, _, layer in kernels.linear_layers(model):
        counts[kernels.shape_of(layer)] = counts.get(kernels.shape_of(layer), 0) + 1
    return counts


@pytest.mark.parametrize("arch", ["llama", "gptneox"])
def test_a_timer_that_favours_default_for_few_rows_gives_the_mixed_table(arch):
    lm = tiny_causal(arch, seed=0)
    counts = _shape_counts(lm.model)
    timer = FakeTimer()
    choice = configure(lm.model, "auto", name="tiny", timer=timer, repeats=2)
    assert choice.source == "measured"
    assert choice.table == {shape: MIXED for shape in counts}
    assert kernels.label(lm.model) == "mixed: default 1-3, onednn-packed 4+"
    # every layer (the LM head included) timed once per repeat, probe row count and kernel
    seen: dict = {}
    for shape, rows, kind in timer.calls:
        seen[(shape, rows, kind)] = seen.get((shape, rows, kind), 0) + 1
    assert seen == {(shape, rows, kind): 2 * n for shape, n in counts.items()
                    for rows in PROBE_ROWS for kind in kernels.KINDS}
    assert kernels.shape_of(lm.model.get_output_embeddings()) in {s for s, _, _ in timer.calls}
    # model-wide cost per bucket: sums over the layers of every shape
    n_layers = sum(counts.values())
    assert choice.bucket_ms[0] == {"rows": "1", "probe_rows": 1, "default_ms": n_layers * 1.0,
                                   "packed_ms": n_layers * 2.0, "chosen_ms": n_layers * 1.0}


def test_timing_stops_after_one_repeat_once_its_budget_is_spent():
    lm = tiny_causal("llama", seed=0)
    kernels.apply(lm.model, "packed")
    timer = FakeTimer()
    kernel_choice.measure(lm.model, repeats=3, timer=timer, budget_s=0.0)
    n_layers = sum(_shape_counts(lm.model).values())
    assert len(timer.calls) == n_layers * len(PROBE_ROWS) * len(kernels.KINDS)


def test_when_one_kernel_always_wins_the_other_holds_no_memory():
    lm = tiny_causal("llama", seed=0)
    configure(lm.model, "auto", timer=FakeTimer(packed_from=10 ** 6))      # default always faster
    assert not kernels.is_packed(lm.model) and kernels.label(lm.model) == "default"
    lm = tiny_causal("llama", seed=0)
    configure(lm.model, "auto", timer=FakeTimer(packed_from=0))            # packed always faster
    assert kernels.label(lm.model) == "onednn-packed"


def test_a_near_tie_stays_on_the_default_kernel():
    shape = (64, 64)
    timings = {(shape, b, "default"): 1.0 for b in range(len(kernels.BUCKETS))}
    timings.update({(shape, b, "packed"): 0.99 if b < 3 else 0.9 for b in range(len(kernels.BUCKETS))})
    assert kernel_choice.decide(timings)[shape] == ("default",) * 3 + ("packed",) * 3


def test_one_kernel_per_bucket_for_the_whole_model_even_where_one_shape_alone_prefers_the_other():
    """Isolated per-shape timings mixed the kernels inside a forward, which lost in whole forwards: the
    model-wide sum decides each bucket, for every layer."""
    small, big = (64, 64), (64, 4096)
    timings = {}
    for b in range(len(kernels.BUCKETS)):
        timings[(small, b, "default")], timings[(small, b, "packed")] = 1.0, 1.2      # small alone: default
        timings[(big, b, "default")], timings[(big, b, "packed")] = 10.0, 5.0         # the model: packed
    assert kernel_choice.decide(timings) == {small: ("packed",) * 6, big: ("packed",) * 6}
    timings[(big, 0, "packed")] = 11.0                                               # 1 row: default overall
    assert kernel_choice.decide(timings)[small] == ("default",) + ("packed",) * 5


def test_the_decision_is_cached_reread_and_invalidated_by_a_new_key(tmp_path, monkeypatch):
    path = tmp_path / "kernels.json"
    first = FakeTimer()
    choice = configure(tiny_causal("llama").model, "auto", name="tiny", file=path, timer=first)
    assert choice.source == "measured" and first.calls and path.is_file()
    doc = json.loads(path.read_text())
    assert doc["entries"][0]["key"]["cpu"] == kernel_choice.cpu_name()
    assert doc["entries"][0]["key"]["threads"] == torch.get_num_threads()

    # 1. same machine and model: read back, nothing timed, the same kernels
    again = FakeTimer(packed_from=0)
    lm = tiny_causal("llama")
    cached = configure(lm.model, "auto", name="tiny", file=path, timer=again)
    assert cached.source == "cache" and not again.calls
    assert cached.table == choice.table and kernels.label(lm.model) == "mixed: default 1-3, onednn-packed 4+"
    redo = configure(lm.model, "auto", name="tiny", file=path, timer=again, remeasure=True)
    assert redo.source == "measured" and again.calls and kernels.label(lm.model) == "onednn-packed"
    assert configure(tiny_causal("llama").model, "auto", name="tiny", file=path).table == redo.table

    # 2. another CPU, another thread count, another model name: each measures again
    changes = [lambda: monkeypatch.setattr(kernel_choice, "cpu_name", lambda: "Some Other CPU"),
               lambda: monkeypatch.setattr(torch, "get_num_threads", lambda: 7),
               lambda: None]
    for n, change in enumerate(changes):
        change()
        timer = FakeTimer(packed_from=0)
        lm = tiny_causal("llama")
        fresh = configure(lm.model, "auto", name="tiny" if n < 2 else "tiny-2", file=path, timer=timer)
        assert fresh.source == "measured" and timer.calls, n
        assert kernels.label(lm.model) == "onednn-packed"
    assert len(json.loads(path.read_text())["entries"]) == 4     # the re-measured entry replaced the first


@pytest.mark.parametrize("text", ["{not json", '{"version": %d, "entries": 3}', '{"version": %d, "entries": [3, null]}',
                                  '[1, 2]'])
def test_a_broken_cache_file_is_measured_again(tmp_path, text):
    """A decision file cut short or edited by hand (not JSON, entries not a list, entries not objects) is measured
    again; every decision file is read the same way (``read_entries``: the version choice's, the races')."""
    from decoding.runtime.kernel_choice import VERSION, read_entries
    path = tmp_path / "kernels.json"
    path.write_text(text.replace("%d", str(VERSION)))
    assert read_entries(path, VERSION) == []
    choice = configure(tiny_causal("llama").model, "auto", file=path, timer=FakeTimer())
    assert choice.source == "measured" and json.loads(path.read_text())["entries"]


def test_forcing_each_kernel_and_bad_modes():
    lm = tiny_causal("llama")
    assert configure(lm.model, "packed").source == "forced" and kernels.label(lm.model) == "onednn-packed"
    assert configure(lm.model, "default").source == "forced" and kernels.label(lm.model) == "default"
    with pytest.raises(ValueError, match="kernels must be one of"):
        configure(lm.model, "fast")
    assert configure(tiny_causal("llama", dtype=torch.float64).model, "auto").source == "unavailable"


def test_load_model_and_cli_check_the_kernel_arguments():
    from playground.cli import EXIT_USAGE, main
    from decoding.runtime.models import load_model
    with pytest.raises(ValueError, match="kernels must be"):
        load_model("smollm2-135m-instruct", kernels="fastest")
    with pytest.raises(ValueError, match="pack=False"):
        load_model("smollm2-135m-instruct", pack=False, kernels="packed")
    assert main(["run", "--prompt", "hi", "--no-pack", "--kernels", "packed"]) == EXIT_USAGE
    with pytest.raises(SystemExit):
        main(["run", "--prompt", "hi", "--kernels", "fastest"])


def test_the_environment_names_the_cpu_and_the_kernel_of_each_bucket():
    from decoding.harness.runner import environment
    from decoding.runtime.pair import ModelPair
    lm = tiny_causal("llama")
    lm.state.kernel_choice = configure(lm.model, "auto", timer=FakeTimer())
    env = environment(ModelPair(lm), 0)
    assert env["cpu"] == kernel_choice.cpu_name() and env["cpu"]
    assert [b["kernel"] for b in env["target"]["kernel_buckets"]] == ["default"] * 2 + ["onednn-packed"] * 4
    assert env["target"]["kernel_choice"]["source"] == "measured"
    json.dumps(env)


def test_the_shared_folder_keeps_only_the_newest_decisions(tmp_path):
    """Local directories and Hub models each get a file in the shared folder: it must stay bounded."""
    import os

    from decoding.runtime.kernel_choice import SHARED_FILES, cache_file
    shared = cache_file(tmp_path / "models", "/some/local/dir", converted=False).parent
    shared.mkdir(parents=True)
    for i in range(SHARED_FILES + 5):                      # older files first
        f = shared / f"old-{i:03d}.json"
        f.write_text("{}")
        os.utime(f, (1_000_000 + i, 1_000_000 + i))
    path = cache_file(tmp_path / "models", "/one/more/dir", converted=False)
    configure(tiny_causal("llama").model, "auto", name="/one/more/dir", file=path, timer=FakeTimer())
    left = sorted(p.name for p in shared.glob("*.json"))
    assert len(left) == SHARED_FILES and path.name in left           # the new decision is kept
    assert "old-000.json" not in left and f"old-{SHARED_FILES + 4:03d}.json" in left   # the oldest went
    # a converted model's own kernels.json is never pruned by the shared rule
    own = cache_file(tmp_path / "models", "bundled", converted=True)
    configure(tiny_causal("llama").model, "auto", name="bundled", file=own, timer=FakeTimer())
    assert own.is_file() and len(list(shared.glob("*.json"))) == SHARED_FILES
