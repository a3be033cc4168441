"""The command line: JSON shape, generate parity through the CLI, local directories, bad input."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys

import pytest
import torch

from decoding.runtime.models import cache_root, load_model
from playground import cli

PROMPT = "Name three colours of the rainbow."
RESULT_KEYS = {"strategy", "params", "token_ids", "text", "wall_s", "tokens_per_s",
               "target_forwards", "draft_forwards", "stats", "events"}


_GENERATED: dict = {}


def _generate(lm, ids, **kw):
    """transformers' generate, computed once per (weights, prompt, settings): the preset and its local directory
    hold the same weights, so both parametrizations compare against the same reference."""
    weights = lm.model.get_input_embeddings().weight.detach()
    key = (tuple(weights.shape), float(weights[:8].double().sum()), tuple(ids), tuple(sorted(kw.items())))
    if key not in _GENERATED:
        _GENERATED[key] = _generate_once(lm, ids, **kw)
    return _GENERATED[key]


def _generate_once(lm, ids, **kw):
    t = torch.tensor([ids])
    out = lm.model.generate(t, attention_mask=torch.ones_like(t), do_sample=False, **kw)[0, len(ids):]
    pad = lm.model.generation_config.pad_token_id
    new = out.tolist()
    while new and new[-1] == pad and 2 in new[:-1]:
        new.pop()
    return new


@pytest.mark.parametrize("target", ["smollm2-135m-instruct", "local-dir"])
def test_run_json_matches_generate(tmp_path, target, capsys):
    load_model("smollm2-135m-instruct")
    spec = str(cache_root() / "smollm2-135m-instruct") if target == "local-dir" else target
    out = tmp_path / "out.json"
    rc = cli.main(["run", "--target", spec, "--strategy", "greedy", "--strategy", "beam",
                   "--set", "num_beams=4", "--chat", "--prompt", PROMPT, "--max-new-tokens", "12",
                   "--no-warmup", "--json", str(out), "--quiet"])
    assert rc == 0
    table = capsys.readouterr().out
    assert "strategy" in table and "tok/s" in table and "speedup" in table and "beam" in table
    doc = json.loads(out.read_text())
    assert {"environment", "prompt_ids", "results"} <= set(doc)
    assert doc["environment"]["device"] == "cpu" and doc["environment"]["seed"] == 0
    lm = load_model(spec)
    by_name = {r["strategy"]: r for r in doc["results"]}
    for r in doc["results"]:
        assert RESULT_KEYS <= set(r) and r["events"] and r["error"] is None
    assert by_name["greedy"]["token_ids"] == _generate(lm, doc["prompt_ids"], max_new_tokens=12)
    assert by_name["beam"]["params"]["num_beams"] == 4
    assert by_name["beam"]["token_ids"] == _generate(lm, doc["prompt_ids"], max_new_tokens=12, num_beams=4)
    assert by_name["greedy"]["text"] == lm.tokenizer.decode(by_name["greedy"]["token_ids"],
                                                            skip_special_tokens=True)


@pytest.mark.parametrize("args,message", [
    (["--set", "num_beams=0", "--strategy", "beam"], "num_beams must be in [1, 16]"),
    (["--set", "temperature=-1", "--strategy", "sample"], "temperature must be in [0, 100]"),
    (["--set", "top_p=nan", "--strategy", "sample"], "top_p must be finite"),
    (["--set", "num_beams=4", "--strategy", "greedy"], "no selected strategy has a parameter 'num_beams'"),
    (["--set", "num_beams", "--strategy", "beam"], "--set expects KEY=VALUE"),
    (["--strategy", "nope"], "unknown strategy 'nope'"),
    (["--max-new-tokens", "0"], "max_new_tokens must be in [1, 1024]"),
    (["--max-new-tokens", "99999"], "max_new_tokens must be in [1, 1024]"),
    (["--target", "gpt2-xl"], "offline"),
])
def test_bad_input_exits_2_with_message(args, message, capsys):
    rc = cli.main(["run", "--prompt", "hi", "--quiet", *args])
    assert rc == 2
    assert message in capsys.readouterr().err


def test_empty_prompt(capsys):
    assert cli.main(["run", "--prompt", "   ", "--quiet"]) == 2
    assert "prompt must not be empty" in capsys.readouterr().err


def test_module_entry_point_and_list(monkeypatch, capsys):
    """``python -m playground`` in a fresh interpreter lists; its exit status is main()'s (the refusal's 2, run
    in-process through the same ``__main__`` module: an entry point that dropped main()'s status exits 0)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "playground", "list"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "greedy" in proc.stdout and "smollm2-135m-instruct" in proc.stdout and "beam" in proc.stdout
    monkeypatch.setattr(sys, "argv", ["playground", "run", "--prompt", "x", "--strategy", "beam",
                                      "--set", "num_beams=-3"])
    with pytest.raises(SystemExit) as exc:          # any other exception (a traceback) fails the test
        runpy.run_module("playground", run_name="__main__", alter_sys=True)
    assert exc.value.code == 2 and "num_beams" in capsys.readouterr().err


def test_the_old_entry_point_names_the_new_one():
    """``python -m decoding`` (the library) is no command line any more: it runs nothing, exits 2 and says where
    the command line went, for any arguments."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    for args in ([], ["run", "--prompt", "x", "--strategy", "greedy"], ["list"]):
        proc = subprocess.run([sys.executable, "-m", "decoding", *args], capture_output=True, text=True, env=env,
                              timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert "the command line moved: python -m playground" in proc.stderr
        assert proc.stdout == "" and "Traceback" not in proc.stderr


def test_generation_settings_reach_every_strategy_and_the_json(tmp_path):
    """--repetition-penalty and --no-repeat-ngram-size: greedy matches generate with the same settings, the
    prophet tree stays identical to that greedy, and the document records the settings."""
    out = tmp_path / "gen.json"
    rc = cli.main(["run", "--strategy", "greedy", "--strategy", "prophet", "--chat", "--prompt", PROMPT,
                   "--max-new-tokens", "20", "--repetition-penalty", "1.3", "--no-repeat-ngram-size", "3",
                   "--no-warmup", "--json", str(out), "--quiet"])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["generation"]["repetition_penalty"] == 1.3 and doc["generation"]["no_repeat_ngram_size"] == 3
    lm = load_model("smollm2-135m-instruct")
    greedy_ids, prophet_ids = (r["token_ids"] for r in doc["results"])
    assert greedy_ids == _generate(lm, doc["prompt_ids"], max_new_tokens=20, repetition_penalty=1.3,
                                   no_repeat_ngram_size=3)
    assert prophet_ids == greedy_ids and doc["results"][1]["matches_greedy"] is True


@pytest.mark.parametrize("flag,value,message", [("--repetition-penalty", "0", "repetition_penalty must be in (0, 10]"),
                                                ("--no-repeat-ngram-size", "99", "no_repeat_ngram_size must be in"),
                                                ("--forced-eos-token-id", "99999999", "forced_eos_token_id must be")])
def test_bad_generation_settings_exit_2_with_the_field_named(flag, value, message, capsys):
    rc = cli.main(["run", "--strategy", "greedy", "--prompt", "hi", "--max-new-tokens", "2", flag, value, "--quiet"])
    assert rc == 2 and message in capsys.readouterr().err


def test_run_uses_the_chat_template_by_default_when_the_model_has_one(tmp_path, capsys):
    """An instruct model fed raw text tends to end its answer at once: without a flag `run` wraps the prompt
    in the chat template; --no-chat keeps the raw text; a model without a template gets raw text."""
    from decoding.harness.runner import encode_prompt
    lm = load_model("smollm2-135m-instruct")
    docs = {}
    for flag in ([], ["--no-chat"], ["--chat"]):
        out = tmp_path / f"chat{len(docs)}.json"
        rc = cli.main(["run", "--strategy", "greedy", "--prompt", PROMPT, "--max-new-tokens", "2", "--no-warmup",
                       "--json", str(out), "--quiet", *flag])
        assert rc == 0
        docs[tuple(flag)] = json.loads(out.read_text())
    templated = encode_prompt(lm.tokenizer, PROMPT, chat=True)
    raw = encode_prompt(lm.tokenizer, PROMPT, chat=False)
    assert templated != raw
    assert docs[()]["chat"] is True and docs[()]["prompt_ids"] == templated
    assert docs[("--chat",)]["prompt_ids"] == templated
    assert docs[("--no-chat",)]["chat"] is False and docs[("--no-chat",)]["prompt_ids"] == raw
    assert "chat template" in capsys.readouterr().err

    class Base:                                     # a base model (gemma-3-270m's preset): no chat
        chat = False
    args = cli.build_parser().parse_args(["run", "--strategy", "greedy", "--prompt", "x"])
    notes: list[str] = []
    assert cli._use_chat(args, Base(), notes.append) is False and "not a chat model" in notes[0]
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["run", "--strategy", "greedy", "--prompt", "x", "--chat", "--no-chat"])
