"""Which view shows what, for a run document: the app's page as pure functions. Never imports torch.

A document is what the app keeps per run (``{"results": [RunResult.to_dict()], ...}``).
Each function returns ``{view name: value}`` (HTML strings and plotly figures);
``app.py`` maps the names onto its components, so a view cannot land in another
view's slot. Views whose strategy did not run get a one-line placeholder saying
which strategy draws them.
"""

from __future__ import annotations

import dataclasses
import html
from operator import itemgetter
from typing import Any, Callable, Optional

from .beams import beam_figure, has_beams
from .charts import (figure, forward_timeline, has_prediction, leviathan_chart, source_counts, speed_chart,
                     time_breakdown)
from .iterations import has_iterations, jacobi_view
from .windows import has_steps, lookahead_figure, lookahead_step_html
from .masks import mask_figure
from .race import clock_html, race_length_ms
from .filters import has_filters, sampling_figure
from .acceptance import accepted_length_histogram, has_drafts, inspectable_positions, inspector
from .tokens import columns_html, max_step
from .trees import draft_steps, tree_figure

try:   # issue 16 / 19 views: present once their engineers' modules are
    from .drafts import has_sources, sources_html
except ImportError:   # pragma: no cover - the module ships with suffix decoding
    has_sources = sources_html = None
try:
    from .crosstok import crosstok_view
except ImportError:   # pragma: no cover - the module ships with cross-tokenizer drafting
    crosstok_view = None

MAX_JACOBI_ROWS = 1024   # Jacobi iterations drawn over all panels (a real run has at most about max_new_tokens)
MAX_JACOBI_PANELS = 4    # Jacobi results drawn side by side (a race of two models has two)
PANELS_CSS = ("<style>.dp-jc-panels{display:flex;gap:12px;align-items:flex-start}.dp-jc-panel{flex:1 1 0;"
              "min-width:0}.dp-jc-panel>h4{margin:2px 0 4px;font-size:.95em}</style>")


def placeholder(text: str, height: int = 220) -> Any:
    """An empty figure whose title says what to run to fill it."""
    return figure([], {"title": {"text": text}, "height": height, "template": "plotly_white",
                       "xaxis": {"visible": False}, "yaxis": {"visible": False}})


def _note(text: str) -> str:
    return f"<div class='dp-muted'>{text}</div>"


@dataclasses.dataclass(frozen=True)
class Survey:
    """What the page needs to know of a document before drawing it, in one pass over each result's events:
    the last replay step, and per result the event types it holds (None: events that are not all tagged
    objects; then every view looks for itself). A view whose events a result lacks skips it without a scan."""
    top: int
    kinds: tuple[Optional[frozenset], ...]

    def may(self, i: int, *types: str) -> bool:
        kinds = self.kinds[i] if i < len(self.kinds) else None
        return kinds is None or any(t in kinds for t in types)


_TYPE = itemgetter("type")


def _kinds(result: dict) -> Optional[frozenset]:
    try:
        return frozenset(map(_TYPE, result.get("events") or ()))
    except (KeyError, TypeError):    # not an object, no type, an unhashable type: the views look themselves
        return None


def survey(doc: Optional[dict]) -> Survey:
    results = (doc or {}).get("results") or []
    return Survey(max((max_step(r) for r in results), default=0), tuple(_kinds(r) for r in results))


def _every(doc: Optional[dict], test: Callable[[dict], bool], *types: str, seen: Optional[Survey] = None,
           limit: int) -> list[dict]:
    """The first ``limit`` results that pass ``test``; with ``types`` (the events ``test`` looks for), results
    holding none of them are skipped unread."""
    results = (doc or {}).get("results", [])
    seen = seen if seen is not None or not types else survey(doc)
    found: list[dict] = []
    for i, r in enumerate(results):
        if len(found) == limit:
            break
        if (not types or seen.may(i, *types)) and test(r):
            found.append(r)
    return found


def _first(doc: Optional[dict], test: Callable[[dict], bool], *types: str,
           seen: Optional[Survey] = None) -> Optional[dict]:
    """The first result that passes ``test``; with ``types`` (the events ``test`` looks for), results holding
    none of them are skipped unread."""
    found = _every(doc, test, *types, seen=seen, limit=1)
    return found[0] if found else None


def top_step(doc: Optional[dict], seen: Optional[Survey] = None) -> int:
    if seen is not None:
        return seen.top
    return max((max_step(r) for r in (doc or {}).get("results", [])), default=0)


def _drafts(r: dict, i: int, seen: Survey) -> bool:
    return (seen.may(i, "StepTiming") or bool((r.get("stats") or {}).get("accepted_lengths"))) and has_drafts(r)


def lane(result: dict) -> str:
    """A result's name in the inspector's picker: its strategy, and its model in a race of two models."""
    return f"{result['strategy']} · {result['model']}" if result.get("model") else str(result["strategy"])


def drafted(doc: Optional[dict], seen: Optional[Survey] = None) -> list[str]:
    """Results with drafts to inspect (p/q inspector, draft tree), in column order, by :func:`lane`."""
    seen = seen or survey(doc)
    return [lane(r) for i, r in enumerate((doc or {}).get("results", []))
            if _drafts(r, i, seen) or (seen.may(i, "Distribution") and inspectable_positions(r))
            or (seen.may(i, "DraftTree", "DraftProposed") and draft_steps(r))]


def chart_views(doc: dict, seen: Optional[Survey] = None) -> dict[str, Any]:
    """The figures drawn once per run: speed, sources, timeline, breakdown, prediction, histogram, lookahead."""
    seen = seen or survey(doc)
    results = doc.get("results") or []
    drafts = [r for i, r in enumerate(results) if _drafts(r, i, seen)]
    la = _first(doc, has_steps, "LookaheadStep", seen=seen)
    return {
        "speed": speed_chart(results), "sources": source_counts(results), "timeline": forward_timeline(results),
        "breakdown": time_breakdown(results),
        "leviathan": leviathan_chart(results) if any(has_prediction(r) for r in results) else
        placeholder("Run a drafting strategy (Prophet head, Speculative, Prompt lookup, Suffix) for the prediction"),
        "histogram": accepted_length_histogram(drafts) if drafts else
        placeholder("Run a drafting strategy to see how many drafted tokens were accepted"),
        "lookahead_chart": lookahead_figure(la) if la else placeholder("Tick Lookahead and run to see its steps"),
    }


def step_html(doc: Optional[dict], step: Optional[int], seen: Optional[Survey] = None,
              columns: bool = True) -> dict[str, str]:
    """The HTML views at one replay step: the columns, the lookahead window, Jacobi, copied drafts, cross-tokenizer
    (``columns=False``: all but the columns, the costliest; ``column_views`` draws them)."""
    results = (doc or {}).get("results") or []
    seen = seen or survey(doc)
    top = seen.top
    la = _first(doc, has_steps, "LookaheadStep", seen=seen)
    jc = _every(doc, has_iterations, "JacobiIteration", seen=seen, limit=MAX_JACOBI_PANELS)
    views = {"columns": columns_html(results, step)} if columns else {}
    views.update({"lookahead_window": lookahead_step_html(la, step) if la else
                  _note("Tick Lookahead and run to see its 2D window and the n-grams it verified."),
                  "jacobi": jacobi_panels(jc, step, top) if jc else
                  _note("Tick Jacobi and run to see its iterations, one row per target forward.")})
    if sources_html is not None:
        copied = _first(doc, has_sources, "DraftSource", seen=seen)
        views["drafts"] = sources_html(copied, step) if copied else _note(
            "Suffix decoding and prompt lookup record where each draft was copied from; run one to see it.")
    if crosstok_view is not None:   # no result with cross-tokenizer drafts: its note, without a scan
        views["crosstok"] = crosstok_view(doc if any(seen.may(i, "DraftTranslated") for i in range(len(results)))
                                          else None, step)
    return views


def column_views(doc: Optional[dict], step: Optional[int]) -> dict[str, str]:
    """The token columns at one replay step: the rest of :func:`step_html`."""
    return {"columns": columns_html((doc or {}).get("results") or [], step)}


def jacobi_panels(results: list[dict], step: Optional[int], top: int) -> str:
    """The Jacobi view of each result (at most ``MAX_JACOBI_PANELS``), side by side under its label when there
    are several (a race of two models: the same prompt's iterations on each), ``MAX_JACOBI_ROWS`` in all."""
    results = results[:MAX_JACOBI_PANELS]
    rows = MAX_JACOBI_ROWS // max(len(results), 1)
    if len(results) == 1:
        return _jacobi(results[0], step, top, rows)
    panels = "".join(f"<div class='dp-jc-panel'><h4>{html.escape(str(r.get('label') or r.get('strategy', '?')))}"
                     f"</h4>{_jacobi(r, step, top, rows)}</div>" for r in results)
    return f"{PANELS_CSS}<div class='dp-jc-panels'>{panels}</div>"


def _jacobi(result: dict, step: Optional[int], top: int, limit: int = MAX_JACOBI_ROWS) -> str:
    """The Jacobi view of the first ``limit`` iterations (a note says when there are more)."""
    kept, seen = [], 0
    for e in result["events"]:
        if e.get("type") == "JacobiIteration":
            seen += 1
            if seen > limit:
                continue
        kept.append(e)
    view = jacobi_view(dict(result, events=kept), None if step is None or step >= top else step)
    if seen > limit:
        view = _note(f"The first {limit} of {seen} Jacobi iterations are drawn.") + view
    return view


def step_figures(doc: Optional[dict], step: Optional[int], strategy: Any = None,
                 seen: Optional[Survey] = None) -> dict[str, Any]:
    """The figures at one replay step: the draft tree (of ``strategy``), the lookahead mask, beams, sampling."""
    seen = seen or survey(doc)
    names = drafted(doc, seen)
    chosen = strategy if strategy in names else (names[0] if names else None)
    tree_of = _first(doc, lambda r: lane(r) == chosen) if chosen else None
    la = _first(doc, has_steps, "LookaheadStep", seen=seen)
    bm, sm = _first(doc, has_beams, "BeamStep", seen=seen), _first(doc, has_filters, "SamplingFilter", seen=seen)
    return {
        "tree": tree_figure(tree_of, step) if tree_of else
        placeholder("Run a drafting strategy (Prophet head draws a token tree) to see its drafts"),
        "lookahead_mask": mask_figure(la, step) if la else placeholder("Tick Lookahead and run to see its mask"),
        "beam": beam_figure(bm, step) if bm else placeholder("Tick Beam search and run to see its beams"),
        "sampling": sampling_figure(sm, step=step) if sm else
        placeholder("Tick Sampling (temperature > 0) and run to see one position's distribution"),
    }


def inspector_view(doc: Optional[dict], strategy: Any, position: Any) -> Optional[Any]:
    """p_target vs q_draft at the verified position nearest ``position`` of ``strategy`` (a :func:`lane`)."""
    result = _first(doc, lambda r: lane(r) == strategy)
    positions = inspectable_positions(result) if result else []
    if not positions:
        return placeholder("No verified position recorded for this strategy") if result else None
    ok = isinstance(position, (int, float)) and not isinstance(position, bool) and position == position \
        and abs(position) < 1e12
    pos = int(position) if ok else 0
    if pos not in positions:   # snap to the nearest verified position
        pos = min(positions, key=lambda p: abs(p - pos))
    return inspector(result, pos)


def race_views(doc: Optional[dict], at_ms: float, speed: Optional[float]) -> dict[str, str]:
    """The wall-clock replay at ``at_ms``: the columns and the clock readout."""
    results = (doc or {}).get("results") or []
    total = race_length_ms(results)
    return {"columns": columns_html(results, at_ms=min(max(at_ms, 0.0), total)),
            "clock": clock_html(at_ms, total, speed, results)}
