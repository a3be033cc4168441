"""An assistant with another tokenizer (transformers' Universal Assisted Decoding), drafting target tokens.

The assistant drafts in its own tokens with its own KV cache; the target verifies
target tokens; the bytes both spell are the common ground (``tokenbridge.py``).

* Greedy (temperature 0): the assistant's draft is spelled out as bytes and
  re-encoded in the target's tokenizer together with a lookbehind window of
  committed target tokens; the target tokens that start at the committed
  boundary are the draft. A target token that would merge across the boundary
  (committed ``Hel`` + drafted ``lo``) is split there: the drafted part of it is
  encoded alone, so the committed tokens never change. The target checks every
  token, so the output is the target's greedy whatever the assistant drafts.
* Sampling: token-level intersection (TLI, Timor et al. 2025, arXiv
  2502.05202). The assistant's distribution is restricted to the tokens that
  exist in both vocabularies and renormalized; each drafted assistant token is
  one target token, and ``q`` rows over the target vocabulary carry exactly the
  distribution it was drawn from, so speculative sampling stays lossless.

Before each draft the assistant's context is brought to the committed target
text: the cached assistant tokens that spell an agreed prefix of it are kept
(less a lookbehind of ``LOOKBEHIND`` tokens, which are re-encoded with the new
text so that tokens merging across the boundary come out as the assistant's
tokenizer would write them), the rest is re-encoded, and the cache is cropped to
where old and new tokens first differ.
"""

from __future__ import annotations

import bisect
from typing import Any, Optional, Sequence

import torch

from decoding.drafting.base import Drafter, Proposal
from decoding.drafting.tokenbridge import Bridge, Vocab, bridge_for, is_continuation
from decoding.events import DraftTranslated
from decoding.params import SpeculativeParams
from decoding.runtime.session import Session
from decoding.sampling import probs as filtered_probs
from decoding.tracer import NULL_TRACER

LOOKBEHIND = 2           # assistant tokens re-encoded before the agreed boundary
TARGET_LOOKBEHIND = 8    # committed target tokens re-encoded with a draft
MAX_ASSISTANT = 2        # greedy: at most this many assistant tokens per requested target token


def shares_tokenizer(target: Any, assistant: Any) -> bool:
    """True unless both models have tokenizers and they differ (then drafting must translate)."""
    tt, ta = target.tokenizer, assistant.tokenizer
    if tt is None or ta is None or tt is ta:
        return True
    return len(tt) == len(ta) and tt.get_vocab() == ta.get_vocab()


def restrict(q: torch.Tensor, shared: torch.Tensor) -> Optional[torch.Tensor]:
    """``q [Va]`` restricted to the ``shared`` assistant ids and renormalized; None when they hold no mass."""
    out = torch.zeros_like(q)
    out[shared] = q[shared]
    total = out.sum()
    return out / total if total > 0 else None


def _common_prefix(a: Sequence, b: Sequence) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def realign(vocab: Vocab, a_ids: list[int], a_ends: list[int], a_text: bytes,
            text: bytes) -> Optional[tuple[list[int], list[int]]]:
    """Assistant tokens spelling the committed ``text`` (after the tokenizer's own BOS), and where each ends.

    ``a_ids`` (ending at byte offsets ``a_ends`` of ``a_text``) are the tokens in the assistant's
    cache. Those inside the bytes ``a_text`` and ``text`` agree on are kept, less ``LOOKBEHIND``
    (re-encoded with what follows, so a token merging across the boundary comes out as the
    assistant's tokenizer writes it); the rest of ``text`` is encoded, starting at a character
    boundary. None when the assistant's tokens cannot spell ``text``.
    """
    n_pre = len(vocab.prefix)
    # 1. the cached tokens that spell agreed bytes, less a lookbehind, ending at a character boundary
    agreed = _common_prefix(a_text, text)
    keep = max(n_pre, bisect.bisect_right(a_ends, agreed) - LOOKBEHIND) if a_ids else 0
    while keep > n_pre and a_ends[keep - 1] < len(text) and is_continuation(text[a_ends[keep - 1]]):
        keep -= 1
    start = a_ends[keep - 1] if keep else 0
    # 2. the rest of the committed text in the assistant's tokens
    ids, ends = vocab.encode(text[start:], tail=True)
    if (ends[-1] if ends else 0) != len(text) - start:
        return None
    head, head_ends = (a_ids[:keep], a_ends[:keep]) if keep else (list(vocab.prefix), [0] * n_pre)
    return head + ids, head_ends + [start + e for e in ends]


def to_target(vocab: Vocab, text: bytes, t_ends: list[int], draft: bytes) -> tuple[list[int], list[int]]:
    """Target tokens spelling a prefix of ``draft`` after the committed ``text``, and where each ends in ``draft``.

    ``t_ends``: the byte offset where each committed target token ends in ``text``. The draft is
    encoded together with the last ``TARGET_LOOKBEHIND`` committed tokens' text; the tokens from
    the committed boundary on are the answer. A token straddling the boundary (committed "Hel",
    drafted "lo", encoded "Hello") is replaced by its drafted part encoded alone: committed tokens
    never change, and no drafted byte is dropped or spelled twice.
    """
    # 1. a window of committed target tokens, starting at a character boundary
    i = max(0, len(t_ends) - TARGET_LOOKBEHIND - 1)
    s = t_ends[i - 1] if i else 0
    while s < len(text) and is_continuation(text[s]):
        i += 1
        s = t_ends[i - 1]
    window = text[s:] + draft
    b0 = len(text) - s                        # the committed boundary inside the window
    ids, ends = vocab.encode(window)
    # 2. the first token that ends past the boundary
    p = bisect.bisect_left(ends, b0)
    if p == len(ends):                        # the window's encoding stopped before the boundary
        return vocab.encode(draft)
    head: list[int] = []
    head_ends: list[int] = []
    if ends[p] > b0 and (p > 0 or b0 > 0):
        # 3. it straddles the boundary: its drafted part, encoded alone
        head, head_ends = vocab.encode(window[b0:ends[p]])
        if (head_ends[-1] if head_ends else 0) != ends[p] - b0:
            return head, head_ends
        p += 1
    elif ends[p] == b0:
        p += 1                                # a token ends exactly at the boundary
    return head + ids[p:], head_ends + [e - b0 for e in ends[p:]]


class UniversalDrafter(Drafter):
    source = "assistant"

    def __init__(self, target: Any, assistant: Any, params: SpeculativeParams, tracer: Any = NULL_TRACER, clock: Any = None,
                 rng: Optional[torch.Generator] = None, max_len: Optional[int] = None) -> None:
        super().__init__()
        if params.tree:
            raise ValueError("tree=true: an assistant with another tokenizer drafts a chain only "
                             "(token trees need the target's tokenizer)")
        if target.is_encoder_decoder or assistant.is_encoder_decoder:
            raise ValueError("cross-tokenizer drafting needs decoder-only target and assistant models")
        self.bridge: Bridge = bridge_for(target, assistant)
        self.session = Session(assistant, "draft", tracer, clock=clock, fast=params.fast,
                               max_len=2 * max_len if max_len else None)
        self.params, self.rng, self.tracer, self.clock = params, rng, tracer, clock
        self.sampling = not params.is_greedy
        self.target_size, self.target_device = target.vocab_size, target.device
        self.begin([])

    @property
    def forwards(self) -> int:
        return self.session.forwards

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self.prompt_len = len(prompt_ids)
        self.t_ids: list[int] = []            # committed target tokens (prompt + output)
        self.t_ends: list[int] = []           # byte offset where each ends in ``text``
        self.text = bytearray()               # the committed target text, as bytes
        self.a_ids: list[int] = []            # the assistant tokens in its KV cache
        self.a_ends: list[int] = []
        self.a_text = bytearray()             # the bytes they spell (may run past ``text``: a rejected draft)

    # ------------------------------------------------------------------ keeping the assistant in step
    def _commit(self, context: Sequence[int]) -> None:
        """Extend the committed target text by the tokens ``context`` adds."""
        if list(context[:len(self.t_ids)]) != self.t_ids:      # a new context (not an extension): start over
            self.begin(context[:self.prompt_len])
        pieces = self.bridge.target.pieces
        for t in context[len(self.t_ids):]:
            self.text += (pieces[t] or b"") if 0 <= t < len(pieces) else b""
            self.t_ids.append(int(t))
            self.t_ends.append(len(self.text))

    def _sync(self) -> Optional[torch.Tensor]:
        """Bring the assistant's cache to the committed text; its next-token logits ``[Va]`` (None if it cannot)."""
        text = bytes(self.text)
        aligned = realign(self.bridge.assistant, self.a_ids, self.a_ends, self.a_text, text)
        if aligned is None or not aligned[0]:
            return None                        # the assistant cannot spell the committed text
        new_ids, self.a_ends = aligned
        # keep the cache where old and new tokens agree; feed at least one token
        same = min(_common_prefix(self.a_ids, new_ids), len(new_ids) - 1)
        self.a_ids, self.a_text = new_ids, bytearray(text)
        s = self.session
        if s.cache is None or same == 0:
            return s.prefill(new_ids)[0]
        s.crop(same)
        return s.forward(s.tensor([new_ids[same:]]), last_only=True, kind="draft")[0, -1]

    def _feed(self, token: int) -> torch.Tensor:
        """Extend the assistant's cache by one drafted token; its next-token logits ``[Va]``."""
        self.a_ids.append(token)
        self.a_text += self.bridge.assistant.pieces[token]
        self.a_ends.append(len(self.a_text))
        return self.session.forward(self.session.tensor([[token]]), last_only=True, kind="draft")[0, -1]

    # ------------------------------------------------------------------ drafting
    def _pick(self, logits: torch.Tensor) -> Optional[tuple[int, float, Optional[torch.Tensor]]]:
        """(assistant token, its q, q over target ids or None) for the next draft position; None to stop."""
        pieces = self.bridge.assistant.pieces
        if not self.sampling:
            token = int(logits.argmax())
            ok = token < len(pieces) and pieces[token]
            return (token, float(logits.softmax(-1)[token]), None) if ok else None
        q = restrict(filtered_probs(logits, self.params), self.bridge.shared.to(logits.device))     # [Va]
        if q is None:
            return None
        token = int(torch.multinomial(q, 1, generator=self.rng))
        return token, float(q[token]), self.bridge.target_q(q, self.target_size).to(self.target_device)

    def propose(self, context: Sequence[int], k: int) -> Proposal:
        self._commit(context)
        logits = self._sync()
        if logits is None:
            return Proposal.empty()
        base = len(self.a_text)
        drafted: list[int] = []
        q_a: list[float] = []
        q_rows: list[torch.Tensor] = []
        target: tuple[list[int], list[int]] = ([], [])
        cap = k if self.sampling else MAX_ASSISTANT * k
        for _ in range(cap):
            # 1. the assistant's next token; an unsure assistant stops early
            if drafted and self.params.confidence_threshold and \
                    float(logits.softmax(-1).max()) < self.params.confidence_threshold:
                break
            pick = self._pick(logits)
            if pick is None:
                break
            drafted.append(pick[0])
            q_a.append(pick[1])
            if pick[2] is not None:
                q_rows.append(pick[2])
            # 2. greedy: stop once the draft holds k target tokens and the start of another
            draft = bytes(self.a_text[base:]) + self.bridge.assistant.pieces[pick[0]]
            if not self.sampling:
                target = to_target(self.bridge.target, bytes(self.text), self.t_ends, draft)
                if len(target[0]) > k:
                    break
            if len(drafted) == cap:
                break
            # 3. feed it to the assistant for the next position
            logits = self._feed(pick[0])
        if self.sampling:      # one target token per assistant token
            ends = _ends([self.bridge.assistant.pieces[a] for a in drafted])
            target = (self.bridge.to_target[drafted].tolist() if drafted else [], ends)
        tokens, t_ends = target[0][:k], target[1][:k]
        if self.tracer.enabled and drafted:
            self._trace(drafted, q_a, tokens, t_ends, len(context))
        q = torch.stack(q_rows) if q_rows else None                                      # [n, Vt]
        return Proposal.chain(tokens, q, q_a if self.sampling else None)

    def _trace(self, drafted: list[int], q_a: list[float], tokens: list[int], t_ends: list[int],
               context_len: int) -> None:
        pieces = self.bridge.assistant.pieces
        self.tracer.emit(DraftTranslated(
            step=self.clock() if self.clock is not None else 0, position=context_len - self.prompt_len,
            assistant_tokens=tuple(drafted), assistant_ends=tuple(_ends([pieces[a] for a in drafted])),
            target_tokens=tuple(tokens), target_ends=tuple(t_ends),
            text=tuple(b"".join(pieces[a] for a in drafted)), assistant_q=tuple(round(q, 5) for q in q_a),
            intersection=self.sampling))


def _ends(pieces: list[bytes]) -> list[int]:
    """Cumulative byte ends of consecutive pieces."""
    out, n = [], 0
    for b in pieces:
        n += len(b)
        out.append(n)
    return out
