"""What a strategy returns: the new tokens and the run's statistics (plain data)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Result:
    """Token ids (new tokens only, EOS included when produced) and run statistics."""
    token_ids: list[int]
    target_forwards: int
    draft_forwards: int = 0
    stats: dict[str, Any] = field(default_factory=dict)
    stop_reason: str = "max_new_tokens"   # "eos" | "max_new_tokens"
