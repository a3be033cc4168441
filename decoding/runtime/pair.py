"""The models a strategy runs on: the target, an optional assistant and the target's optional prophet
head (``ModelPair``), and ``make_pair``, which builds one from an assistant choice for the CLI and
the web service.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from decoding.runtime.head import Prophet, head_file, prophet_for
from decoding.runtime.models import LoadedModel


@dataclass
class ModelPair:
    """The target model, an optional assistant (draft) model and the target's optional prophet head."""
    target: LoadedModel
    assistant: Optional[LoadedModel] = None
    prophet: Optional["Prophet"] = None


PROPHET = "prophet"   # the assistant name that selects the target's trained prophet head


def has_prophet(target_name: str) -> bool:
    return head_file(target_name).is_file()


def make_pair(target: LoadedModel, assistant: Optional[str], load: Any) -> ModelPair:
    """The model pair for an assistant choice: ``None``, ``"prophet"`` (the shipped head) or a model name."""
    if assistant is None:
        return ModelPair(target)
    if assistant == PROPHET:
        return ModelPair(target, None, prophet=prophet_for(target))
    return ModelPair(target, load(assistant))
