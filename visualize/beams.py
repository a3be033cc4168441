"""The beam-search tree from ``BeamStep`` events: beams, scores, pruned branches. Never imports torch.

A ``BeamStep`` lists the running beams after one step (each beam's generated
tokens so far, best first) and their cumulative log-probabilities. Each beam is
a node of a tree of prefixes: its parent is the beam one token shorter that it
extends. A beam that no beam of the next step extends was pruned there (its
continuations fell out of the best ``num_beams``, or it finished: ``BeamStep``
keeps only the running ones). The path of the output (the best finished
hypothesis) is marked, and its last token hangs off the tree as "finished".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import plotly.graph_objects as go

from .tokens import LEGEND, number, plot_text

WINDOW = 16          # output positions drawn around the replay step
MAX_BEAMS = 32       # beams drawn per step (the strategy allows 16)
DEAD = -1e8          # scores at or below this are transformers' "impossible" beams: not drawn
FATES = {            # fate: (legend text, colour, marker)
    "output": ("on the output's path", LEGEND["accepted"][1], "circle"),
    "alive": ("still running at this step", LEGEND["beam"][1], "circle"),
    "pruned": ("pruned: no beam extends it", LEGEND["rejected"][1], "x"),
    "finished": ("the output's last tokens (finished hypothesis)", LEGEND["accepted"][1], "star"),
}


@dataclass(frozen=True)
class Node:
    depth: int          # tokens generated (1 = the first new token)
    rank: int           # beam index at its step, best first
    token: int
    score: float        # cumulative log-probability
    parent: int         # index into the node list, -1 below the prompt
    fate: str
    step: int           # the replay step of its BeamStep


def _beam_steps(result: dict) -> list[dict]:
    return [e for e in result.get("events", ()) if isinstance(e, dict) and e.get("type") == "BeamStep"]


def has_beams(result: dict) -> bool:
    return bool(_beam_steps(result))


def beam_tree(result: dict, step: Optional[int] = None, last: Optional[int] = None) -> list[Node]:
    """Every beam (the first ``MAX_BEAMS`` of each) of every ``BeamStep`` up to replay ``step`` (None: all),
    or of the ``last`` of them, as a tree node, with its fate."""
    steps = [e for e in _beam_steps(result) if step is None or int(e.get("step", 0)) <= step]
    if last is not None:
        steps = steps[max(0, len(steps) - last):]
    output = tuple(result.get("token_ids") or ())
    nodes: list[Node] = []
    previous: dict[tuple, int] = {}          # prefix -> node index, at the step before
    extended: set[int] = set()
    for t, e in enumerate(steps):
        current: dict[tuple, int] = {}
        scores = (e.get("scores") or ())[:MAX_BEAMS]
        for rank, beam in enumerate((e.get("tokens") or ())[:MAX_BEAMS]):
            beam = tuple(beam)
            score = number(scores[rank], None) if rank < len(scores) else None
            if not beam or score is None or score <= DEAD or beam in current:
                continue
            parent = previous.get(beam[:-1], -1)
            extended.add(parent)
            on_path = output[:len(beam)] == beam
            current[beam] = len(nodes)
            nodes.append(Node(len(beam), rank, int(beam[-1]), float(score), parent,
                              "output" if on_path else "alive", int(e.get("step", 0))))
        previous = current
    last = set(previous.values())
    return [n if n.fate == "output" or i in last or i in extended else Node(**{**n.__dict__, "fate": "pruned"})
            for i, n in enumerate(nodes)]


def _text(result: dict, token: int) -> str:
    raw = (result.get("vocab") or {}).get(str(token))
    shown = repr(raw[:15])[1:-1] if isinstance(raw, str) else f"<{token}>"
    return plot_text(shown[:14] or "∅")


def beam_figure(result: dict, step: Optional[int] = None, window: int = WINDOW) -> Any:
    """The beams up to replay ``step``: x = output position, one row per beam rank (best at the top).

    Only the last ``window`` beam steps are built (a step adds one position), at most ``MAX_BEAMS`` beams each.
    """
    nodes = beam_tree(result, step, last=window)
    fig = go.Figure()
    if not nodes:
        fig.update_layout(title="No beam-search step recorded yet", height=260, template="plotly_white")
        return fig
    hi = max(n.depth for n in nodes)
    lo = max(1, hi - window + 1)
    shown = [i for i, n in enumerate(nodes) if n.depth >= lo]
    # 1. edges from each parent to its child (inside the window)
    ex, ey = [], []
    for i in shown:
        n = nodes[i]
        if n.parent >= 0 and nodes[n.parent].depth >= lo:
            p = nodes[n.parent]
            ex += [p.depth - 1, n.depth - 1, None]
            ey += [p.rank, n.rank, None]
    fig.add_scatter(x=ex, y=ey, mode="lines", line={"color": "#bbbbbb", "width": 1}, hoverinfo="skip",
                    showlegend=False)
    # 2. nodes by fate
    for fate, (label, colour, symbol) in FATES.items():
        group = [nodes[i] for i in shown if nodes[i].fate == fate]
        if group:
            fig.add_scatter(x=[n.depth - 1 for n in group], y=[n.rank for n in group], mode="markers+text",
                            text=[_text(result, n.token) for n in group], textposition="top center",
                            marker={"size": 11, "color": colour, "symbol": symbol,
                                    "line": {"width": 1, "color": "#555555"}},
                            customdata=[[n.score, n.step] for n in group], name=label,
                            hovertemplate="position %{x} · beam %{y}<br>%{text}<br>log-prob %{customdata[0]:.3f}"
                                          "<br>step %{customdata[1]}<extra></extra>")
    _finished_tail(fig, result, nodes, lo, step)
    ranks = max(n.rank for n in nodes) + 1
    most = max((len(e.get("tokens") or ()) for e in _beam_steps(result)), default=0)
    cut = f"; the first {MAX_BEAMS} of {most} beams" if most > MAX_BEAMS else ""
    fig.update_xaxes(title_text="output position", dtick=1, range=[lo - 1.6, hi + 0.8])
    fig.update_yaxes(title_text="beam (best first)", autorange="reversed", dtick=1, range=[ranks, -1])
    fig.update_layout(title=f"Beam search: {ranks} beams, positions {lo - 1}–{hi - 1}{cut} (label: token; hover: "
                            "cumulative log-probability)", height=200 + 46 * ranks, template="plotly_white",
                      margin=dict(l=60, r=20, t=60, b=40), legend={"orientation": "h", "y": -0.2})
    return fig


def _finished_tail(fig: Any, result: dict, nodes: list[Node], lo: int, step: Optional[int]) -> None:
    """The output's tokens after its last running prefix: the hypothesis that finished (run complete only)."""
    output = list(result.get("token_ids") or ())
    on_path = [n for n in nodes if n.fate == "output"]
    if step is not None and step < max((int(e.get("step", 0)) for e in _beam_steps(result)), default=0):
        return
    depth = max((n.depth for n in on_path), default=0)
    if len(output) <= depth or depth + 1 < lo:
        return
    anchor = next((n for n in on_path if n.depth == depth), None)
    x0, y0 = (anchor.depth - 1, anchor.rank) if anchor else (depth - 1, 0)
    tail = "".join(_text(result, t) for t in output[depth:depth + 4]) + ("…" if len(output) > depth + 4 else "")
    label, colour, symbol = FATES["finished"]
    fig.add_scatter(x=[x0, len(output) - 1], y=[y0, y0], mode="lines+markers+text", text=["", tail],
                    textposition="top center", line={"color": colour, "dash": "dot"},
                    marker={"size": [0, 14], "color": colour, "symbol": symbol}, name=label, hoverinfo="name")
