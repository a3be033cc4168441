"""The Jacobi view, after the paper's DDGviz: one row per iteration, one column per output position.

Every cell holds the token an iteration guessed at that absolute output
position, coloured by what it is:

* ``committed``: decided for good by this iteration;
* ``verified``: provably greedy's (the guesses before it in the block were right);
* ``early``: already equal to the final output token although the tokens it
  depends on are not verified yet: the model got it right out of order, which
  is what parallel decoding exploits;
* ``wrong``: differs from the final token (and will change);
* ``past``: after the output ended (the paper's fixed-length ``jacobi`` and
  ``gs_jacobi`` decode past EOS); decoded, never output.

Rows are labelled per variant: ``block b · iteration k`` for blocks in
sequence, ``iteration k`` for the one whole-output block of ``jacobi``, and
``iteration i · window s–e`` for the sliding window. ``jacobi_view`` draws
HTML (scrolls; with ``step`` it focuses on that replay step's window);
``jacobi_heatmap`` draws the same cells as a plotly figure. Never imports torch.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, Optional

import plotly.graph_objects as go

from .convergence import MARKS, figures_line, first_wrong, mark
from .legacy import committed_counts
from .tokens import number, plot_text

STATES = {   # state: (legend text, colour)
    "committed": ("committed by this iteration", "#2e9d58"),
    "verified": ("verified: its prefix was right", "#bfe5cc"),
    "early": ("already the final token, prefix not yet verified", "#ffd966"),
    "wrong": ("not the final token yet", "#f4cccc"),
    "past": ("after the output ended: decoded, not output", "#dddddd"),
}
CODES = {state: i for i, state in enumerate(STATES)}
WINDOW = 48          # columns in a focused view
FOCUS_ROWS = 24      # rows in a focused view
STEP_POSITIONS = 32  # columns of the heatmap at a replay step (cell text stays legible)
MAX_CELLS = 24_000   # above this, the full view focuses too (a 512-token whole-output jacobi run)
MAX_COLUMNS = 2048   # ... and above this many output positions (an iteration may claim to start at 10**6)
MAX_ROWS = 1024      # ... and above this many iterations (a real run has at most about max_new_tokens)


def has_iterations(result: dict) -> bool:
    return any(isinstance(e, dict) and e.get("type") == "JacobiIteration" for e in result.get("events", ()))


@dataclass(frozen=True)
class Row:
    """One Jacobi iteration as drawn."""
    step: int
    label: str
    start: int
    tokens: tuple
    probs: tuple
    converged: int
    committed: int
    block: int = 0
    prev: Optional["Row"] = field(default=None, compare=False, repr=False)   # the block's previous iteration

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    def state(self, i: int, final: list) -> str:
        pos = self.start + i
        if pos >= len(final):
            return "past"
        if i < self.committed:
            return "committed"
        if i < self.converged:
            return "verified"
        return "early" if self.tokens[i] == final[pos] else "wrong"


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _label(variant: str, e: dict, index: int, blocks: int, start: int, end: int) -> str:
    if variant == "sliding":
        return f"iteration {index} · window {start}–{end - 1}"
    if variant == "jacobi" and blocks == 1:
        return f"iteration {_int(e.get('iteration'))}"
    return f"block {_int(e.get('block'))} · iteration {_int(e.get('iteration'))}"


def rows(result: dict) -> list[Row]:
    """The result's Jacobi iterations, labelled for its variant."""
    events = [e for e in result.get("events", ()) if isinstance(e, dict)]
    params = result.get("params") if isinstance(result.get("params"), dict) else {}
    variant = str(params.get("variant", ""))
    its = [(i, e) for i, e in enumerate(events) if e.get("type") == "JacobiIteration"]
    # for events without ``committed`` (before version 2) only: it counts the step's commits
    legacy = committed_counts(events) if any(_int(e.get("committed"), -1) < 0 for _, e in its) else {}
    blocks = len({_int(e.get("block")) for _, e in its})
    out: list[Row] = []
    latest: dict[int, Row] = {}
    for index, (i, e) in enumerate(its, 1):
        tokens = tuple(e.get("guess") or ())
        start, block = _int(e.get("start")), _int(e.get("block"))
        committed = _int(e.get("committed"), -1)
        out.append(Row(step=_int(e.get("step")), label=_label(variant, e, index, blocks, start, start + len(tokens)),
                       start=start, tokens=tokens, probs=tuple(e.get("probs") or ()),
                       converged=_int(e.get("converged")), committed=committed if committed >= 0 else legacy[i],
                       block=block, prev=latest.get(block)))
        latest[block] = out[-1]
    return out


def _text(result: dict, token: Any) -> str:
    vocab = result.get("vocab") if isinstance(result.get("vocab"), dict) else {}
    text = vocab.get(str(token))
    if text is None and isinstance(token, int):      # an in-process result keys its vocab by int
        text = vocab.get(token)
    return str(text) if text is not None else f"#{token}"


def _visible(text: str, limit: int = 10) -> str:
    """Whitespace made visible, cut to ``limit`` characters (not yet escaped)."""
    text = text.replace(" ", "·").replace("\n", "↵").replace("\t", "⇥") or "∅"
    return text if len(text) <= limit else text[:limit - 1] + "…"


@dataclass(frozen=True)
class Frame:
    """What one view draws: rows, the column range [lo, hi), the current row and a note."""
    rows: list
    lo: int
    hi: int
    current: Optional[Row]
    note: str


def frame(result: dict, step: Optional[int] = None, window: int = WINDOW, focus: bool = False,
          max_rows: int = FOCUS_ROWS, allrows: Optional[list] = None) -> Frame:
    """Rows and columns to draw: everything, or ``window`` columns around the iteration at ``step``.

    Without ``step`` the whole run is drawn, unless ``focus`` or it exceeds
    ``MAX_CELLS`` cells, ``MAX_COLUMNS`` positions or ``MAX_ROWS`` iterations: then the
    first ``window`` positions and their first ``max_rows`` iterations. With ``step``,
    the latest ``max_rows`` iterations up to that step.
    """
    allrows = rows(result) if allrows is None else allrows
    final = result.get("token_ids") or ()
    n = max([len(final)] + [r.end for r in allrows])
    shown = allrows if step is None else [r for r in allrows if r.step <= step]
    current = shown[-1] if shown and step is not None else None
    small = n <= MAX_COLUMNS and len(shown) <= MAX_ROWS and sum(len(r.tokens) for r in shown) <= MAX_CELLS
    if current is None and small and not focus:
        return Frame(shown, 0, n, None, "")
    # the current iteration's window near the right edge, the history that led to it on the left
    lo = 0 if current is None else max(0, min(current.start - 2, current.end + 2 - window, n - window))
    hi = min(n, lo + window)
    near = [r for r in shown if r.start < hi and r.end > lo]
    near = near[-max_rows:] if current is not None else near[:max_rows]
    note = (f"positions {lo}–{hi - 1} of {n}, " + (f"the latest {len(near)} iterations there" if current
                                                   else f"the first {len(near)} iterations there; "
                                                   "move the replay step to look elsewhere"))
    return Frame(near, lo, hi, current, note)


CSS = (".dp-jc-scroll{max-height:560px;overflow:auto;border:1px solid #ddd}"
       ".dp-jc-table{border-collapse:separate;border-spacing:1px;font:12px/1.2 monospace}"
       ".dp-jc-table th{position:sticky;top:0;background:#fff;z-index:1;font-weight:normal;color:#555}"
       ".dp-jc-table th.dp-jc-label{left:0;z-index:2;text-align:right;white-space:nowrap;padding-right:6px}"
       ".dp-jc-table tbody th.dp-jc-label{position:sticky}"
       ".dp-jc-table td{padding:2px 3px;white-space:nowrap;min-width:2.2em;text-align:center}"
       ".dp-jc-current th.dp-jc-label{font-weight:bold;color:#000}"
       ".dp-jc-current td[data-state]{outline:2px solid #333}"
       ".dp-jc-final{display:block;color:#000}"
       ".dp-jc-help{margin:4px 0;color:#444}.dp-jc-chip{padding:1px 6px;margin-right:6px}"
       + "".join(f".dp-jacobi [data-state={s}]{{background:{c}}}" for s, (_, c) in STATES.items())
       + ".dp-jacobi [data-state=committed]{color:#fff}"
       ".dp-jacobi [data-state=early]{box-shadow:inset 0 0 0 2px #bf9000}"
       + "".join(f".dp-jacobi [data-mark={m}]{{{css}}}" for m, (_, css) in MARKS.items()))


def _cell(result: dict, row: Row, i: int, final: list, wrong_before: Optional[int]) -> str:
    state = row.state(i, final)
    token = row.tokens[i]
    text = _text(result, token)
    prob = number(row.probs[i], None) if i < len(row.probs) else None
    kind = mark(row, row.start + i, final, wrong_before)
    title = (f"#{row.start + i} id {token}" + (f" p={prob:.2f}" if prob is not None else "")
             + (f"; {MARKS[kind][0]}" if kind else ""))
    marked = f" data-mark='{kind}'" if kind else ""
    return (f"<td data-state='{state}' data-pos='{row.start + i}'{marked} title='{html.escape(title, quote=True)}'>"
            f"{html.escape(_visible(text))}</td>")


def _row_html(result: dict, row: Row, fr: Frame, final: list) -> str:
    first, last = max(row.start, fr.lo), min(row.end, fr.hi)
    cls = "dp-jc-row dp-jc-current" if row is fr.current else "dp-jc-row"
    parts = [f"<tr class='{cls}' data-step='{row.step}'><th class='dp-jc-label'>{html.escape(row.label)}</th>"]
    if first > fr.lo:
        parts.append(f"<td colspan='{first - fr.lo}'></td>")
    wrong = first_wrong(row, final, last)
    parts += [_cell(result, row, pos - row.start, final, wrong) for pos in range(first, last)]
    if fr.hi > max(last, fr.lo):
        parts.append(f"<td colspan='{fr.hi - max(last, fr.lo)}'></td>")
    return "".join(parts) + "</tr>"


def jacobi_view(result: dict, step: Optional[int] = None, window: int = WINDOW) -> str:
    """HTML: the whole run (scrolls), or with ``step`` the window of that replay step."""
    allrows = rows(result)
    fr = frame(result, step, window, allrows=allrows)
    final = list(result.get("token_ids") or ())
    pieces = result.get("pieces") or []
    head = "".join(
        f"<th data-pos='{p}'>{p}<span class='dp-jc-final'>"
        f"{html.escape(_visible(str(pieces[p]))) if p < len(pieces) else '&nbsp;'}</span></th>"
        for p in range(fr.lo, fr.hi))
    body = "".join(_row_html(result, r, fr, final) for r in fr.rows)
    legend = "".join(f"<span class='dp-jc-chip' data-state='{s}'>{html.escape(t)}</span>"
                     for s, (t, _) in STATES.items())
    note = f"<p class='dp-jc-help'>Showing {html.escape(fr.note)}.</p>" if fr.note else ""
    marks = ("<p class='dp-jc-help'>" + " ".join(f"<span class='dp-jc-chip' data-mark='{m}'>{html.escape(t)}</span>"
                                                  for m, (t, _) in MARKS.items()) + "</p>")
    figures = figures_line(allrows if step is None else [r for r in allrows if r.step <= step])
    figures = f"<p class='dp-jc-help dp-jc-blocks'>{html.escape(figures)}</p>" if figures else ""
    help_line = ("One row per Jacobi iteration (one target forward), one column per output position; the header "
                 "holds the final output. A yellow cell is right before the tokens it depends on are: "
                 "the model resolved it out of order.")
    return (f"<div class='dp-jacobi'><style>{CSS}</style><p class='dp-jc-help'>{html.escape(help_line)}</p>"
            f"<div>{legend}</div>{marks}{figures}{note}<div class='dp-jc-scroll'><table class='dp-jc-table'>"
            f"<thead><tr><th class='dp-jc-label'>iteration \\ position</th>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table></div></div>")


def jacobi_heatmap(result: dict, step: Optional[int] = None, max_positions: int = 64, max_rows: int = 80) -> Any:
    """The same cells as a plotly heatmap (for ``gr.Plot``): token text in the cells, state as colour.

    A figure cannot scroll: a run wider than ``max_positions`` shows its first
    positions; with ``step``, the ``STEP_POSITIONS`` around that replay step's window.
    """
    fr = frame(result, step, max_positions, max_rows=max_rows)
    if step is not None or fr.hi - fr.lo > max_positions or len(fr.rows) > max_rows:   # larger than a figure shows
        width = max_positions if step is None else min(max_positions, STEP_POSITIONS)
        fr = frame(result, step, width, focus=True, max_rows=max_rows)
    final = list(result.get("token_ids") or ())
    pieces = result.get("pieces") or []
    cols = list(range(fr.lo, fr.hi))
    z, text, hover = [], [], []
    for row in fr.rows:
        zr, tr, hr = [None] * len(cols), [""] * len(cols), [""] * len(cols)
        for pos in range(max(row.start, fr.lo), min(row.end, fr.hi)):
            i, c = pos - row.start, pos - fr.lo
            state = row.state(i, final)
            prob = number(row.probs[i], None) if i < len(row.probs) else None
            zr[c] = CODES[state]
            tr[c] = plot_text(_visible(_text(result, row.tokens[i]), 6))
            hr[c] = plot_text(f"{_text(result, row.tokens[i])!r}: {STATES[state][0]}"
                              + (f", p={prob:.3f}" if prob is not None else "")
                              + (f"; final {str(pieces[pos])!r}" if pos < len(pieces) else ""))
        z.append(zr), text.append(tr), hover.append(hr)
    k = len(STATES)
    scale = [[edge, colour] for i, (_, colour) in enumerate(STATES.values()) for edge in (i / k, (i + 1) / k)]
    fig = go.Figure(go.Heatmap(
        z=z, x=cols, y=[plot_text(r.label) for r in fr.rows], text=text, customdata=hover,
        texttemplate="%{text}", textfont={"size": 9}, colorscale=scale, zmin=-0.5, zmax=k - 0.5,
        hovertemplate="%{y}<br>position %{x}: %{customdata}<extra></extra>", showscale=False, xgap=1, ygap=1))
    fig.update_xaxes(side="top", title_text="output position")
    fig.update_yaxes(autorange="reversed")
    legend = " · ".join(f"<span style='color:{c}'>■</span> {t}" for t, c in STATES.values())
    fig.update_layout(title=dict(text="Jacobi: guesses per iteration (rows) at each output position (columns)"
                                 + (f" · {fr.note}" if fr.note else "") + f"<br><sup>{legend}</sup>"),
                      height=200 + 24 * len(fr.rows), template="plotly_white",
                      margin=dict(l=200, r=20, t=130, b=20))
    return fig
