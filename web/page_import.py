"""The Trace tab: the run's trace to download, and a trace to import and replay without a model
(``/import_trace``), made and wired by name."""

from __future__ import annotations

import contextlib

import gradio as gr

from web.handlers import import_views
from web.page_names import RUN_VIEWS
from web.page_parts import NAMED, Views, help_line
from web.app_object import PlaygroundApp


def build_import(ui: Views) -> None:
    help_line("trace")
    with gr.Row():
        ui["download"] = gr.File(label="Trace (JSON download)", elem_id="trace-download")
        ui["upload"] = gr.File(label="Import a trace to replay it without a model", file_types=[".json"],
                               type="filepath", elem_id="trace-upload")


def wire_import(ui: Views, state: PlaygroundApp, admit) -> None:
    """An import is admitted like a run and shows the run's views, streamed: the first ones, then the columns."""
    async def _import(path, request: gr.Request = None):
        async with contextlib.aclosing(import_views(state, path, request=request)) as updates:
            async for item in updates:      # closed with the page's event: the import is left, its slot freed
                yield ui.pack(item)

    ui["upload"].upload(_import, ui["upload"], ui.list(RUN_VIEWS), api_name="import_trace", concurrency_id="import",
                        concurrency_limit=1, validator=admit, **NAMED)
