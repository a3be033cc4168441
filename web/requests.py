"""Request types: a checked run or sweep, before any model is loaded, and the page's default request."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from decoding.harness.pays import SHAPE_PARAMS
from decoding.params import params_to_dict
from decoding.processors import GenerationSettings
from decoding.runtime.models import load_presets
from decoding.runtime.pair import PROPHET, has_prophet
from decoding.strategies import registry
from web.validation import (GENERATION_FIELDS, Checked, build_plan, check_inputs, check_model_name, field_kind,
                        generation_settings, needs_assistant, param_fields, parse_sweep_spec)
from web.crowd import request_key
from web.settings import DEFAULT_SETTINGS, Settings, cuda_available

DEFAULT_MAX_NEW = 64


@dataclasses.dataclass(frozen=True)
class RunRequest:
    """A checked run request, before any model is loaded: everything that decides its result.

    ``history`` is the visitor's earlier outputs (None: this request keeps none). A request whose suffix
    run drafts from a non-empty history is ``private``: it is never shared with, or replayed for, anyone else.
    """
    inputs: Checked
    plan: tuple                         # ((strategy name, params), ...)
    generation: GenerationSettings
    history: Optional[tuple] = None
    settings: Settings = DEFAULT_SETTINGS   # how it loads its models (not part of the key: the result is the same)

    @property
    def uses_history(self) -> bool:
        return any(name == "suffix" and params.history for name, params in self.plan)

    @property
    def private(self) -> bool:
        return bool(self.history) and self.uses_history

    @property
    def strategies(self) -> int:
        """Timed runs, the greedy reference included (each model's, in a race of two models)."""
        return (len(self.plan) + (not any(name == "greedy" for name, _ in self.plan))) * (1 + bool(self.inputs.versus))

    @property
    def units(self) -> int:
        """Work for the line's estimates: tokens of every strategy."""
        return self.strategies * self.inputs.max_new

    @property
    def key(self) -> str:
        """The same for any two requests whose runs give the same trace (up to timings)."""
        fields = {"inputs": dataclasses.asdict(self.inputs),
                  "plan": [[name, params_to_dict(params)] for name, params in self.plan],
                  "generation": dataclasses.asdict(self.generation),
                  "history": ("unused" if not self.uses_history else
                              None if self.history is None else [list(t) for t in self.history])}
        return request_key(fields)


def run_request(model: Any, assistant: Any, strategies: Any, prompt: Any, chat: Any, max_new_tokens: Any,
                seed: Any, params: Any, generation: Any, history: Optional[list] = None,
                settings: Settings = DEFAULT_SETTINGS, versus: Any = None) -> RunRequest:
    """Check a run request without loading anything (ValueError names the field). ``versus``: a second model
    that runs the same strategies (a race of two models), or None."""
    plan = build_plan(strategies, params or {}, settings.limits)
    processors = generation_settings(generation)
    inputs = check_inputs(model, assistant, prompt, chat, max_new_tokens, seed, needs_assistant(plan), plan, settings,
                          versus)
    return RunRequest(inputs, tuple(plan), processors, None if history is None else tuple(map(tuple, history)),
                      settings)


@dataclasses.dataclass(frozen=True)
class SweepRequest:
    """A checked sweep: one strategy over a grid of parameter values (``combos``), one greedy reference."""
    inputs: Checked
    strategy: str
    keys: list
    combos: list
    plan: list
    settings: Settings = DEFAULT_SETTINGS

    @property
    def units(self) -> int:
        return (len(self.plan) + 1) * self.inputs.max_new


def sweep_request(model: Any, assistant: Any, prompt: Any, chat: Any, max_new_tokens: Any, seed: Any,
                  strategy: Any, spec: Any, settings: Settings = DEFAULT_SETTINGS) -> SweepRequest:
    """Check a sweep request without loading anything (ValueError names the field)."""
    keys, combos, plan = parse_sweep_spec(strategy, spec, settings.limits)
    inputs = check_inputs(model, assistant, prompt, chat, max_new_tokens, seed, needs_assistant(plan), plan, settings)
    return SweepRequest(inputs, strategy, keys, combos, plan, settings)


def ui_default(strategy: str, field: str, settings: Optional["Settings"] = None) -> Any:
    """What the page's parameter field shows at first: the field's default (``fast`` on where CUDA is, and on a
    CPU where the default target's forward was compiled at start: ``settings.compiled``; the prophet's step shape
    the start chose on this machine's curve: ``settings.prophet_shape``)."""
    cls = registry()[strategy].params_cls
    default = next(f.default for f in dataclasses.fields(cls) if f.name == field)
    if strategy == "prophet" and settings is not None and field in dict(settings.prophet_shape):
        return dict(settings.prophet_shape)[field]
    if field == "fast" and field_kind(cls, field) is bool:
        return bool(default or cuda_available() or (settings is not None and settings.compiled))
    return default


def default_request(prompt: str, settings: Settings = DEFAULT_SETTINGS) -> RunRequest:
    """The request the page sends for ``prompt`` when nothing else was changed (what examples are recorded as)."""
    model = settings.default_target()
    plan = [name for name in settings.strategies if name in registry()]
    values = {(s, f): ui_default(s, f, settings) for s, f in param_fields() if s in plan}
    return run_request(model, PROPHET if has_prophet(model) else "none", plan, prompt, True, DEFAULT_MAX_NEW, 0,
                       values, [None] * len(GENERATION_FIELDS), history=None, settings=settings)


# --------------------------------------------------------------------------- /race's parameters
PARAMS_EXAMPLE = '{"prophet": {"tree_nodes": 8}}'


def _check_json_types(strategy: str, cls: type, given: dict) -> None:
    """A number or a boolean parameter must come as one in the JSON, never as text: ``{"tree_nodes": "8"}`` and
    ``{"fast": "yes"}`` are refused by name, as the CLI refuses ``--set fast=maybe`` (the page's fields send
    typed values; only an API client can send text)."""
    for key, value in given.items():
        kind = field_kind(cls, key)
        if kind is bool and not isinstance(value, bool) and value is not None:
            raise ValueError(f"params.{strategy}.{key} must be true or false, got {str(value)[:40]!r}")
        if kind in (int, float) and (isinstance(value, (str, bool))):
            raise ValueError(f"params.{strategy}.{key} must be a number, got {str(value)[:40]!r}")


def param_values(strategies: Any, params: Any, settings: Settings = DEFAULT_SETTINGS) -> dict[tuple[str, str], Any]:
    """``params`` (strategy -> {parameter: value}) as the page sends its parameter fields: (strategy, parameter)
    -> value for every parameter of every chosen strategy, the page's default where ``params`` gives none.

    ValueError names the parameter: ``params.beam: num_beams must be in [1, 16], got 0``."""
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ValueError(f"params must be a mapping of strategy name to {{parameter: value}}, e.g. {PARAMS_EXAMPLE}")
    reg = registry()
    listed = isinstance(strategies, list) and all(isinstance(name, str) for name in strategies)
    chosen = [name for name in dict.fromkeys(strategies) if name in reg] if listed else []
    for name, given in params.items():
        if name not in reg:
            raise ValueError(f"params: unknown strategy {str(name)[:40]!r}")
        if name not in chosen:
            raise ValueError(f"params: {name!r} is not one of the strategies asked for ({', '.join(chosen)})")
        if not isinstance(given, dict):
            raise ValueError(f"params.{name} must be a mapping of parameter name to value, e.g. {PARAMS_EXAMPLE}")
        fields = [f.name for f in dataclasses.fields(reg[name].params_cls)]
        unknown = [str(key)[:40] for key in given if key not in fields]
        if unknown:
            raise ValueError(f"params.{name}: unknown parameter {unknown[0]!r}; its parameters: "
                             f"{', '.join(fields) or 'none'}")
        _check_json_types(name, reg[name].params_cls, given)
    values: dict[tuple[str, str], Any] = {}
    for name in chosen:
        # the prophet's step shape is one unit: the start's (this machine's) unless the caller shapes the step
        # itself, so {"tree_nodes": 8} gets the 8-node tree even where the start chose a chain
        own = name == "prophet" and bool(set(params.get(name) or {}) & set(SHAPE_PARAMS))
        base = dataclasses.replace(settings, prophet_shape=()) if own else settings
        raw = {f.name: ui_default(name, f.name, base) for f in dataclasses.fields(reg[name].params_cls)}
        raw.update(params.get(name) or {})
        try:        # parsed here too, for a message that says where the value was given
            reg[name].parse({k: v for k, v in raw.items() if v is not None and v != ""})
        except ValueError as exc:
            raise ValueError(f"params.{name}: {exc}") from None
        values.update({(name, field): value for field, value in raw.items()})
    return values


GENERATION_EXAMPLE = '{"repetition_penalty": 1.2, "no_repeat_ngram_size": 3}'


def generation_values(generation: Any) -> list:
    """``/race``'s ``generation`` (setting -> value, as the run document's ``generation`` has them) as the page
    sends its generation fields, in ``GENERATION_FIELDS`` order (None: the default, off). A setting is a number
    in the JSON, never text or a boolean, as the CLI's ``--repetition-penalty 1.2`` is; ranges are checked by
    ``generation_settings``. ValueError names the setting."""
    if generation is None:
        return [None] * len(GENERATION_FIELDS)
    if not isinstance(generation, dict):
        raise ValueError(f"generation must be a mapping of setting to value, e.g. {GENERATION_EXAMPLE}")
    for key, value in generation.items():
        if key not in GENERATION_FIELDS:
            raise ValueError(f"generation: unknown setting {str(key)[:40]!r}; the settings: "
                             f"{', '.join(GENERATION_FIELDS)}")
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"generation.{key} must be a number, got {str(value)[:40]!r}")
    return [generation.get(name) for name in GENERATION_FIELDS]


def race_request(prompt: Any, strategies: Any, target: Any, assistant: Any, max_new_tokens: Any, seed: Any,
                 chat: Any, params: Any, history: Optional[list] = None,
                 settings: Settings = DEFAULT_SETTINGS, versus: Any = None, generation: Any = None) -> RunRequest:
    """A ``/race`` call as the request the page sends: the same checks (ValueError names the parameter), and for
    the same race the same request key, so a call and a page's Run share its computation and its recording.
    ``assistant`` None is the page's default: the target's prophet head when it ships one, else none."""
    if target is None:                  # the version this machine serves (chosen at start: web/startup.py)
        target = settings.default_target()
    target = check_model_name(target, "target", load_presets(), settings.allow_any_model)
    if assistant is None:
        assistant = PROPHET if has_prophet(target) else "none"
    build_plan(strategies, {})          # the strategies' own messages come before their parameters'
    values = param_values(strategies, params, settings)
    return run_request(target, assistant, strategies, prompt, chat, max_new_tokens, seed, values,
                       generation_values(generation), history, settings, versus)
