"""The prophet's mixed training data: filters, near-duplicates, hold-out by source, resumable units."""

from __future__ import annotations

import random

import pytest
import torch

from playground.training import magpie, prophet_data
from playground.training.magpie import Deduper, keep_new, reject_reason, split_by_source


@pytest.mark.parametrize("text, why", [
    (None, "unfinished"), ("", "empty"), ("  ?! ", "empty"), ("Hi there", "short"),
    (" ".join(["word"] * 90), "long"), ("Visit https://example.com for details please", "markup"),
    ("You are a helpful assistant who answers questions.", "not a request"),
    ("Tell me more about it. Tell me more about it. Tell me more about it.", "repeated"),
    ("the the the cat the the dog the the the the bird the", "repeated"),
    ("1234 5678 9012 3456 7890 !!!! ???? ####", "not text"),
])
def test_sampled_turns_that_are_not_requests_are_dropped(text, why):
    assert reject_reason(text) == why


def test_plain_requests_pass():
    for text in ("Can you provide a Python script that finds the first duplicate element in a list?",
                 "What would happen if the moon disappeared?", "Translate 'good morning' into German."):
        assert reject_reason(text) is None, text


def test_near_duplicates_are_dropped_and_distinct_prompts_kept():
    d = Deduper(threshold=0.5)
    assert d.add("Can you give me a list of the top 10 travel destinations in Europe?")
    assert not d.add("Can you give me a list of the top 10 travel destinations in Europe")     # punctuation
    assert not d.add("can you give me a list of the top 10 travel destinations in europe please?")
    assert d.add("Write a Python function that reverses a linked list.")
    assert d.add("Can you give me a recipe for a vegetarian lasagna?")
    kept, dropped = keep_new(["Write a Python function that reverses a linked list!", None, "ok",
                              "How do volcanoes form under the ocean?"], d)
    assert kept == ["How do volcanoes form under the ocean?"]
    assert dropped == {"duplicate": 1, "unfinished": 1, "short": 1}


def test_dedupe_scales_linearly_with_an_inverted_index():
    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(2000)]
    d = Deduper()
    kept = sum(d.add(" ".join(rng.choice(vocab) for _ in range(12))) for _ in range(3000))
    assert kept == 3000                                           # random texts are all distinct
    assert len(d.index) > 10_000


def test_hold_out_is_by_source_never_by_prompt():
    records = [{"source": s, "prompt": f"{s} {i}"} for s in ("a", "b", "held") for i in range(3)]
    train, held = split_by_source(records, {"held"})
    assert {r["source"] for r in held} == {"held"} and len(held) == 3
    assert {r["source"] for r in train} == {"a", "b"} and len(train) == 6
    assert prophet_data.HELD_NAMES.isdisjoint(s.name for s in prophet_data.SCHEDULE)
    assert all(s.held_out for s in prophet_data.HELD)
    train_seeds = {s for seeds in magpie.SEEDS.values() for s in seeds}
    assert train_seeds.isdisjoint(magpie.HELD_SEEDS)
    pieces = magpie.stdlib_pieces(limit_files=60)
    held_mods = {m for m in pieces if magpie.held_origin(m)}
    assert held_mods and held_mods != set(pieces)                # some modules on each side


class FakeLM:
    """Enough of a LoadedModel for the unit loop; the model calls are patched out."""
    class tokenizer:
        @staticmethod
        def apply_chat_template(messages, tokenize=False, **_):
            return "".join(f"<{m['role']}>{m['content']}</>" for m in messages)
    eos_token_ids = (0,)
    device = torch.device("cpu")


def _fake_model(monkeypatch, calls):
    def sample(lm, prefixes, *, temperature, seed, **_):
        calls.append(("sample", seed, len(prefixes)))
        rng = random.Random(seed)
        return [f" request number {seed} about topic {rng.randrange(10**6)} {i} with more words" for i in
                range(len(prefixes))]

    def answer(lm, conversations, max_new, layers=()):
        calls.append(("answer", len(conversations), tuple(layers)))
        out = [{"tokens": torch.tensor([5, 6, 0]), "hidden": torch.zeros(3, 4, dtype=torch.float16),
                "conversation": c, "answer": "an answer " * 30} for c in conversations]
        for r in out if layers else ():
            r["layers"] = torch.full((3, len(layers), 4), float(sum(layers)), dtype=torch.bfloat16)
        return out
    monkeypatch.setattr(prophet_data, "sample_user_turns", sample)
    monkeypatch.setattr(prophet_data, "answer", answer)


def test_units_resume_split_by_worker_and_never_hold_benchmark_prompts(tmp_path, monkeypatch):
    calls: list = []
    _fake_model(monkeypatch, calls)
    bench = ["request number 5 about topic"]                # near-duplicates of no unit: kept out anyway
    templates = lambda n, seed: [f"template prompt {seed} {i} about something" for i in range(n)]   # noqa: E731
    units = len(prophet_data.HELD) + 6
    made0 = prophet_data.generate_mix(FakeLM(), tmp_path, units=units, minutes=5, batch=4, worker=0, workers=2,
                                      templates=templates, exclude=bench)
    made1 = prophet_data.generate_mix(FakeLM(), tmp_path, units=units, minutes=5, batch=4, worker=1, workers=2,
                                      templates=templates, exclude=bench)
    assert made0 + made1 == units and len(prophet_data.unit_files(tmp_path)) == units
    n_calls = len(calls)
    assert prophet_data.generate_mix(FakeLM(), tmp_path, units=units, minutes=5, batch=4, templates=templates) == 0
    assert len(calls) == n_calls                              # a rerun skips finished units
    train, held, counts = prophet_data.final_records(tmp_path, exclude=bench)
    assert {r["source"] for r in held} <= prophet_data.HELD_NAMES and held
    assert not {r["source"] for r in train} & prophet_data.HELD_NAMES and train
    assert counts["train"] == len(train) and counts["held"] == len(held)
    # a prompt of the benchmark is never trained on, even when a unit made it
    leaked = train[0]["prompt"]
    train2, _, _ = prophet_data.final_records(tmp_path, exclude=[leaked])
    assert leaked not in {r["prompt"] for r in train2}
    assert len(train2) == len(train) - 1
    # follow-ups continue a conversation that a same-side unit answered
    follow = [r for r in train + held if r["source"].startswith("followup")]
    assert follow and all(len(r["conversation"]) == 3 for r in follow)
    assert all(r["conversation"][0]["content"] in {x["prompt"] for x in held if len(x["conversation"]) == 1}
               for r in follow if r["source"] == "followup-held")


def test_the_mix_keeps_near_duplicates_of_benchmark_prompts_out_of_its_template_units(tmp_path, monkeypatch):
    """The templates alone drop only exact copies of benchmark prompts; "What is the difference between
    weather and climate? Answer in two sentences." was a template prompt while the template benchmark asks
    "What is the difference between weather and climate?". The mix's template units drop such near-copies."""
    from playground.train_prophet import benchmark_prompts, build_prompts
    bench = benchmark_prompts()
    assert len(bench) > 40                                    # prompts.yaml and bench_unseen.yaml
    d = Deduper()
    for t in bench:
        d.add(t)
    legacy = build_prompts(600, exclude=frozenset(bench))
    assert any(d.duplicate(t) for t in legacy)
    monkeypatch.setattr(prophet_data, "SCHEDULE", (magpie.Source("template", "template"),))
    monkeypatch.setattr(prophet_data, "HELD", ())
    _fake_model(monkeypatch, [])
    prophet_data.generate_mix(FakeLM(), tmp_path, units=3, minutes=5, batch=200, exclude=bench,
                              templates=lambda n, seed: build_prompts(n, seed=seed, exclude=frozenset(bench)))
    train, _, _ = prophet_data.final_records(tmp_path, exclude=bench)
    assert len(train) > 300 and not any(d.duplicate(r["prompt"]) for r in train)


def test_layer_states_are_kept_for_the_held_units_and_a_rotating_share_of_the_rest(tmp_path, monkeypatch):
    """--store-layers: every held-out unit and one training unit in ``every`` keep intermediate states,
    rotating through the schedule so each source is represented; the training side of a fusion head
    (final_records(layers=True)) is exactly those units' records, with their states attached."""
    n_held, n_src = len(prophet_data.HELD), len(prophet_data.SCHEDULE)
    every = 4
    picked = [u for u in range(n_held, n_held + every * n_src) if prophet_data.layered_unit(u, every)]
    assert len(picked) == n_src                                              # one in four
    assert {prophet_data.source_of(u).name for u in picked} == {s.name for s in prophet_data.SCHEDULE}
    assert all(prophet_data.layered_unit(u, every) for u in range(n_held))
    calls: list = []
    _fake_model(monkeypatch, calls)
    templates = lambda n, seed: [f"template prompt {seed} {i} about something" for i in range(n)]   # noqa: E731
    units = n_held + 8
    prophet_data.generate_mix(FakeLM(), tmp_path, units=units, minutes=5, batch=4, templates=templates,
                              store_layers=(2, 15), layers_every=every)
    layered = {f.name for f in (tmp_path / prophet_data.LAYERS_DIR).glob("*.pt")}
    want = {f.name for f in prophet_data.unit_files(tmp_path) if prophet_data.layered_unit(int(f.name[1:6]), every)}
    assert layered == want and len(layered) < units
    assert all(("layers" in r) is False for r in prophet_data.load_units(tmp_path))     # not unless asked
    train, held, _ = prophet_data.final_records(tmp_path, layers=True)
    assert held and train and all(r["layers"].shape == (3, 2, 4) and float(r["layers"][0, 0, 0]) == 17
                                  for r in train + held)
    assert {r["unit"] for r in train} == {int(n[1:6]) for n in want} - set(range(n_held))
    all_train, _, _ = prophet_data.final_records(tmp_path)
    assert len(all_train) > len(train)


def test_generation_stops_when_the_disk_fills(tmp_path, monkeypatch):
    import shutil
    calls: list = []
    _fake_model(monkeypatch, calls)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: type("U", (), {"free": 5 * 10**9})())
    assert prophet_data.generate_mix(FakeLM(), tmp_path, units=3, minutes=5, batch=4, min_free_gb=10) == 0
    assert prophet_data.generate_mix(FakeLM(), tmp_path, units=3, minutes=5, batch=4, min_free_gb=1) == 3
