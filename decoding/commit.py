"""Committing tokens: the one place every decoding loop appends, traces and stops.

Every loop (greedy, sampling, speculative, Jacobi, lookahead) commits tokens the
same way: append in order, record a ``TokenCommitted`` event for each, and stop
right after an EOS token or when ``max_new_tokens`` is reached, even in the
middle of a multi-token step. ``Output`` is that step, written once.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

from decoding.events import TokenCommitted


class Output:
    """The new tokens of one generation and its stopping rule."""

    def __init__(self, eos: Iterable[int], max_new_tokens: int, tracer: Any) -> None:
        self.eos = frozenset(int(t) for t in eos)
        self.max_new_tokens = int(max_new_tokens)
        self.tracer = tracer
        self.tokens: list[int] = []

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def last(self) -> int:
        return self.tokens[-1]

    @property
    def done(self) -> bool:
        """True once the newest token is EOS or the length limit is reached."""
        return bool(self.tokens) and (self.tokens[-1] in self.eos or len(self.tokens) >= self.max_new_tokens)

    @property
    def room(self) -> int:
        """How many more tokens may be committed."""
        return self.max_new_tokens - len(self.tokens)

    @property
    def stop_reason(self) -> str:
        return "eos" if self.tokens and self.tokens[-1] in self.eos else "max_new_tokens"

    def commit(self, tokens: Sequence[int], step: int, sources: str | Sequence[str],
               probs: Optional[Sequence[Optional[float]]] = None) -> list[int]:
        """Append ``tokens`` in order until EOS or the limit; returns the ones appended.

        ``sources`` is one source for all tokens or one per token (``events.SOURCES``);
        ``probs`` optionally gives the target probability of each token for the trace.
        """
        added: list[int] = []
        for i, tok in enumerate(tokens):
            if self.done:
                break
            tok = int(tok)
            self.tokens.append(tok)
            added.append(tok)
            if self.tracer.enabled:
                source = sources if isinstance(sources, str) else sources[i]
                prob = None if probs is None or probs[i] is None else round(float(probs[i]), 6)
                self.tracer.emit(TokenCommitted(step=step, position=len(self.tokens) - 1, token=tok,
                                                source=source, prob=prob))
        return added
