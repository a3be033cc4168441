"""The endpoint for code: ``/race`` takes a few named parameters and returns the CLI's ``--json`` document.

    from gradio_client import Client
    doc = Client(url).predict(prompt="Name three rivers.", strategies=["greedy", "prophet"], api_name="/race")

A call is the page's Run by another door: its values become the request the page would send (the same checks in
``web/validation.py``, ``web/requests.race_request``: the page's defaults for whatever is left out), and it goes through the same queue admission
(a Stop ticket, a few jobs per session), the same compute line, the same shared identical runs and recordings,
and the same per-session history (``web/handlers.follow_run``). Only the answer differs: the document
``python -m playground run --json`` writes (``web/documents.cli_document``) instead of the page's views.
"""

import contextlib
from typing import Any, Callable, Optional

import gradio as gr

from web.documents import cli_document
from web.handlers import Finished, follow_run, job
from web.app_object import PlaygroundApp
from web.requests import DEFAULT_MAX_NEW, race_request
from web.watch import user_error

async def run_race(app: PlaygroundApp, prompt: Any, strategies: Any, target: Any, assistant: Any, max_new_tokens: Any, seed: Any,
                   chat: Any, params: Any, request: Any = None, versus: Any = None, generation: Any = None) -> dict:
    """Check, queue (or join, or replay) and wait for one race; its CLI document. gr.Error on a bad value, a
    full line, a failed run, or a Stop from the same session before the run finished."""
    with job(app, request) as (_, stop):
        if stop.is_set():
            raise gr.Error("Stopped before the run started.")
        session = getattr(request, "session_hash", None)
        try:
            req = race_request(prompt, strategies, target, assistant, max_new_tokens, seed, chat, params,
                               app.histories.items(session), app.settings, versus, generation)
        except ValueError as exc:
            raise user_error(exc, page=False) from None   # an API client reads plain text
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
                   versus: Optional[str] = None, generation: Optional[dict[str, float]] = None,
                   request: gr.Request = None) -> dict[str, Any]:
        """Run decoding strategies side by side on one prompt, as the page's Run does (same checks, same line,
        identical requests computed once), and return the document `python -m playground run --json` writes:
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
                The prophet's step shape (budget, draft_tokens, tree, tree_nodes, tree_topk) is the one this
                machine's start chose from its forward-cost curve unless you set any of those five; each result's
                "params" shows what ran, "fast" included (false: eager, before the compiled forward was ready).
            versus: a second model's preset name: the same strategies run on it too, each model against its own
                greedy (every result names its "model"); default: none.
            generation: logits processors applied to every strategy, as the CLI's flags and the document's
                "generation": repetition_penalty (1 = off), no_repeat_ngram_size (0 = off), min_new_tokens (0 = off),
                forced_bos_token_id and forced_eos_token_id (-1 = off); e.g. {"repetition_penalty": 1.2}.
        """
        return await run_race(app, prompt, strategies, target, assistant, max_new_tokens, seed, chat, params,
                              request=request, versus=versus, generation=generation)
    return race
