"""The strategy registry: name -> parameters class, generate function, properties.

Every strategy module exposes a ``STRATEGIES`` list of ``Strategy`` records;
this module imports those listed in ``_MODULES`` and indexes them by name.
A ``generate`` function has the signature::

    generate(prompt_ids, pair, params, *, max_new_tokens, tracer, rng) -> Result
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from .params import parse_params

_MODULES = ("baselines", "speculative", "jacobi", "lookahead", "suffix")


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


def _baselines() -> list[Strategy]:
    from . import baselines as b
    from .params import BeamParams, GreedyParams, SampleParams
    return [
        Strategy("greedy", GreedyParams, b.greedy, lossless=True, label="Greedy",
                 description="One target forward per token, argmax. The reference every lossless method must match."),
        Strategy("sample", SampleParams, b.sample, lossless=False, label="Sampling",
                 description="Temperature, top-k and top-p sampling with a seeded generator."),
        Strategy("beam", BeamParams, b.beam, lossless=False, label="Beam search",
                 description="Beam search with transformers' scoring and stopping rules."),
    ]


def _load() -> dict[str, Strategy]:
    found: dict[str, Strategy] = {s.name: s for s in _baselines()}
    for module in _MODULES[1:]:
        mod = importlib.import_module(f"{__package__}.{module}")
        for strategy in getattr(mod, "STRATEGIES", []):
            found[strategy.name] = strategy
    return found


_REGISTRY: dict[str, Strategy] | None = None


def registry() -> dict[str, Strategy]:
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = _load()
    return _REGISTRY


def get_strategy(name: str) -> Strategy:
    reg = registry()
    if name not in reg:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(reg)}")
    return reg[name]
