"""Plotly figures from result dicts (the ``RunResult.to_dict()`` shape). Never imports torch."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from .tokens import LEGEND

_PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"]


def _name(r: dict) -> str:
    return (r.get("label") or r.get("strategy", "?")) + (" (ref)" if r.get("reference") else "")


def speed_chart(results: list[dict]) -> Any:
    """Tokens/s per strategy, annotated with the speedup against greedy."""
    ok = [r for r in results if not r.get("error")]
    names = [_name(r) for r in ok]
    fig = go.Figure(go.Bar(
        x=names, y=[r.get("tokens_per_s") or 0 for r in ok],
        marker_color=[_PALETTE[i % len(_PALETTE)] for i in range(len(ok))],
        text=[("–" if r.get("speedup") is None else f"{r['speedup']:.2f}× greedy") for r in ok],
        textposition="outside",
        hovertemplate="%{x}<br>%{y:.1f} tok/s<br>%{text}<extra></extra>"))
    top = max([r.get("tokens_per_s") or 0 for r in ok] + [1e-9])
    fig.update_yaxes(range=[0, top * 1.25])
    fig.update_layout(title="Tokens per second (label: speedup vs greedy)", yaxis_title="tokens / s",
                      margin=dict(l=40, r=20, t=50, b=40), height=340, template="plotly_white")
    return fig


def forward_timeline(results: list[dict]) -> Any:
    """Every forward pass along wall-clock time, one row per strategy, target vs draft."""
    fig = go.Figure()
    colours = {"target": "#0072B2", "draft": "#E69F00"}
    shown = set()
    for r in results:
        t = 0.0
        for e in r.get("events", ()):
            if e.get("type") != "ForwardPass":
                continue
            model = e.get("model", "target")
            fig.add_trace(go.Bar(
                y=[_name(r)], x=[e["ms"]], base=[t], orientation="h", name=model,
                marker_color=colours.get(model, "#999999"), showlegend=model not in shown,
                hovertemplate=f"{model} {e.get('kind', '')}: {e['positions']} positions, "
                              f"{e['ms']:.1f} ms (step {e['step']})<extra></extra>"))
            shown.add(model)
            t += e["ms"]
    fig.update_layout(barmode="overlay", title="Forward passes along wall-clock time",
                      xaxis_title="milliseconds (sum of forward time)", height=120 + 40 * max(1, len(results)),
                      margin=dict(l=40, r=20, t=50, b=40), template="plotly_white")
    return fig


def source_counts(results: list[dict]) -> Any:
    """How each strategy's tokens were produced (stacked), coloured by the shared legend."""
    fig = go.Figure()
    names = [_name(r) for r in results]
    for source, (label, colour) in LEGEND.items():
        counts = [sum(1 for e in r.get("events", ()) if e.get("type") == "TokenCommitted"
                      and e.get("source") == source) for r in results]
        if any(counts):
            fig.add_bar(x=names, y=counts, name=label, marker_color=colour)
    fig.update_layout(barmode="stack", title="Where the tokens came from", yaxis_title="tokens",
                      height=320, margin=dict(l=40, r=20, t=50, b=40), template="plotly_white")
    return fig
