"""Views of speculative runs: accepted length per step and the p/q inspector. Never imports torch."""

from __future__ import annotations

from collections import Counter
from typing import Any, Optional

import plotly.graph_objects as go

from .tokens import LEGEND, plot_text

MAX_LENGTH_BARS = 64   # accepted lengths drawn one bar each; longer ones share the last bar
MAX_TOKENS = 64        # tokens drawn in the inspector (a real event holds the top 10; traces may hold more)


def _steps(result: dict) -> list[tuple[int, int]]:
    """(drafted, accepted) per verify step, from StepTiming events or the stats."""
    rows = [(e["drafted"], e["accepted"]) for e in result.get("events", ()) if e.get("type") == "StepTiming"]
    if not rows:
        rows = [(0, n) for n in (result.get("stats") or {}).get("accepted_lengths", [])]
    return rows


def has_drafts(result: dict) -> bool:
    return bool(_steps(result))


def accepted_length_histogram(results: list[dict]) -> Any:
    """How many drafted tokens the target accepted per verify step, one bar group per strategy."""
    fig = go.Figure()
    for r in results:
        steps = _steps(r)
        if not steps:
            continue
        counts = Counter(min(int(acc), MAX_LENGTH_BARS) for _, acc in steps)
        xs = list(range(0, max(counts) + 1))
        fig.add_bar(x=xs, y=[counts.get(x, 0) for x in xs], name=plot_text(r.get("label") or r["strategy"]))
    fig.update_layout(title="Accepted draft tokens per target forward", xaxis_title="accepted tokens",
                      yaxis_title="steps", barmode="group", height=320, template="plotly_white",
                      margin=dict(l=40, r=20, t=50, b=40))
    return fig


def _short(value: object, limit: int = 24) -> str:
    """``repr`` of a token's text, cut to ``limit`` characters (…) before it is built in full."""
    text = repr(value[:limit + 1] if isinstance(value, str) else value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def inspectable_positions(result: dict) -> list[int]:
    return sorted({e["position"] for e in result.get("events", ()) if e.get("type") == "Distribution"})


def inspector(result: dict, position: int) -> Any:
    """p_target vs q_draft for the top tokens at one output position, and the residual if one was sampled."""
    dist: Optional[dict] = None
    for e in result.get("events", ()):
        if e.get("type") == "Distribution" and e["position"] == position:
            dist = e   # the last verification of this position is the one that decided it
    fig = go.Figure()
    if dist is None:
        fig.update_layout(title=f"No verification recorded at position {position}", height=300,
                          template="plotly_white")
        return fig
    vocab = result.get("vocab", {})
    n = min(len(dist["tokens"]), MAX_TOKENS)
    labels = [plot_text(f"{_short(vocab.get(str(t), t))} ({t})") for t in dist["tokens"][:n]]
    fig.add_bar(x=labels, y=dist["p_target"][:n], name="p_target", marker_color=LEGEND["beam"][1])
    if dist.get("q_draft"):
        fig.add_bar(x=labels, y=dist["q_draft"][:n], name="q_draft", marker_color=LEGEND["correction"][1])
    if dist.get("residual"):
        fig.add_bar(x=labels, y=dist["residual"][:n], name="residual max(0, p - q), normalized",
                    marker_color=LEGEND["rejected"][1])
    verdicts = [e for e in result.get("events", ()) if e.get("type") == "TokenVerified"
                and e["position"] == position]
    note = ""
    if verdicts:
        v = verdicts[-1]
        tok = vocab.get(str(v["token"]), v["token"])
        u = "" if v.get("u") is None else f", u={v['u']:.3f}"
        note = plot_text(f" — drafted {_short(tok)}: {'accepted' if v['accepted'] else 'rejected'} "
                         f"(p={v['p_target']:.3f}, q={v['q_draft']:.3f}{u})")
    if n < len(dist["tokens"]):
        note += f" (the first {n} of {len(dist['tokens'])} tokens)"
    fig.update_layout(title=f"Position {position} (step {dist['step']}){note}", barmode="group",
                      yaxis_title="probability", height=340, template="plotly_white",
                      margin=dict(l=40, r=20, t=60, b=80))
    return fig
