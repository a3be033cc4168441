"""Generation settings as transformers' own logits processors, applied with each row's own context.

``GenerationSettings`` holds the knobs ``generate`` exposes (repetition penalty,
no-repeat n-gram size, min new tokens, forced BOS/EOS); ``Processors`` turns them
into a ``transformers.LogitsProcessorList`` built in ``generate``'s order, so
greedy, sampling and beam search match ``generate`` with the same settings.

Every strategy applies them to the target's logits before choosing or verifying
a token, with the context that row really continues: the decoder prefix (the
prompt, or the decoder start token of an encoder-decoder model) plus the tokens
generated so far plus, for a drafted position, the draft tokens before it. So
every lossless strategy stays token-identical to greedy under the same
processors. Drafters' own distributions are left alone: verification decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from decoding.params import check_number

MAX_NGRAM = 16


@dataclass(frozen=True)
class GenerationSettings:
    """Logits processors shared by every strategy. The defaults switch all of them off.

    ``repetition_penalty`` (CTRL's; 1 = off) divides positive and multiplies
    negative logits of tokens already in the context; ``no_repeat_ngram_size``
    (0 = off) forbids repeating an n-gram; ``min_new_tokens`` forbids EOS before
    that many new tokens; ``forced_bos_token_id``/``forced_eos_token_id`` (-1 =
    off) force the first decoder token (MBart-style models) and the token at the
    length limit.
    """
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    min_new_tokens: int = 0
    forced_bos_token_id: int = -1
    forced_eos_token_id: int = -1

    def __post_init__(self) -> None:
        check_number("repetition_penalty", self.repetition_penalty, 0.0, 10.0, lo_open=True)
        check_number("no_repeat_ngram_size", self.no_repeat_ngram_size, 0, MAX_NGRAM, integer=True)
        check_number("min_new_tokens", self.min_new_tokens, 0, 1024, integer=True)
        check_number("forced_bos_token_id", self.forced_bos_token_id, -1, None, integer=True)
        check_number("forced_eos_token_id", self.forced_eos_token_id, -1, None, integer=True)

    @property
    def active(self) -> bool:
        return self != GenerationSettings()

    def check_for(self, lm: Any) -> None:
        """Raise ``ValueError`` for settings ``lm`` cannot take (token ids past its vocabulary, no EOS)."""
        vocab = lm.vocab_size
        for name in ("forced_bos_token_id", "forced_eos_token_id"):
            value = getattr(self, name)
            if value >= vocab:
                raise ValueError(f"{name} must be -1 (off) or a token id below {vocab}, got {value}")
        if self.min_new_tokens and not lm.eos_token_ids:
            raise ValueError("min_new_tokens needs a model with an EOS token")

    def generate_kwargs(self) -> dict:
        """The same settings as ``generate`` keyword arguments (tests and benchmark anchors)."""
        out: dict[str, Any] = {}
        if self.repetition_penalty != 1.0:
            out["repetition_penalty"] = float(self.repetition_penalty)
        if self.no_repeat_ngram_size:
            out["no_repeat_ngram_size"] = int(self.no_repeat_ngram_size)
        if self.min_new_tokens:
            out["min_new_tokens"] = int(self.min_new_tokens)
        if self.forced_bos_token_id >= 0:
            out["forced_bos_token_id"] = int(self.forced_bos_token_id)
        if self.forced_eos_token_id >= 0:
            out["forced_eos_token_id"] = int(self.forced_eos_token_id)
        return out


class Processors:
    """The processors of one generation: ``prefix`` is the decoder context before the first new token."""

    def __init__(self, settings: GenerationSettings, lm: Any, prefix: Sequence[int], max_new_tokens: int) -> None:
        from transformers.generation.logits_process import (
            ForcedBOSTokenLogitsProcessor,
            ForcedEOSTokenLogitsProcessor,
            LogitsProcessorList,
            MinNewTokensLengthLogitsProcessor,
            NoRepeatNGramLogitsProcessor,
            RepetitionPenaltyLogitsProcessor,
        )
        settings.check_for(lm)
        eos = list(lm.eos_token_ids)
        self.settings = settings
        self.prefix = [int(t) for t in prefix]
        self.device = lm.device
        chain = []   # generate's order (GenerationMixin._get_logits_processor)
        if settings.repetition_penalty != 1.0:
            chain.append(RepetitionPenaltyLogitsProcessor(float(settings.repetition_penalty)))
        if settings.no_repeat_ngram_size:
            chain.append(NoRepeatNGramLogitsProcessor(int(settings.no_repeat_ngram_size)))
        if settings.min_new_tokens:
            chain.append(MinNewTokensLengthLogitsProcessor(len(self.prefix), int(settings.min_new_tokens), eos,
                                                           device=str(lm.device)))
        if settings.forced_bos_token_id >= 0:
            chain.append(ForcedBOSTokenLogitsProcessor(int(settings.forced_bos_token_id)))
        if settings.forced_eos_token_id >= 0:
            chain.append(ForcedEOSTokenLogitsProcessor(len(self.prefix) + max_new_tokens,
                                                       int(settings.forced_eos_token_id), device=str(lm.device)))
        self.chain = LogitsProcessorList(chain)

    def __call__(self, generated: Sequence[int], scores: torch.Tensor) -> torch.Tensor:
        """``scores [V]`` (logits, or log-probs for beam search) of the token after ``prefix + generated``."""
        ids = torch.tensor([self.prefix + list(generated)], dtype=torch.long, device=scores.device)
        return self.chain(ids, scores[None].float())[0]

    def rows(self, contexts: Sequence[Sequence[int]], scores: torch.Tensor) -> torch.Tensor:
        """``scores [T, V]`` where row ``t`` continues ``prefix + contexts[t]``."""
        return torch.stack([self(c, scores[t]) for t, c in enumerate(contexts)]) if len(contexts) else scores


def build(settings: GenerationSettings | None, lm: Any, prefix: Sequence[int], max_new_tokens: int
          ) -> Processors | None:
    """Processors for one generation, or None when the settings switch every processor off."""
    if settings is None or not settings.active:
        return None
    return Processors(settings, lm, prefix, max_new_tokens)
