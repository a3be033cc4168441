"""Tests for bugs that once slipped by every other test (issue 28's surviving mutants), and a fast test of the
request-body limit for bodies sent without a length (chunked)."""

from __future__ import annotations

import asyncio

import pytest

from decoding.drafting import universal
from decoding.drafting.tokenbridge import Vocab
from decoding.drafting.universal import realign, to_target
from decoding.params import LookaheadParams
from decoding.runtime.pair import ModelPair
from decoding.strategies import lookahead
from test_universal import ASSISTANT_TOK, TARGET_TOK
from tiny_models import tiny_causal
from web.guards import BodyLimit


def test_realign_re_encodes_the_cached_tokens_before_the_boundary():
    """Cached "a" then committed "aa": the assistant's tokenizer writes "aa" as one token. Keeping the cached
    "a" (no lookbehind) would feed the assistant a spelling it never produces, ["a", "a"]."""
    av = Vocab(ASSISTANT_TOK)
    ids, ends = av.encode(b"a")
    assert realign(av, ids, ends, b"a", b"aa") == av.encode(b"aa") == ([3], [2])
    assert universal.LOOKBEHIND > 0


def test_a_token_straddling_the_boundary_as_the_windows_first_is_split():
    """Committed "a", drafted "b": the window "ab" encodes as one token that starts before the boundary. Its
    drafted part alone ("b") is the answer; taking the window's token would spell "a" twice."""
    tv = Vocab(TARGET_TOK)
    assert tv.encode(b"ab") == ([3], [2])
    assert to_target(tv, b"a", [1], b"b") == ([1], [1])


def test_lookahead_keeps_guess_set_n_grams_per_key(monkeypatch):
    """The pool's bound per key is the parameter G (``guess_set``), not the window W."""
    sizes = []
    real = lookahead.NgramPool

    class Recording(real):
        def __init__(self, per_key, *args, **kwargs):
            sizes.append(per_key)
            super().__init__(per_key, *args, **kwargs)
    monkeypatch.setattr(lookahead, "NgramPool", Recording)
    lm = tiny_causal("llama", seed=1, vocab=32, eos=False)
    params = LookaheadParams(window=2, ngram=3, guess_set=5)
    lookahead.lookahead([1, 2, 3, 4], ModelPair(lm), params, max_new_tokens=6)
    assert sizes == [5]


# --------------------------------------------------------------------------- the body limit, without a length
async def _send(limit: BodyLimit, chunks: list[bytes], headers=()) -> tuple[int, bytes, int]:
    """Drive ``limit`` with a POST whose body comes in ``chunks``; returns (status, body, bytes the app read)."""
    pending = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent: list[dict] = []

    async def receive():
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)
    scope = {"type": "http", "method": "POST", "path": "/gradio_api/call/run", "headers": list(headers)}
    await limit(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, body, limit.app.read


class _Reader:
    """An app that reads the whole body, then answers 200."""

    def __init__(self) -> None:
        self.read = 0

    async def __call__(self, scope, receive, send):
        while True:
            message = await receive()
            self.read += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


@pytest.mark.parametrize("chunks,status", [([b"x" * 400] * 2, 200), ([b"x" * 400] * 3, 413),
                                           ([b"x" * 1001], 413), ([b""] * 5 + [b"x" * 999], 200)])
def test_a_body_without_a_length_is_counted_as_it_arrives(chunks, status):
    got, body, read = asyncio.run(_send(BodyLimit(_Reader(), default=1000), chunks))
    assert got == status
    if status == 413:
        assert b"over the limit of 1000 bytes" in body and read <= 1000 + len(chunks[-1])


def test_a_declared_length_over_the_limit_is_refused_unread():
    got, _, read = asyncio.run(_send(BodyLimit(_Reader(), default=1000), [b"x" * 10],
                                     headers=[(b"content-length", b"5000")]))
    assert got == 413 and read == 0
