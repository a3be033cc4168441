"""The strategies: loops made of the shared stages (``stages.py``), and their registry.

One module per family (``baselines``: greedy, sampling, beam search; ``speculative``: the
propose -> verify -> accept loop and the strategies that draft into it; ``suffix_decoding``;
``jacobi``; ``lookahead``; ``hf_generate``: transformers' own ``generate``, the library baseline).
Each exposes a ``STRATEGIES`` list of ``base.Strategy`` records; this package indexes them by name,
in that order. A ``generate`` function has the signature::

    generate(prompt_ids, pair, params, *, max_new_tokens, tracer, rng, context) -> Result
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from decoding.strategies import baselines, hf_generate, jacobi, lookahead, speculative, suffix_decoding
from decoding.strategies.strategy import Strategy

_REGISTRY: Mapping[str, Strategy] = MappingProxyType(
    {s.name: s for module in (baselines, speculative, jacobi, lookahead, suffix_decoding, hf_generate)
     for s in module.STRATEGIES})


def registry() -> Mapping[str, Strategy]:
    """Every strategy by name (read-only), in the order the page lists them."""
    return _REGISTRY


def get_strategy(name: str) -> Strategy:
    if name not in _REGISTRY:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(_REGISTRY)}")
    return _REGISTRY[name]
