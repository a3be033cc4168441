"""Speculative decoding: one propose -> verify -> accept loop, many drafters.

A drafter proposes up to k tokens (with its probabilities q_draft when it has
them); the target verifies them all in one forward pass; the accepted prefix
plus one correction or bonus token is committed, and both KV caches are rolled
back by cropping. The loop never asks which drafter it has.

Invariant: the target's cache holds every committed token except the newest,
which is fed first in the next verify forward together with the draft.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol, Sequence

import torch

from .events import (CorrectionToken, DraftProposed, Distribution, StepTiming, TokenCommitted,
                     TokenVerified)
from .lm import Session
from .params import SamplingParams, check_number
from .result import ModelPair, Result
from .sampling import probs as filtered_probs
from .strategies import Strategy
from .tracer import NULL_TRACER
from .verify import verify_greedy, verify_sampling

MAX_DRAFT = 32
TOP = 10  # tokens shown per position in the inspector


# --------------------------------------------------------------------------- parameters

@dataclass(frozen=True)
class SpeculativeParams(SamplingParams):
    """Assistant-model drafting. temperature 0 = greedy verification (lossless)."""
    temperature: float = 0.0
    draft_tokens: int = 4
    adaptive: bool = True           # grow after a fully accepted draft, shrink after a rejection
    confidence_threshold: float = 0.4   # stop drafting when the drafter's top probability is below this

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("draft_tokens", self.draft_tokens, 1, MAX_DRAFT, integer=True)
        if not isinstance(self.adaptive, bool):
            raise ValueError(f"adaptive must be true or false, got {self.adaptive!r}")
        check_number("confidence_threshold", self.confidence_threshold, 0.0, 1.0)


@dataclass(frozen=True)
class PromptLookupParams(SamplingParams):
    """Drafts by copying what followed the latest earlier occurrence of the last n-gram."""
    temperature: float = 0.0
    draft_tokens: int = 8
    ngram_size: int = 3

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("draft_tokens", self.draft_tokens, 1, MAX_DRAFT, integer=True)
        check_number("ngram_size", self.ngram_size, 1, 8, integer=True)


# --------------------------------------------------------------------------- drafters

@dataclass
class Draft:
    tokens: list[int]
    q: Optional[torch.Tensor] = None   # [len(tokens), V] draft distributions, None if deterministic
    q_token: list[float] = field(default_factory=list)  # q_draft of each drafted token (trace)


class Drafter(Protocol):
    source: str

    def propose(self, context: list[int], k: int) -> Draft: ...

    def feedback(self, drafted: int, accepted: int) -> None: ...

    @property
    def forwards(self) -> int: ...


class AssistantDrafter:
    """A smaller causal LM with the target's vocabulary, with its own KV cache."""

    source = "assistant"

    def __init__(self, assistant: Any, params: SpeculativeParams, tracer: Any, clock: Any,
                 rng: Optional[torch.Generator], max_len: Optional[int] = None) -> None:
        self.session = Session(assistant, "draft", tracer, clock=clock, fast=params.fast, max_len=max_len)
        self.params, self.rng = params, rng
        self.cached: list[int] = []   # the tokens whose keys/values sit in the draft cache

    @property
    def forwards(self) -> int:
        return self.session.forwards

    def _logits_for(self, context: list[int]) -> torch.Tensor:
        """Bring the draft cache up to ``context``; next-token logits ``[V]``."""
        if not self.cached:
            self.cached = list(context)
            return self.session.prefill(context)[0]
        common = 0
        limit = min(len(self.cached), len(context) - 1)   # feed at least one token
        while common < limit and self.cached[common] == context[common]:
            common += 1
        self.session.crop(common)
        new = context[common:]
        self.cached = list(context)
        return self.session.forward(self.session.tensor([new]), last_only=True, kind="draft")[0, -1]

    def propose(self, context: list[int], k: int) -> Draft:
        greedy = self.params.is_greedy
        tokens: list[int] = []
        q_rows: list[torch.Tensor] = []
        q_token: list[float] = []
        logits = self._logits_for(context)
        for _ in range(k):
            # 1. the draft distribution (filtered like the target's) and a token from it
            if greedy:
                raw = logits.softmax(-1)
                token = int(raw.argmax())
                q_token.append(float(raw[token]))
                if self.params.confidence_threshold and float(raw[token]) < self.params.confidence_threshold and tokens:
                    break
            else:
                q = filtered_probs(logits, self.params)
                token = int(torch.multinomial(q, 1, generator=self.rng))
                q_rows.append(q)
                q_token.append(float(q[token]))
                if self.params.confidence_threshold and float(logits.softmax(-1).max()) < \
                        self.params.confidence_threshold and tokens:
                    q_rows.pop()
                    q_token.pop()
                    break
            tokens.append(token)
            if len(tokens) == k:
                break
            # 2. extend the draft cache by the drafted token
            self.cached.append(token)
            logits = self.session.forward(self.session.tensor([[token]]), last_only=True, kind="draft")[0, -1]
        return Draft(tokens, torch.stack(q_rows) if q_rows else None, q_token)

    def feedback(self, drafted: int, accepted: int) -> None:
        pass  # the next propose crops the cache to the common prefix


class PromptLookupDrafter:
    """N-gram lookup in the prompt and the text generated so far (no model, no q)."""

    source = "prompt_lookup"
    forwards = 0

    def __init__(self, params: PromptLookupParams) -> None:
        self.params = params

    def propose(self, context: list[int], k: int) -> Draft:
        L = len(context)
        for n in range(min(self.params.ngram_size, L - 1), 0, -1):
            tail = context[L - n:]
            # latest earlier occurrence whose continuation is non-empty
            for start in range(L - n - 1, -1, -1):
                if context[start:start + n] == tail:
                    follow = context[start + n:start + n + k]
                    if follow:
                        return Draft(follow, None, [1.0] * len(follow))
        return Draft([])

    def feedback(self, drafted: int, accepted: int) -> None:
        pass


# --------------------------------------------------------------------------- the loop

class DraftLength:
    """Fixed, or transformers-style heuristic: +2 after a fully accepted draft, -1 after a rejection."""

    def __init__(self, start: int, adaptive: bool) -> None:
        self.k, self.adaptive = start, adaptive

    def update(self, drafted: int, accepted: int) -> None:
        if not self.adaptive or drafted == 0:
            return
        self.k = min(MAX_DRAFT, self.k + 2) if accepted == drafted else max(1, self.k - 1)


def _top(row: torch.Tensor, n: int = TOP) -> tuple[list[int], list[float]]:
    vals, idx = torch.topk(row, n)
    return idx.tolist(), [round(float(v), 5) for v in vals]


def speculative_loop(prompt_ids: Sequence[int], pair: ModelPair, params: SamplingParams, drafter: Drafter,
                     draft_tokens: int, adaptive: bool, *, max_new_tokens: int, tracer: Any = NULL_TRACER,
                     target: Optional[Session] = None, rng: Optional[torch.Generator] = None) -> Result:
    target = target or Session(pair.target, "target", tracer, fast=params.fast,
                               max_len=len(prompt_ids) + max_new_tokens + MAX_DRAFT + 1)
    eos = set(pair.target.eos_token_ids)
    greedy = params.is_greedy
    length = DraftLength(draft_tokens, adaptive)

    # a drafter that reads the target's hidden states (a prophet head) gets them
    # from the forwards the loop runs anyway, never from an extra target forward
    needs_hidden = bool(getattr(drafter, "needs_hidden", False))

    # 1. prefill: the first token comes from the target alone
    logits = target.prefill(prompt_ids, hidden=needs_hidden)[0]
    first = int(logits.argmax()) if greedy else int(torch.multinomial(filtered_probs(logits, params), 1,
                                                                      generator=rng))
    if needs_hidden:   # the last prompt position predicted the first token
        drafter.observe(target.last_hidden[0, -1:], [first])
    out = [first]
    if tracer.enabled:
        tracer.emit(TokenCommitted(step=1, position=0, token=first, source="greedy" if greedy else "sample",
                                   prob=float(logits.softmax(-1)[first])))
    drafted_total = accepted_total = steps = 0
    hist: list[int] = []
    stop = "eos" if first in eos else "max_new_tokens"
    while out[-1] not in eos and len(out) < max_new_tokens:
        t0 = time.perf_counter()
        step = target.forwards + 1
        room = max_new_tokens - len(out) - 1                 # leave room for the correction/bonus
        # 2. propose
        draft = drafter.propose(list(prompt_ids) + out, min(length.k, room)) if room > 0 else Draft([])
        t1 = time.perf_counter()
        tokens = draft.tokens
        if tracer.enabled and tokens:
            tracer.emit(DraftProposed(step=step, position=len(out), tokens=tuple(tokens),
                                      q=tuple(round(q, 5) for q in draft.q_token), source=drafter.source))
        # 3. verify all drafted tokens in one target forward: [newest committed] + draft
        base = target.length
        logits = target.forward(target.tensor([[out[-1]] + tokens]), hidden=needs_hidden,
                                kind="verify")[0]                                           # [1+d, V]
        t2 = time.perf_counter()
        if greedy:
            verdict = verify_greedy(logits, tokens)
            p = None
        else:
            p = filtered_probs(logits, params)                                            # [1+d, V]
            verdict = verify_sampling(p, draft.q, tokens, rng)
        n = verdict.n_accepted
        # 4. commit accepted + correction/bonus, stopping at EOS and max_new_tokens
        new = tokens[:n] + [verdict.next_token]
        kinds = ["accepted"] * n + ["bonus" if n == len(tokens) else "correction"]
        if tracer.enabled:
            _trace_step(tracer, step, len(out), tokens, draft, logits, p, verdict, greedy)
        for tok, kind in zip(new, kinds):
            out.append(tok)
            if tracer.enabled:
                tracer.emit(TokenCommitted(step=step, position=len(out) - 1, token=tok, source=kind))
            if tok in eos or len(out) >= max_new_tokens:
                break
        # 5. roll back: keep the cache of the newest-but-one committed token
        target.crop(base + 1 + n)
        drafter.feedback(len(tokens), n)
        if needs_hidden:   # rows 0..n predicted the newly committed tokens (accepted + correction/bonus)
            drafter.observe(target.last_hidden[0, :n + 1], new)
        length.update(len(tokens), n)
        drafted_total += len(tokens)
        accepted_total += n
        steps += 1
        hist.append(n)
        if tracer.enabled:
            t3 = time.perf_counter()
            tracer.emit(StepTiming(step=step, draft_ms=round((t1 - t0) * 1e3, 3),
                                   verify_ms=round((t2 - t1) * 1e3, 3), overhead_ms=round((t3 - t2) * 1e3, 3),
                                   drafted=len(tokens), accepted=n))
        stop = "eos" if out[-1] in eos else "max_new_tokens"
    return Result(out, target.forwards, drafter.forwards,
                  stats=_stats(target, drafter, drafted_total, accepted_total, steps, len(out), hist), stop_reason=stop)


def _trace_step(tracer: Any, step: int, pos0: int, tokens: list[int], draft: Draft, logits: torch.Tensor,
                p: Optional[torch.Tensor], verdict: Any, greedy: bool) -> None:
    p_rows = logits.softmax(-1) if p is None else p
    checked = min(verdict.n_accepted + 1, len(tokens))
    for i in range(checked):
        x = tokens[i]
        q_x = draft.q_token[i] if i < len(draft.q_token) else 1.0
        tracer.emit(TokenVerified(step=step, position=pos0 + i, token=x, accepted=i < verdict.n_accepted,
                                  p_target=round(float(p_rows[i, x]), 6), q_draft=round(q_x, 6),
                                  u=None if greedy or i >= len(verdict.us) else round(verdict.us[i], 6)))
    for i in range(verdict.n_accepted + 1):
        top_tokens, p_top = _top(p_rows[i])
        q_top = tuple(round(float(draft.q[i, t]), 5) for t in top_tokens) \
            if draft.q is not None and i < len(draft.q) else ()
        residual = ()
        if i == verdict.n_accepted and verdict.residual is not None:
            residual = tuple(round(float(verdict.residual[t]), 5) for t in top_tokens)
        tracer.emit(Distribution(step=step, position=pos0 + i, tokens=tuple(top_tokens), p_target=tuple(p_top),
                                 q_draft=q_top, residual=residual))
    kind = "bonus" if verdict.n_accepted == len(tokens) else "correction"
    tracer.emit(CorrectionToken(step=step, position=pos0 + verdict.n_accepted, token=verdict.next_token,
                                kind=kind, p_target=round(float(p_rows[verdict.n_accepted, verdict.next_token]), 6)))


def _stats(target: Session, drafter: Drafter, drafted: int, accepted: int, steps: int, n_out: int,
           hist: list[int]) -> dict:
    alpha = accepted / drafted if drafted else 0.0
    gamma = drafted / steps if steps else 0.0
    t_ms = target.ms / target.forwards if target.forwards else 0.0
    d_count, d_total = drafter.forwards, getattr(getattr(drafter, "session", drafter), "ms", 0.0)
    d_ms = d_total / d_count if d_count else 0.0
    c = d_ms / t_ms if t_ms else 0.0
    # Leviathan et al.: expected tokens per step E = (1 - a^(g+1)) / (1 - a); speedup E / (g c + 1)
    expected = (gamma + 1) if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return {"alpha": round(alpha, 4), "drafted": drafted, "accepted": accepted, "steps": steps,
            "gamma": round(gamma, 3), "mean_tokens_per_target_forward": round(n_out / target.forwards, 4),
            "cost_ratio": round(c, 4), "expected_tokens_per_step": round(expected, 4),
            "predicted_speedup": round(expected / (gamma * c + 1), 4), "accepted_lengths": hist}


# --------------------------------------------------------------------------- strategies

def check_vocabularies(target: Any, assistant: Any) -> None:
    if target.vocab_size != assistant.vocab_size:
        raise ValueError(f"target and assistant vocabularies differ ({target.vocab_size} vs "
                         f"{assistant.vocab_size} tokens); speculative decoding needs a shared tokenizer")
    tt, ta = target.tokenizer, assistant.tokenizer
    if tt is not None and ta is not None and tt is not ta and tt.get_vocab() != ta.get_vocab():
        raise ValueError("target and assistant tokenizers differ; speculative decoding needs a shared tokenizer")


def speculative(prompt_ids: Sequence[int], pair: ModelPair, params: SpeculativeParams, *, max_new_tokens: int,
                tracer: Any = NULL_TRACER, rng: Optional[torch.Generator] = None) -> Result:
    target = Session(pair.target, "target", tracer, fast=params.fast,
                     max_len=len(prompt_ids) + max_new_tokens + MAX_DRAFT + 1)
    clock = lambda: target.forwards + 1   # noqa: E731 - draft forwards belong to the next target step
    if pair.assistant is None and pair.extras.get("prophet") is not None:
        from .prophet import ProphetDrafter   # the assistant is the target's trained prophet head
        drafter: Drafter = ProphetDrafter(pair.extras["prophet"], params, tracer=tracer, clock=clock, rng=rng)
    elif pair.assistant is None:
        raise ValueError("strategy 'speculative' needs an assistant model (or the prophet head)")
    else:
        check_vocabularies(pair.target, pair.assistant)
        drafter = AssistantDrafter(pair.assistant, params, tracer, clock, rng,
                                   max_len=len(prompt_ids) + max_new_tokens + MAX_DRAFT + 1)
    return speculative_loop(prompt_ids, pair, params, drafter, params.draft_tokens, params.adaptive,
                            max_new_tokens=max_new_tokens, tracer=tracer, target=target, rng=rng)


def prompt_lookup(prompt_ids: Sequence[int], pair: ModelPair, params: PromptLookupParams, *,
                  max_new_tokens: int, tracer: Any = NULL_TRACER, rng: Optional[torch.Generator] = None) -> Result:
    return speculative_loop(prompt_ids, pair, params, PromptLookupDrafter(params), params.draft_tokens, False,
                            max_new_tokens=max_new_tokens, tracer=tracer, rng=rng)


STRATEGIES = [
    Strategy("speculative", SpeculativeParams, speculative, lossless=True, needs_assistant=True,
             label="Speculative",
             description="An assistant model drafts k tokens; the target verifies them in one forward."),
    Strategy("prompt_lookup", PromptLookupParams, prompt_lookup, lossless=True, label="Prompt lookup",
             description="Drafts by copying n-gram continuations from the prompt and the output so far."),
]
