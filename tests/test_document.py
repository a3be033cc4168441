"""One writer of the run document (decoding/harness/document.py) for the CLI and the web app, one versus check,
one set of generation-field labels."""

from __future__ import annotations

import dataclasses

import pytest

from decoding.harness.document import DOCUMENT_KEYS, GENERATION_LABELS, as_document, check_versus
from decoding.processors import GenerationSettings
from playground import cli


def test_every_generation_setting_has_one_label_and_one_cli_flag():
    assert tuple(GENERATION_LABELS) == tuple(f.name for f in dataclasses.fields(GenerationSettings))
    run = next(a for a in cli.build_parser()._actions if a.dest == "command").choices["run"]
    flags = {a.dest: a for a in run._actions}
    for name, (label, text) in GENERATION_LABELS.items():
        assert label.startswith(name + " (") and text in flags[name].help


def test_the_versus_check_refuses_the_target_itself_under_each_front_ends_name():
    assert check_versus(None, "a") is None and check_versus("b", "a") == "b"
    with pytest.raises(ValueError, match="--versus: 'a' is the target model already"):
        check_versus("a", "a", "--versus")


def test_a_document_has_the_keys_in_order_and_an_old_recording_gets_its_generation():
    old = {"results": [], "max_new_tokens": 4, "prompt_ids": [1], "chat": True, "prompt": "Hi", "environment": {},
           "extra": 1}
    doc = as_document(old)
    assert tuple(doc) == DOCUMENT_KEYS and doc["generation"] == dataclasses.asdict(GenerationSettings())
    given = as_document({**old, "generation": {"repetition_penalty": 1.5}})
    assert given["generation"] == {"repetition_penalty": 1.5}


def test_the_web_writes_its_document_through_the_harness_writer(monkeypatch):
    """A change to the harness writer reaches the web's document (no second writer to forget)."""
    from decoding.harness import document
    from web import documents
    from web.loading import Prepared
    monkeypatch.setattr(document, "environment", lambda pair, seed: {"cpu": "/home/someone/cpu", "seed": seed})

    class Result:
        def to_dict(self):
            return {"strategy": "greedy", "error": "failed in /home/someone/x.py", "model": None}
    doc, message = documents.run_document([Result()], Prepared(None, [5, 6], 4, 7, "m", ""), "Hi", True, None)
    assert tuple(doc) == DOCUMENT_KEYS and doc["environment"] == {"cpu": "[path]", "seed": 7}
    assert doc["results"][0]["error"] == "failed in [path]" and "greedy: failed in [path]" in message
