"""The shipped prophet head drafts from the target's hidden states, not from the tokens alone.

Feeding it the right states in the wrong order (reversed within each batch the loop hands over, and
rolled across the answer) must change its drafts and lower what the target accepts. The control: the
same head with the hidden half of its input layer zeroed (a head that ignores the states) drafts the
same whatever the states are, so this check would catch a head that stopped reading them.
"""

from __future__ import annotations

import pytest
import torch
from test_prophet import _greedy

from decoding.drafting.prophet import ProphetDrafter
from decoding.harness.runner import encode_prompt
from decoding.params import ProphetParams
from decoding.runtime.head import PROPHET_DIR, load_prophet
from decoding.runtime.models import load_model
from decoding.runtime.pair import ModelPair
from decoding.strategies.speculative import prophet
from decoding.tracer import Tracer

PROMPT = "Can you give me three tips for staying focused while working from home?"
PARAMS = ProphetParams(lookup=False, tree_nodes=8)
CONTROL_TOKENS = 16


@pytest.fixture(scope="module")
def bundled():
    return load_model("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def shipped(bundled):
    """The shipped head, loaded once here (not ``prophet_for``'s copy, which other modules' tests patch); a test
    that changes it does so through ``monkeypatch``, which puts it back."""
    return load_prophet(PROPHET_DIR / "smollm2-135m-instruct.safetensors", bundled)


def _run(lm, head, ids, n=40):
    tracer = Tracer()
    res = prophet(ids, ModelPair(lm, prophet=head), PARAMS, max_new_tokens=n, tracer=tracer)
    drafts = [tuple(e.tokens) for e in tracer.events if type(e).__name__ in ("DraftTree", "DraftProposed")]
    return res, drafts


def _scrambled(monkeypatch):
    """Every state the drafter is given belongs to another position of the same run (a fixed permutation
    of the states committed so far): the right kind of vector, the wrong content."""
    original = ProphetDrafter.observe
    seen: list[torch.Tensor] = []

    def observe(self, hidden, tokens):
        seen.append(hidden)
        states = torch.cat(seen)                                  # [n, H], the newest m rows last
        n, m = states.shape[0], hidden.shape[0]
        original(self, states[(torch.arange(n - m, n) * 7 + 3) % n], tokens)
    monkeypatch.setattr(ProphetDrafter, "observe", observe)
    return seen


def test_the_shipped_head_reads_its_hidden_state_input(bundled, shipped, monkeypatch):
    ids = encode_prompt(bundled.tokenizer, PROMPT, chat=True)
    want = _greedy(ModelPair(bundled), ids, 40)
    head = shipped
    good, good_drafts = _run(bundled, head, ids)
    seen = _scrambled(monkeypatch)
    bad, bad_drafts = _run(bundled, head, ids)
    assert seen and good.token_ids == want and bad.token_ids == want      # exact either way
    assert good_drafts != bad_drafts
    tpf = [r.stats["mean_tokens_per_target_forward"] for r in (good, bad)]
    assert tpf[1] <= tpf[0] - 0.3, tpf


def test_a_head_that_ignores_its_hidden_states_is_caught(bundled, shipped, monkeypatch):
    """The control: zero the hidden half of the fuse layer and the scrambled states change nothing. The
    scramble changes every state from the first one the drafter is given, so what else it might change
    (the tokens, the order of the calls) shows in the first drafts: 16 tokens are enough."""
    ids = encode_prompt(bundled.tokenizer, PROMPT, chat=True)
    head = shipped
    hidden = head.config.hidden
    w = head.fuse.weight.detach().clone()                     # [H, 2H]: the state's half, then the token's
    w[:, :hidden] = 0
    blind = torch.nn.Linear(2 * hidden, hidden, bias=False)
    blind.weight.data = w.to(head.dtype)
    monkeypatch.setattr(head, "fuse", blind)
    _, normal = _run(bundled, head, ids, CONTROL_TOKENS)
    _scrambled(monkeypatch)
    _, scrambled = _run(bundled, head, ids, CONTROL_TOKENS)
    assert len(normal) >= 8 and normal == scrambled
