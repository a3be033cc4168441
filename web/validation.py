"""The checks of a request, cheap ones first: types and sizes before model names, names before loading a model,
characters before tokens. Each raises ValueError naming the field and its allowed range; nothing is loaded here
(``web/loading.py`` loads what passed). ``limits``: the app's (``Settings.limits``)."""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from typing import Any, Optional

from decoding.harness.bench import parse_sweep, sweep_value
from decoding.harness.document import check_versus as check_versus_model
from decoding.params import check_max_new_tokens
from decoding.processors import GenerationSettings
from decoding.runtime.models import load_presets
from decoding.runtime.pair import PROPHET, has_prophet
from decoding.strategies import registry
from web.limits import DEFAULT_LIMITS, Limits
from web.settings import DEFAULT_SETTINGS, Settings

# the strategies the Sweep tab offers (the API refuses any other), with the values it suggests
SWEEP_DEFAULTS = {"lookahead": "window=3,5,8;ngram=3,4", "speculative": "draft_tokens=1,2,4,8",
                  "prophet": "draft_tokens=1,2,3,4,6", "prompt_lookup": "draft_tokens=2,4,8,16",
                  "suffix": "draft_tokens=4,8,16", "jacobi": "block_size=2,4,8,16"}


def param_fields() -> list[tuple[str, str]]:
    """(strategy, field) for every strategy parameter, in UI order."""
    return [(s.name, f.name) for s in registry().values() for f in dataclasses.fields(s.params_cls)]


def field_kind(cls: type, name: str) -> Any:
    hint = typing.get_type_hints(cls)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) is typing.Union and args else hint


_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")


def check_model_name(name: Any, what: str, presets: dict, allow_any: bool = False) -> str:
    """A preset name, or (with ``allow_any``: ``Settings.allow_any_model``) a Hub id that names nothing on
    this server."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{what}: choose a model")
    name = name.strip()
    if name in presets:
        return name
    shown = name if len(name) <= 60 else name[:57] + "..."
    if not allow_any:
        raise ValueError(f"{what}: {shown!r} is not one of the presets ({', '.join(presets)}); "
                         f"the operator can allow any Hub model with --allow-any-model")
    if not _HUB_ID.match(name) or ".." in name or "--" in name:
        raise ValueError(f"{what}: {shown!r} is not a Hugging Face Hub id (write ORG/NAME)")
    if os.path.lexists(name) or os.path.lexists(os.path.expanduser(name)):
        # a bare name like "models" would load a folder on the server instead of the Hub repository
        raise ValueError(f"{what}: {shown!r} names something on the server; local paths are not accepted "
                         f"from the web UI")
    return name


def build_plan(strategies: Any, values: dict[tuple[str, str], Any],
               limits: Limits = DEFAULT_LIMITS) -> list[tuple[str, Any]]:
    """Validate the strategy selection and parameters; returns [(name, params)]."""
    if strategies is None or strategies == [] or strategies == "":
        raise ValueError("strategies: pick at least one")
    if not isinstance(strategies, list) or not all(isinstance(n, str) for n in strategies):
        raise ValueError("strategies must be a list of strategy names")
    if len(strategies) > limits.strategies:
        raise ValueError(f"strategies: pick at most {limits.strategies}")
    reg = registry()
    plan = []
    for name in strategies:
        if name not in reg:
            raise ValueError(f"strategies: unknown strategy {name[:40]!r}")
        raw = {f: v for (s, f), v in values.items() if s == name and v is not None and v != ""}
        try:
            plan.append((name, reg[name].parse(raw)))
        except ValueError as exc:
            raise ValueError(f"{reg[name].label or name}: {exc}") from None
    return plan


def check_unicode(text: str, what: str) -> str:
    """JSON can carry lone UTF-16 surrogates, which no tokenizer or response encoder accepts."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} has an invalid character at position {exc.start} "
                         f"(a lone UTF-16 surrogate)") from None
    return text


def check_prompt(prompt: Any, limits: Limits = DEFAULT_LIMITS) -> str:
    if not isinstance(prompt, str):
        raise ValueError(f"prompt must be text, got {type(prompt).__name__}")
    if not prompt.strip():
        raise ValueError("prompt must not be empty")
    if not any(ch.isprintable() and not ch.isspace() for ch in prompt):
        raise ValueError("prompt has no visible text (only spaces and control characters)")
    if len(prompt) > limits.prompt_chars:
        raise ValueError(f"prompt is {len(prompt)} characters; the limit is {limits.prompt_chars}")
    return check_unicode(prompt, "prompt")


def check_seed(seed: Any) -> int:
    if not isinstance(seed, (int, float)) or isinstance(seed, bool) or seed != seed or not 0 <= seed < 2**31 \
            or not float(seed).is_integer():
        raise ValueError("seed must be an integer in [0, 2147483647]")
    return int(seed)


GENERATION_FIELDS = tuple(f.name for f in dataclasses.fields(GenerationSettings))


def generation_settings(values: Any) -> GenerationSettings:
    """The shared logits-processor settings from the form, in ``GENERATION_FIELDS`` order (None: the default).

    Raises ValueError naming the field: ``generation settings: repetition_penalty must be in (0, 10], got 0``.
    """
    if isinstance(values, dict):
        values = [values.get(name) for name in GENERATION_FIELDS]
    if not isinstance(values, (list, tuple)) or len(values) != len(GENERATION_FIELDS):
        raise ValueError(f"generation settings: expected {len(GENERATION_FIELDS)} values "
                         f"({', '.join(GENERATION_FIELDS)})")
    kinds = typing.get_type_hints(GenerationSettings)
    given = {}
    for name, value in zip(GENERATION_FIELDS, values):
        if value is None or value == "":
            continue
        if kinds[name] is int and isinstance(value, float) and value.is_integer():
            value = int(value)      # a number field sends 2.0 for 2
        given[name] = value
    try:
        return GenerationSettings(**given)
    except ValueError as exc:
        raise ValueError(f"generation settings: {exc}") from None


def needs_assistant(plan: list[tuple[str, Any]]) -> bool:
    reg = registry()
    return any(reg[name].needs_assistant for name, _ in plan)


@dataclasses.dataclass(frozen=True)
class Checked:
    """The cheap checks of a request passed (names, numbers, prompt text): no model loaded yet."""
    model: str
    assistant: Optional[str]      # a preset, PROPHET, or None
    prompt: str
    chat: bool
    max_new: int
    seed: int
    versus: Optional[str] = None  # a second target that runs the same strategies, each against its own greedy

    def rival(self) -> Optional["Checked"]:
        """The same request on the ``versus`` model (None without one)."""
        return dataclasses.replace(self, model=self.versus, versus=None) if self.versus else None


def check_versus(versus: Any, model: str, presets: dict, allow_any: bool = False) -> Optional[str]:
    """The second model of a race of two (None: no second model); never the target itself."""
    if versus in (None, "", "none"):
        return None
    return check_versus_model(check_model_name(versus, "versus", presets, allow_any), model)


def check_inputs(model: Any, assistant: Any, prompt: Any, chat: Any, max_new_tokens: Any, seed: Any,
                 needs_assistant: bool, plan: Optional[list] = None,
                 settings: Settings = DEFAULT_SETTINGS, versus: Any = None) -> Checked:
    """Every check that needs no model, cheap ones first; raises ValueError naming the field. With ``versus``
    the same strategies run on a second model too, so every check about the target holds for it as well."""
    presets = load_presets()
    model = check_model_name(model, "model", presets, settings.allow_any_model)
    versus = check_versus(versus, model, presets, settings.allow_any_model)
    if assistant in (None, "", "none"):
        assistant = None
    elif assistant != PROPHET:
        assistant = check_model_name(assistant, "assistant", presets, settings.allow_any_model)
    max_new = check_max_new_tokens(max_new_tokens, settings.limits.max_new_tokens)
    seed = check_seed(seed)
    prompt = check_prompt(prompt, settings.limits)
    if not isinstance(chat, bool):
        raise ValueError(f"chat must be true or false, got {str(chat)[:20]!r}")
    for target in (model, versus) if versus else (model,):
        _check_target(target, assistant, needs_assistant, plan, "" if target == model else " (the versus model)")
    return Checked(model, assistant if needs_assistant else None, prompt, chat, max_new, seed, versus)


def _check_target(model: str, assistant: Optional[str], needs_assistant: bool, plan: Optional[list],
                  which: str) -> None:
    """What the strategies need of a target (its prophet head, an assistant other than itself)."""
    if needs_assistant and assistant == PROPHET and not has_prophet(model):
        raise ValueError(f"assistant: no prophet head is shipped for {model!r}{which}; choose 'none' or an "
                         f"assistant model for the strategies that draft")
    if any(name == "hf_assisted" for name, _ in plan or ()) and assistant in (None, PROPHET, model):
        raise ValueError(f"strategies: transformers generate: assisted needs an assistant model other than the "
                         f"target{which}; pick one under Assistant (not 'none' or the prophet head, which "
                         f"transformers cannot run), or untick it")
    if any(name == "prophet" for name, _ in plan or ()) and not has_prophet(model):
        raise ValueError(f"strategies: no prophet head is shipped for {model!r}{which}; untick Prophet head "
                         f"(or train one with python -m playground.train_prophet)")


def parse_sweep_spec(strategy: Any, spec: Any,
                     limits: Limits = DEFAULT_LIMITS) -> tuple[list[str], list[tuple], list[tuple[str, Any]]]:
    """``"window=3,5;ngram=3,4"`` for ``strategy`` -> (keys, value tuples, validated plan)."""
    reg = registry()
    if not isinstance(strategy, str) or strategy not in reg:
        raise ValueError(f"sweep strategy: unknown strategy {str(strategy)[:40]!r}")
    if strategy not in SWEEP_DEFAULTS:
        raise ValueError(f"sweep strategy: {strategy!r} cannot be swept; choose one of {', '.join(SWEEP_DEFAULTS)}")
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("sweep values: write KEY=V1,V2[;KEY=V1,V2], e.g. draft_tokens=2,4,8")
    if len(spec) > limits.sweep_chars:
        raise ValueError(f"sweep values: at most {limits.sweep_chars} characters")
    check_unicode(spec, "sweep values")
    try:
        _, keys, combos = parse_sweep(f"{strategy}:{spec}", max_keys=limits.sweep_keys,
                                      max_points=limits.sweep_points)
    except ValueError as exc:
        raise ValueError(f"sweep values: {exc}") from None
    plan = []
    for combo in combos:
        try:
            plan.append((strategy, reg[strategy].parse({k: sweep_value(v) for k, v in zip(keys, combo)})))
        except ValueError as exc:
            raise ValueError(f"sweep values: {exc}") from None
    return keys, combos, plan
