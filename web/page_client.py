"""The page's run from code, by name: scripts, tests and benchmarks call ``/run`` (the page's own event, off the API
page, 86+ positional inputs) through :func:`page_run` / :func:`page_submit` with keyword arguments, and read what came
back as :class:`PageViews` fields, never by index. The positions come from web/page_names.py, the same names app.py
wires the page by, so moving an input or a view moves it here too. For code that is not the page, ``/race``
(web/api.py) is the documented endpoint."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional

from web.page_names import api_views, generation_input, param_input, run_inputs
from web.requests import ui_default
from web.validation import GENERATION_FIELDS, param_fields


@dataclasses.dataclass(frozen=True)
class PageViews:
    """What a run (or a trace import) shows, as an API client gets it: one field per view of ``api_views()``."""
    step: Any
    columns: Any
    speed: Any
    timeline: Any
    sources: Any
    download: Optional[str]          # the trace's JSON file (a local path once the client downloaded it)
    status: str
    histogram: Any
    inspect_strategy: Any
    jacobi: Any
    lookahead_window: Any
    lookahead_chart: Any
    breakdown: Any
    leviathan: Any
    clock: Any
    clock_readout: Any
    tree: Any
    lookahead_mask: Any
    beam: Any
    sampling: Any
    drafts: Any
    crosstok: Any
    inspector: Any
    share: Any
    race_id: Any

    @classmethod
    def of(cls, out: Any) -> "PageViews":
        """``out``: /run's or /import_trace's outputs as the client returned them (a tuple, in api_views() order)."""
        names = api_views()
        if not isinstance(out, (list, tuple)) or len(out) != len(names):
            got = len(out) if isinstance(out, (list, tuple)) else type(out).__name__
            raise ValueError(f"expected the page's {len(names)} views ({', '.join(names[:4])}, ...), got {got}")
        return cls(**dict(zip(names, out)))

    @property
    def columns_html(self) -> str:
        """The race's columns as HTML (Gradio sends an HTML update as a dict with a ``value``)."""
        return self.columns if isinstance(self.columns, str) else (self.columns or {}).get("value", "")

    def document(self) -> dict:
        """The run's trace document (the download), read from the client's copy."""
        with open(self.download, encoding="utf-8") as fh:
            return json.load(fh)


if tuple(f.name for f in dataclasses.fields(PageViews)) != api_views():     # one list of views, checked at import
    raise RuntimeError("PageViews must have one field per web.page_names.api_views(), in that order")


def run_values(*, model: str, prompt: str, strategies: Any, assistant: str = "none", chat: Any = True,
               max_new_tokens: Any = 12, seed: Any = 0, versus: Any = None, params: Optional[dict] = None,
               generation: Optional[dict] = None, page_defaults: bool = False) -> list:
    """/run's positional values, built by name. ``params``: {(strategy, field): value}; ``generation``: {field:
    value}; a parameter not given is None (the validator's default), or what the page's field shows at first when
    ``page_defaults`` (what a visitor who touched nothing sends). An unknown parameter is refused by name."""
    known = set(param_fields())
    unknown = [k for k in (params or {}) if k not in known] + \
              [k for k in (generation or {}) if k not in GENERATION_FIELDS]
    if unknown:
        raise ValueError(f"not an input of the page's run: {unknown}")
    named = {"model": model, "assistant": assistant, "strategies": strategies, "prompt": prompt, "chat": chat,
             "max_new_tokens": max_new_tokens, "seed": seed, "versus": versus}
    for s, f in param_fields():
        named[param_input(s, f)] = (params or {}).get((s, f), ui_default(s, f) if page_defaults else None)
    for name in GENERATION_FIELDS:
        named[generation_input(name)] = (generation or {}).get(name)
    return [named[name] for name in run_inputs()]


def page_run(client: Any, **request: Any) -> PageViews:
    """Run on the page's ``/run`` through a gradio_client ``Client`` and wait: its views by name (``run_values``'s
    keyword arguments). A refusal raises as the client raises it."""
    return PageViews.of(client.predict(*run_values(**request), api_name="/run"))


class PageJob:
    """A submitted run: ``result``/``outputs`` give :class:`PageViews`; anything else (``status``, ``done``,
    ``cancel``) is the client's job's."""

    def __init__(self, job: Any):
        self.job = job

    def result(self, timeout: Optional[float] = None) -> PageViews:
        return PageViews.of(self.job.result(timeout=timeout))

    def outputs(self) -> list[PageViews]:
        """Every streamed update so far, oldest first."""
        return [PageViews.of(out) for out in self.job.outputs()]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.job, name)


def page_submit(client: Any, **request: Any) -> PageJob:
    """``page_run`` without waiting."""
    return PageJob(client.submit(*run_values(**request), api_name="/run"))
