"""What a run knows beyond its prompt, its model pair and its parameters.

Every strategy's ``generate`` takes ``context: RunContext | None``. The caller
scopes it: the app builds one per browser session (a visitor's history never
drafts for another visitor), the CLI and the benchmark one per process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class RunContext:
    """``history``: earlier outputs a drafter may copy from (``drafting.suffix``), or None.
    ``processors``: logits processors from the generation settings applied to the target's logits, or None."""
    history: Optional[Any] = None
    processors: Optional[Any] = None


EMPTY = RunContext()
