"""The page's batch race (issue 49): the visitor's prompt and ``batch - 1`` example prompts as one batch of the
ticked strategies that batch (greedy always), against the same prompts one after another, drawn as
``visualize.batchgrid``'s grid. A panel of its own: ``batch_panel`` builds it and wires it, so the page's layout
(``app.py``) gains one line. The race is a computation in the app's line, watched as a run, a sweep or an export
is (``web/watch.watch``): it waits its turn for the cores, counts toward the line's bound (a full line is a
message), and never computes beside another visitor's run.
"""

from __future__ import annotations

import contextlib
import html
import logging
import threading
from typing import Any, Callable, Optional

import gradio as gr

from decoding.harness.batch_race import batch_prompts, progress_steps, race_batch
from decoding.harness.runner import encode_prompt
from decoding.strategies import get_strategy
from decoding.strategies.batched import BATCHABLE, MAX_BATCH, check_batch
from visualize.batchgrid import batch_race_html
from web.loading import prepare
from web.app_object import PlaygroundApp
from web.settings import DEFAULT_SETTINGS, Settings
from web.crowd import Computation
from web.watch import Settled, alone, progress_to, user_error, watch

MAX_NEW = 64            # tokens per row in a batch race (each strategy runs every row twice)
log = logging.getLogger(__name__)
HINT = ('<p class="batch-hint">Choose a batch of 2 or more and press the button: your prompt and example prompts '
        'race as one batch against the same prompts one after another.</p>')


def batch_race(model: Any, assistant: Any, strategies: Any, prompt: Any, chat: Any, max_new_tokens: Any,
               batch: Any, settings: Settings = DEFAULT_SETTINGS,
               progress: Optional[Callable[[int, int, str], None]] = None) -> str:
    """The race's HTML; raises ValueError naming the bad field (a batch of 1 included: no race to draw).
    ``progress(steps done, steps in all, what starts now)`` hears each step of the race as it starts."""
    batch = check_batch(batch)
    if batch == 1:
        raise ValueError(f"batch must be from 2 to {MAX_BATCH} for a batch race (a batch of 1 is the race above)")
    ticked = [s for s in (strategies or []) if isinstance(s, str)]
    names = ["greedy"] + [s for s in BATCHABLE if s in ticked and s != "greedy"]
    plan = [(n, {}) for n in names]
    try:
        new = min(int(max_new_tokens), MAX_NEW)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"max_new_tokens must be a whole number from 1 to {MAX_NEW} here") from None
    prepared = prepare(model, assistant, prompt, chat, new, 0, needs_assistant="speculative" in names, plan=plan,
                       settings=settings)
    texts = batch_prompts(str(prompt), batch)
    tokenizer, templated = prepared.pair.target.tokenizer, bool(chat) and prepared.pair.target.chat
    ids = [prepared.prompt_ids] + [encode_prompt(tokenizer, t, chat=templated) for t in texts[1:]]
    runs = [(n, get_strategy(n).parse({})) for n in names]
    total, done = progress_steps(runs, warmup=True), [0]

    def say(message: str) -> None:
        if progress is not None:
            progress(done[0], total, message)
        done[0] += 1
    entries = race_batch(ids, prepared.pair, runs, max_new_tokens=prepared.max_new, warmup=True, progress=say)
    return batch_race_html(entries, labels=texts)


def batch_panel(fields: dict, app: PlaygroundApp) -> None:
    """The panel: a ``batch`` control, a button and the view (shown when batch > 1). ``fields``: the page's
    model, assistant, strategies, prompt, chat and max_new_tokens components, by name."""
    with gr.Accordion("Batch race: several prompts in one batch, each row accepting its own drafts", open=False):
        with gr.Row():
            # a batch of 1 is the race above (refused by batch_race): the slider starts where a batch race does
            batch = gr.Slider(2, MAX_BATCH, value=2, step=1, label=f"batch (2–{MAX_BATCH})", elem_id="batch")
            button = gr.Button("Run the batch race", elem_id="batch-run")
        view = gr.HTML(HINT, elem_id="batch-view")      # always drawn: a press replaces the hint, never shows it

    async def run(model: Any, assistant: Any, strategies: Any, prompt: Any, chat: Any, max_new: Any, size: Any,
                  progress: gr.Progress = gr.Progress()) -> Any:
        return gr.update(**await shown(app, model, assistant, strategies, prompt, chat, max_new, size,
                                       progress=progress))

    order = ("model", "assistant", "strategies", "prompt", "chat", "max_new_tokens")
    button.click(run, [fields[k] for k in order] + [batch], view, api_name="batch_race", api_visibility="private")


async def shown(app: PlaygroundApp, *values: Any, progress: Any = None) -> dict:
    """The view's value and visibility for one press: the race computed in ``app``'s line, or, as an escaped message
    in the view, the refusal (a bad field, a model that does not load, a full line) or a failure of the race itself
    (logged with its traceback; the visitor sees its message without server paths), so a press always shows
    something. ``progress`` (the handler's ``gr.Progress``) shows the place in line, then each step of the race."""
    def frame(comp: Computation) -> None:
        done, total, message = comp.live
        progress_to(progress, done / total, f"batch race: {message}")

    try:
        work = alone("batch", lambda c: batch_race(*values, settings=app.settings,
                                                   progress=lambda *step: c.publish(step)),
                     float(check_batch(values[-1])))
        async with contextlib.aclosing(watch(app, work, threading.Event(), progress=progress, frame=frame,
                                             starting="batch race: waiting for the compute slot")) as updates:
            page = [item async for item in updates if isinstance(item, Settled)][0].result
    except gr.Error as exc:                 # watch's refusal (a full line, a bad field, a model): escaped already
        return dict(value=f"<p>{exc.message}</p>", visible=True)
    except ValueError as exc:               # the batch size, checked before anything waits
        return dict(value=f"<p>{html.escape(str(exc))}</p>", visible=True)
    except Exception as exc:                # noqa: BLE001 - the race's own failure: said in the view, not a bare toast
        log.exception("the batch race failed")
        return dict(value=f"<p>{user_error(exc, 'The batch race failed: ').message}</p>", visible=True)
    return dict(value=page, visible=True)
