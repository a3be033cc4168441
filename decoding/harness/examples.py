"""The example prompts (``presets/prompts.yaml``, by category) and the page's default example.

The default example is the prompt a visitor sees first, the one the start races every default strategy on to
decide what the page ticks (``harness/pays``, ``web/startup``), and the one the benchmarks call "the default
example". It is an input-grounded task: a two-sentence summary of a short text, whose answer copies much of the
text. Every drafter of the default comparison has something to draft there (prompt lookup copies the text,
lookahead's n-grams recur, the prophet's head predicts the rest and its copy branch copies), so the default race
shows each strategy's drafts being accepted, on a fast curve and on a steep one. A chat question gives prompt lookup
almost nothing to copy (1.05 tokens a forward against 3.35 here, counted on the bundled model; BENCHMARKS.md, "A
default example every drafter can draft on"): the example picker keeps the chat prompts one click away.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Mapping

import yaml

PROMPTS_FILE = Path(__file__).resolve().parents[2] / "presets" / "prompts.yaml"   # decoding/harness/ -> the repository
DEFAULT_EXAMPLE = ("summarization", 1)   # (category, 0-based index) in PROMPTS_FILE: "Summarize the following in
#                                          two sentences: Bees pollinate ..."


@lru_cache(maxsize=1)
def _load() -> Mapping[str, tuple[str, ...]]:
    with open(PROMPTS_FILE, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    return {str(category): tuple(str(p) for p in prompts) for category, prompts in data.items()}


def example_prompts() -> dict[str, list[str]]:
    """Every example prompt by category, in the file's order (a fresh copy: callers may reorder it)."""
    return {category: list(prompts) for category, prompts in _load().items()}


def default_example() -> tuple[str, str]:
    """(category, text) of the page's default example."""
    category, index = DEFAULT_EXAMPLE
    return category, _load()[category][index]


def examples_default_first() -> list[str]:
    """Every example prompt once, the default example first (the order the start records them in)."""
    first = default_example()[1]
    return [first] + [p for group in _load().values() for p in group if p != first]
