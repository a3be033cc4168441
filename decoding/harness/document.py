"""The run document: what ``python -m playground run --json`` writes and the web app's ``/race`` returns, written here
once for both (the web app passes a ``redact`` that hides server paths). Also the two checks both front ends make
the same way: a second model raced against the target is not the target itself, and the generation settings'
fields, each with its label and what it does.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from decoding.harness.runner import environment
from decoding.processors import GenerationSettings

# the document's keys, in the order it is written
DOCUMENT_KEYS = ("environment", "prompt", "chat", "prompt_ids", "max_new_tokens", "generation", "results")

# GenerationSettings' fields: (label with its "off" value, what it does); the CLI's --flags and the page's fields
GENERATION_LABELS = {
    "repetition_penalty": ("repetition_penalty (1 = off)", "divides the logits of tokens already in the context"),
    "no_repeat_ngram_size": ("no_repeat_ngram_size (0 = off)", "forbids repeating an n-gram of this size"),
    "min_new_tokens": ("min_new_tokens (0 = off)", "no EOS before this many new tokens"),
    "forced_bos_token_id": ("forced_bos_token_id (-1 = off)", "forces the first new token"),
    "forced_eos_token_id": ("forced_eos_token_id (-1 = off)", "forces this token at the length limit"),
}


def check_versus(versus: Optional[str], target: str, what: str = "versus") -> Optional[str]:
    """``versus`` (a second model run on the same strategies), refused when it is the target itself."""
    if versus is not None and versus == target:
        raise ValueError(f"{what}: {versus!r} is the target model already; choose another model to race it against")
    return versus


def run_document(results: list, pair: Any, seed: int, prompt: str, chat: bool, prompt_ids: list[int],
                 max_new_tokens: int, generation: Optional[GenerationSettings] = None,
                 redact: Callable[[Any], Any] = lambda value: value) -> dict:
    """A finished run as one document (``DOCUMENT_KEYS``): the environment it ran in, the prompt, the settings,
    and each strategy's result (``RunResult.to_dict``). ``redact`` is applied to the environment and to each
    result's error (the web app hides server paths with it)."""
    rows = [r.to_dict() for r in results]
    for row in rows:
        row["error"] = row["error"] and redact(row["error"])
    return {"environment": redact(environment(pair, seed)), "prompt": prompt, "chat": chat,
            "prompt_ids": list(prompt_ids), "max_new_tokens": max_new_tokens,
            "generation": dataclasses.asdict(generation or GenerationSettings()), "results": rows}


def as_document(doc: dict, generation: Optional[GenerationSettings] = None) -> dict:
    """``doc`` (a run document, or a recording of one written before ``generation`` was always present) with
    exactly ``DOCUMENT_KEYS`` in their order."""
    out = {key: doc[key] for key in DOCUMENT_KEYS if key != "generation" or key in doc}
    out.setdefault("generation", dataclasses.asdict(generation or GenerationSettings()))
    return {key: out[key] for key in DOCUMENT_KEYS}
