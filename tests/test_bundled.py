"""Baselines on the bundled SmolLM2-135M-Instruct match transformers' generate."""

from __future__ import annotations

import pytest
import torch

from decoding.harness.runner import encode_prompt, token_pieces
from decoding.params import BeamParams, GreedyParams
from decoding.runtime.models import load_model
from decoding.runtime.pair import ModelPair
from decoding.strategies.baselines import beam, greedy

PROMPTS = ["What is the capital of France? Answer in one sentence.",
           "Write a Python function that reverses a string."]


@pytest.fixture(scope="module")
def lm():
    return load_model("smollm2-135m-instruct")


def _generate(lm, ids, **kw):
    t = torch.tensor([ids])
    out = lm.model.generate(t, attention_mask=torch.ones_like(t), do_sample=False, **kw)[0, len(ids):]
    return out.tolist()


@pytest.mark.parametrize("text", PROMPTS)
def test_greedy_matches_generate(lm, text):
    ids = encode_prompt(lm.tokenizer, text, chat=True)
    ours = greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=32).token_ids
    assert ours == _generate(lm, ids, max_new_tokens=32)


def test_beam_matches_generate(lm):
    ids = encode_prompt(lm.tokenizer, PROMPTS[0], chat=True)
    ours = beam(ids, ModelPair(lm), BeamParams(num_beams=4), max_new_tokens=24).token_ids
    ref = _generate(lm, ids, max_new_tokens=24, num_beams=4)
    assert ours == ref[: len(ours)] and all(t == lm.model.generation_config.pad_token_id
                                            for t in ref[len(ours):])


def test_chat_template_and_pieces(lm):
    ids = encode_prompt(lm.tokenizer, "Hi", chat=True)
    text = lm.tokenizer.decode(ids)
    assert "<|im_start|>user" in text and text.rstrip().endswith("<|im_start|>assistant")
    sample = lm.tokenizer("Paris — café ☕ naïve", add_special_tokens=False)["input_ids"]
    assert "".join(token_pieces(lm.tokenizer, sample)) == lm.tokenizer.decode(sample)
