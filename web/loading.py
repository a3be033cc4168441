"""Model loading: a checked request's models (from the app's cache, under its memory budget) and its prompt ids."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from decoding.harness.runner import encode_prompt
from decoding.processors import GenerationSettings
from decoding.runtime.pair import PROPHET, has_prophet, make_pair
from web.validation import Checked, check_inputs
from web.limits import DEFAULT_LIMITS, Limits
from web.settings import DEFAULT_SETTINGS, Settings


@dataclasses.dataclass
class Prepared:
    """A validated request: the model pair, the prompt ids and the run limits."""
    pair: Any
    prompt_ids: list[int]
    max_new: int
    seed: int
    model: str
    note: str


def prepare(model: Any, assistant: Any, prompt: Any, chat: Any, max_new_tokens: Any, seed: Any,
            needs_assistant: bool, progress: Any = None, load: Optional[Callable[[str], Any]] = None,
            generation: Optional[GenerationSettings] = None, plan: Optional[list] = None,
            settings: Settings = DEFAULT_SETTINGS) -> Prepared:
    """The validation boundary shared by runs and sweeps; raises ValueError / ModelLoadError.

    The assistant (a model or the prophet head) is loaded only when a strategy
    of the request drafts with it. ``generation`` (already range-checked) is
    checked against the target model (token ids within its vocabulary); ``plan``
    against what the target ships (the prophet strategy needs its head).
    """
    checked = check_inputs(model, assistant, prompt, chat, max_new_tokens, seed, needs_assistant, plan, settings)
    return prepare_checked(checked, needs_assistant, progress, load or settings.load, generation, settings.limits)


def prepare_checked(checked: Checked, needs_assistant: bool, progress: Any = None,
                    load: Callable[[str], Any] = DEFAULT_SETTINGS.load,
                    generation: Optional[GenerationSettings] = None, limits: Limits = DEFAULT_LIMITS) -> Prepared:
    """Load the models of a checked request and tokenize its prompt (``limits.prompt_tokens`` checked on the
    tokens)."""
    model, assistant, prompt, chat = checked.model, checked.assistant, checked.prompt, checked.chat
    max_new, seed = checked.max_new, checked.seed
    if progress is not None:
        progress(0, desc=f"loading {model}")
    target = load(model)
    note = ""
    if not needs_assistant:
        pair = make_pair(target, None, load)
    elif assistant is None:
        pair = dataclasses.replace(make_pair(target, None, load), assistant=target)
        note = " (no assistant chosen: the target drafts for itself, a correctness demo)"
    else:
        pair = make_pair(target, assistant, load)
        note = " (speculative drafts with the target's trained prophet head)" if assistant == PROPHET else ""
    if generation is not None:
        try:
            generation.check_for(target)
        except ValueError as exc:
            raise ValueError(f"generation settings: {exc}") from None
    prompt_ids = encode_prompt(target.tokenizer, prompt, chat=chat and target.chat)
    if len(prompt_ids) > limits.prompt_tokens:
        raise ValueError(f"prompt is {len(prompt_ids)} tokens; the limit is {limits.prompt_tokens}")
    return Prepared(pair, prompt_ids, max_new, seed, model, note)


def preload_default(settings: Settings = DEFAULT_SETTINGS, load: Optional[Callable[[str], Any]] = None) -> Optional[str]:
    """Load the default target and its prophet head into the in-process caches (the app calls this in a
    background thread at start, so a visitor's first Run does not wait for the load). Returns the model
    name, or None when it could not be loaded (the first Run then reports why)."""
    name, load = settings.default_target(), load or settings.load
    try:                            # the pair prepare() builds for the default comparison (head included)
        make_pair(load(name), PROPHET if has_prophet(name) else None, load)
    except Exception:               # noqa: BLE001: a Run will load it again and name the error
        return None
    return name
