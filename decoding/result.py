"""What a strategy returns, and the pair of models it runs on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .models import LoadedModel


@dataclass
class ModelPair:
    """The target model and an optional assistant (draft) model."""
    target: LoadedModel
    assistant: Optional[LoadedModel] = None
    extras: dict = field(default_factory=dict)  # e.g. a prophet head


@dataclass
class Result:
    """Token ids (new tokens only, EOS included when produced) and run statistics."""
    token_ids: list[int]
    target_forwards: int
    draft_forwards: int = 0
    stats: dict[str, Any] = field(default_factory=dict)
    stop_reason: str = "max_new_tokens"   # "eos" | "max_new_tokens"
