"""Views of lookahead runs: the 2D window and the verified n-grams per step. Never imports torch.

A result dict is ``RunResult.to_dict()``; its ``LookaheadStep`` events carry the
window the fused forward saw (levels oldest first, ``W`` columns each), the
candidate continuations verified after the key token, which one was accepted
and the tokens committed. Token text is always HTML-escaped.
"""

from __future__ import annotations

import html
from typing import Any, Optional

import plotly.graph_objects as go

from .tokens import LEGEND, _tint

MAX_CELLS = 64      # rows and columns drawn per table (a real window is at most 8 x 32)
MAX_STEPS = 2000    # steps drawn in the per-step figure
MAX_LABEL = 16      # characters of a token drawn in a cell
MAX_HOVER = 80      # characters of a step's committed text in the figure's hover

_CSS = ("<style>.dp-la table{border-collapse:collapse;margin:4px 0 10px}"
        ".dp-la td,.dp-la th{border:1px solid #ddd;padding:2px 6px;font-family:monospace;font-size:12px;"
        "white-space:pre}.dp-la th{background:#f6f6f6;font-weight:normal}"
        ".dp-la .dp-hit{background:%s}.dp-la .dp-bonus{background:%s}.dp-la .dp-key{background:%s}"
        ".dp-la .dp-miss{color:#888}</style>") % (_tint(LEGEND["accepted"][1], 0.35),
                                                   _tint(LEGEND["greedy"][1], 0.45), "#eeeeee")


def _steps(result: dict) -> list[dict]:
    return [e for e in result.get("events", ()) if e.get("type") == "LookaheadStep"]


def has_steps(result: dict) -> bool:
    return bool(_steps(result))


def ngram_tokens(e: dict) -> int:
    """How many committed tokens of a step came from the accepted n-gram.

    The accepted candidate agrees with the committed tokens exactly on those: the
    target's own token after them differs from the candidate's next one (or the
    candidate ended), since otherwise verification would have accepted it too.
    """
    j = e["accepted_candidate"]
    if j < 0 or j >= len(e["candidates"]):
        return 0
    n = 0
    for a, b in zip(e["candidates"][j], e["accepted"]):
        if a != b:
            break
        n += 1
    return n


def _text(result: dict, token: Any) -> str:
    """A token's text as a short escaped cell label (repr shows whitespace; a long one is cut, marked …)."""
    raw = result.get("vocab", {}).get(str(token))
    shown = repr(raw[:MAX_LABEL + 1])[1:-1] if isinstance(raw, str) else f"<{token}>"
    return html.escape((shown[:MAX_LABEL] + "…" if len(shown) > MAX_LABEL else shown) or "∅")


def _committed_text(result: dict, tokens: Any, limit: int = MAX_HOVER) -> str:
    """The text of ``tokens``, at most ``limit`` characters (cut ones end in …): never more than it shows."""
    vocab, parts, size = result.get("vocab", {}), [], 0
    for t in tokens:
        piece = vocab.get(str(t), f"<{t}>")
        parts.append(piece[:limit + 1 - size])
        size += len(parts[-1])
        if size > limit:
            return "".join(parts)[:limit] + "…"
    return "".join(parts)


def lookahead_steps(result: dict, limit: Optional[int] = None) -> list[dict]:
    """One row per lookahead step (the first ``limit``): what was verified, accepted and committed."""
    rows = []
    for e in _steps(result)[:limit]:
        rows.append({"step": e["step"], "position": e["position"], "pool_size": e["pool_size"],
                     "pool_hits": e.get("pool_hits", len(e["candidates"])),
                     "candidates": len(e["candidates"]), "accepted_candidate": e["accepted_candidate"],
                     "ngram_tokens": ngram_tokens(e), "committed": len(e["accepted"]),
                     "text": _committed_text(result, e["accepted"])})
    return rows


def step_at(result: dict, step: Optional[int] = None) -> Optional[dict]:
    """The lookahead step shown at replay ``step``: the last one at or before it (None: the last)."""
    chosen = None
    for e in _steps(result):
        if step is None or e["step"] <= step:
            chosen = e
    return chosen


def _cut(what: str, shown: int, total: int) -> str:
    return f"first {shown} of {total} {what}" if shown < total else ""


def _note(*parts: str) -> str:
    """A visible line saying what a table leaves out (empty when it shows everything)."""
    said = [p for p in parts if p]
    return f"<div class='dp-muted'>Showing the {html.escape(', '.join(said))}.</div>" if said else ""


def _window_table(result: dict, e: dict) -> str:
    levels = e.get("window") or []
    window = [lv[:MAX_CELLS] for lv in levels[:MAX_CELLS]]
    width = max((len(lv) for lv in window), default=0)
    head = "".join(f"<th>col {i}</th>" for i in range(width))
    body = "".join(f"<tr><th>level {l}{' (oldest)' if l == 0 and len(window) > 1 else ''}</th>"
                   + "".join(f"<td>{_text(result, t)}</td>" for t in lv) + "</tr>"
                   for l, lv in enumerate(window))
    note = _note(_cut("window levels", len(window), len(levels)),
                 _cut("columns", width, max((len(lv) for lv in levels[:MAX_CELLS]), default=0)))
    return f"{note}<table class='dp-window'><tr><th>window</th>{head}</tr>{body}</table>"


def _candidates_table(result: dict, e: dict) -> str:
    out = result.get("token_ids") or []
    pos = int(e["position"])
    key_cell = (f"<td class='dp-key'>{_text(result, out[pos - 1])}</td>" if 0 < pos <= len(out)
                else "<td class='dp-key'>key</td>")
    n_hit = ngram_tokens(e)
    rows = []
    for j, cand in enumerate(e["candidates"][:MAX_CELLS]):
        chosen = j == e["accepted_candidate"]
        cells = []
        for k, tok in enumerate(cand[:MAX_CELLS]):
            cls = "dp-hit" if chosen and k < n_hit else ("dp-miss" if chosen else "")
            cells.append(f"<td class='{cls}'>{_text(result, tok)}</td>")
        mark = " ✓" if chosen else ""
        rows.append(f"<tr><th>n-gram {j}{mark}</th>{key_cell}{''.join(cells)}</tr>")
    if not rows:
        rows.append("<tr><td>no n-gram in the pool starts with the key token</td></tr>")
    committed = "".join(
        f"<td class='{'dp-hit' if i < n_hit else 'dp-bonus'}'>{_text(result, t)}</td>"
        for i, t in enumerate(e["accepted"][:MAX_CELLS]))
    rows.append(f"<tr><th>committed</th>{key_cell}{committed}</tr>")
    longest = max((len(c) for c in e["candidates"][:MAX_CELLS]), default=0)
    note = _note(_cut("n-grams", min(len(e["candidates"]), MAX_CELLS), len(e["candidates"])),
                 _cut("tokens of each n-gram", min(longest, MAX_CELLS), longest),
                 _cut("committed tokens", min(len(e["accepted"]), MAX_CELLS), len(e["accepted"])))
    return f"{note}<table class='dp-cands'>{''.join(rows)}</table>"


def lookahead_step_html(result: dict, step: Optional[int] = None) -> str:
    """The window and the verification branch of the step shown at replay ``step``."""
    e = step_at(result, step)
    if e is None:
        return "<div class='dp-la'>No lookahead step yet.</div>"
    n_hit = ngram_tokens(e)
    n_target = len(e["accepted"]) - n_hit
    head = (f"<div><b>step {int(e['step'])}</b> · output position {int(e['position'])} · pool "
            f"{int(e['pool_size'])} n-grams · {int(e.get('pool_hits', 0))} start with the key · "
            f"{n_hit} n-gram token{'s' if n_hit != 1 else ''} accepted + {n_target} from the target</div>")
    return (f"{_CSS}<div class='dp-la'>{head}{_window_table(result, e)}"
            f"{_candidates_table(result, e)}</div>")


def lookahead_figure(result: dict) -> Any:
    """Tokens committed per step (n-gram hits stacked on the target's token) and the pool size."""
    rows = lookahead_steps(result, MAX_STEPS)
    total = len(_steps(result))
    xs = [r["step"] for r in rows]
    fig = go.Figure()
    fig.add_bar(x=xs, y=[1 if r["committed"] > r["ngram_tokens"] else 0 for r in rows], name="target token",
                marker_color=LEGEND["greedy"][1])
    fig.add_bar(x=xs, y=[r["ngram_tokens"] for r in rows], name="accepted n-gram tokens",
                marker_color=LEGEND["accepted"][1],
                hovertext=[html.escape(repr(r["text"])) for r in rows])
    fig.add_scatter(x=xs, y=[r["pool_size"] for r in rows], name="pool size", yaxis="y2",
                    mode="lines", line={"color": LEGEND["beam"][1]})
    # the legend goes above the plot: on the right it would sit on top of the pool-size axis and clip it
    cut = f" (first {MAX_STEPS} of {total} steps)" if total > MAX_STEPS else ""
    fig.update_layout(title="Lookahead: tokens committed per target forward" + cut, barmode="stack",
                      xaxis_title="step (target forwards)", yaxis={"title": "tokens", "automargin": True},
                      yaxis2={"title": "pool size", "overlaying": "y", "side": "right", "automargin": True,
                              "rangemode": "tozero"},
                      legend={"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom"},
                      height=340, template="plotly_white", margin=dict(l=50, r=70, t=80, b=50))
    return fig
