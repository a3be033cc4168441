"""What a strategy returns, and the models it runs on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from .models import LoadedModel

if TYPE_CHECKING:   # the head module imports torch.nn; nothing here needs it at import time
    from .prophet import Prophet


@dataclass
class ModelPair:
    """The target model, an optional assistant (draft) model and the target's optional prophet head."""
    target: LoadedModel
    assistant: Optional[LoadedModel] = None
    prophet: Optional["Prophet"] = None


@dataclass
class Result:
    """Token ids (new tokens only, EOS included when produced) and run statistics."""
    token_ids: list[int]
    target_forwards: int
    draft_forwards: int = 0
    stats: dict[str, Any] = field(default_factory=dict)
    stop_reason: str = "max_new_tokens"   # "eos" | "max_new_tokens"
