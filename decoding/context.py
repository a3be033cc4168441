"""What a run knows beyond its prompt, its model pair and its parameters.

Every strategy's ``generate`` takes ``context: RunContext | None``. The caller
scopes it: the app builds one per browser session (a visitor's history never
drafts for another visitor), the CLI and the benchmark one per process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from decoding.processors import build


@dataclass
class RunContext:
    """``history``: earlier outputs a drafter may copy from (``drafting.suffix``), or None.
    ``generation``: the ``processors.GenerationSettings`` applied to the target's logits, or None."""
    history: Optional[Any] = None
    generation: Optional[Any] = None

    def processors(self, lm: Any, prompt_ids: Sequence[int], max_new_tokens: int) -> Optional[Any]:
        """The logits processors of one generation of ``lm`` on ``prompt_ids`` (None when none is active)."""
        prefix = [lm.decoder_start_token_id] if lm.is_encoder_decoder else list(prompt_ids)
        return build(self.generation, lm, prefix, max_new_tokens)


EMPTY = RunContext()


def processors(context: Optional[RunContext], lm: Any, prompt_ids: Sequence[int], max_new_tokens: int) -> Optional[Any]:
    """The logits processors of one generation under ``context`` (None: a run with no context has none active):
    what every loop calls before its first token."""
    return (context or EMPTY).processors(lm, prompt_ids, max_new_tokens)
