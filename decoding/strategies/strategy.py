"""A strategy's record in the registry: its name, parameters class, generate function and properties."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from decoding.params import parse_params


@dataclass(frozen=True)
class Strategy:
    name: str
    params_cls: type
    generate: Callable[..., Any]
    lossless: bool            # must produce exactly greedy's tokens
    needs_assistant: bool = False
    label: str = ""
    description: str = ""

    def parse(self, values: dict | None) -> Any:
        return parse_params(self.params_cls, values)
