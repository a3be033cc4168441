"""The endpoint for code: ``/race`` takes a few named parameters and returns the CLI's ``--json`` document.

    from gradio_client import Client
    doc = Client(url).predict(prompt="Name three rivers.", strategies=["greedy", "prophet"], api_name="/race")

A call is the page's Run by another door: its values become the request the page would send (the same checks in
``web/service.py``, the page's defaults for whatever is left out), and it goes through the same queue admission
(a Stop ticket, a few jobs per session), the same compute line, the same shared identical runs and recordings,
and the same per-session history (``web/handlers.follow_run``). Only the answer differs: the document
``python -m decoding run --json`` writes (``web/service.cli_document``) instead of the page's views.
"""

import contextlib
import dataclasses
from typing import Any, Callable, Optional

import gradio as gr

from decoding.runtime.models import load_presets
from decoding.runtime.pair import PROPHET, has_prophet
from decoding.strategies import registry
from web.playground import PlaygroundApp
from web.handlers import Finished, follow_run, job, user_error
from web.service import (DEFAULT_MAX_NEW, DEFAULT_SETTINGS, GENERATION_FIELDS, RunRequest, Settings, build_plan,
                         check_model_name, cli_document, field_kind, run_request, ui_default)

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
        raw = {f.name: ui_default(name, f.name, settings) for f in dataclasses.fields(reg[name].params_cls)}
        raw.update(params.get(name) or {})
        try:        # parsed here too, for a message that says where the value was given
            reg[name].parse({k: v for k, v in raw.items() if v is not None and v != ""})
        except ValueError as exc:
            raise ValueError(f"params.{name}: {exc}") from None
        values.update({(name, field): value for field, value in raw.items()})
    return values


def race_request(prompt: Any, strategies: Any, target: Any, assistant: Any, max_new_tokens: Any, seed: Any,
                 chat: Any, params: Any, history: Optional[list] = None,
                 settings: Settings = DEFAULT_SETTINGS, versus: Any = None) -> RunRequest:
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
                       [None] * len(GENERATION_FIELDS), history, settings, versus)


async def run_race(app: PlaygroundApp, prompt: Any, strategies: Any, target: Any, assistant: Any, max_new_tokens: Any, seed: Any,
                   chat: Any, params: Any, request: Any = None, versus: Any = None) -> dict:
    """Check, queue (or join, or replay) and wait for one race; its CLI document. gr.Error on a bad value, a
    full line, a failed run, or a Stop from the same session before the run finished."""
    with job(app, request) as (_, stop):
        if stop.is_set():
            raise gr.Error("Stopped before the run started.")
        session = getattr(request, "session_hash", None)
        try:
            req = race_request(prompt, strategies, target, assistant, max_new_tokens, seed, chat, params,
                               app.histories.items(session), app.settings, versus)
        except ValueError as exc:
            raise user_error(exc) from None
        status = "Stopped."
        async with contextlib.aclosing(follow_run(app, req, stop, None, session, frames=False)) as updates:
            async for item in updates:
                if isinstance(item, Finished):
                    return cli_document(item.doc, req.generation)
                status = item.get("status") or status
        raise gr.Error(status)


def race_endpoint(app: PlaygroundApp) -> Callable:
    """The ``/race`` function of ``app``: its signature is the endpoint's (``gr.api`` reads the
    annotations themselves, the return type's unevaluated, so this module has no ``from __future__ import
    annotations``)."""
    async def race(prompt: str, strategies: list[str], target: Optional[str] = None,
                   assistant: Optional[str] = None, max_new_tokens: int = DEFAULT_MAX_NEW, seed: int = 0,
                   chat: bool = True, params: Optional[dict[str, dict[str, Any]]] = None,
                   versus: Optional[str] = None, request: gr.Request = None) -> dict[str, Any]:
        """Run decoding strategies side by side on one prompt, as the page's Run does (same checks, same line,
        identical requests computed once), and return the document `python -m decoding run --json` writes:
        environment, prompt_ids, generation settings and, per strategy, token_ids, text, timings and stats.

        Args:
            prompt: the prompt text.
            strategies: strategy names, e.g. ["greedy", "prophet", "prompt_lookup"] (greedy is added as the reference).
            target: the target model's preset name; default: the version of the default model this machine
                serves (measured at start).
            assistant: a preset, "prophet" (the target's trained head) or "none"; default: the head if it has one.
            max_new_tokens: tokens each strategy generates (1 to 512).
            seed: the sampling seed (0 to 2147483647).
            chat: wrap the prompt in the model's chat template.
            params: parameters by strategy, e.g. {"prophet": {"tree_nodes": 8}}; the page's defaults for the rest.
            versus: a second model's preset name: the same strategies run on it too, each model against its own
                greedy (every result names its "model"); default: none.
        """
        return await run_race(app, prompt, strategies, target, assistant, max_new_tokens, seed, chat, params,
                              request=request, versus=versus)
    return race
