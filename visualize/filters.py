"""One sampled position's distribution before and after temperature, top-k and top-p. Never imports torch.

The ``sample`` strategy records a ``SamplingFilter`` event per position when it
is traced: the most probable tokens with their probability from the raw logits,
after temperature, and after top-k / top-p (renormalized: what the token was
drawn from), and the token drawn. The figure shows the three as grouped bars.
"""

from __future__ import annotations

from typing import Any, Optional

import plotly.graph_objects as go

from .tokens import LEGEND, number, plot_text

MAX_BARS = 64        # tokens drawn (a real event holds the top 20 and the drawn one; traces may hold more)
STAGES = (("p_raw", "raw logits (temperature 1)", "#999999"),
          ("p_temperature", "after temperature", LEGEND["greedy"][1]),
          ("p_final", "after top-k and top-p (drawn from)", LEGEND["sample"][1]))


def filters(result: dict) -> list[dict]:
    return [e for e in result.get("events", ()) if isinstance(e, dict) and e.get("type") == "SamplingFilter"]


def has_filters(result: dict) -> bool:
    return bool(filters(result))


def sampled_positions(result: dict) -> list[int]:
    return sorted({int(e["position"]) for e in filters(result)})


def filter_at(result: dict, position: Any = None, step: Optional[int] = None) -> Optional[dict]:
    """The event at output ``position`` (the nearest recorded one), or the last one at or before ``step``."""
    events = filters(result)
    if step is not None:
        events = [e for e in events if int(e.get("step", 0)) <= step]
    if not events:
        return None
    pos = number(position, None)
    if pos is None:
        return events[-1]
    return min(events, key=lambda e: (abs(int(e["position"]) - pos), int(e["position"])))


def _label(result: dict, token: int) -> str:
    raw = (result.get("vocab") or {}).get(str(token))
    shown = repr(raw[:16]) if isinstance(raw, str) else f"<{token}>"
    return plot_text(f"{shown[:16]} ({token})")


def sampling_figure(result: dict, position: Any = None, step: Optional[int] = None) -> Any:
    """Grouped bars: the top tokens' probability at each stage; the drawn token is starred."""
    e = filter_at(result, position, step)
    fig = go.Figure()
    if e is None:
        fig.update_layout(title="No sampled position recorded (run Sampling with temperature > 0)", height=300,
                          template="plotly_white")
        return fig
    all_tokens = e.get("tokens") or ()
    chosen = e.get("chosen", -1)
    keep = list(range(min(len(all_tokens), MAX_BARS)))     # the first tokens, and the drawn one wherever it is
    if chosen in all_tokens[MAX_BARS:]:
        keep.append(MAX_BARS + list(all_tokens[MAX_BARS:]).index(chosen))
    tokens = [all_tokens[i] for i in keep]
    labels = [("★ " if t == chosen else "") + _label(result, t) for t in tokens]
    for key, name, colour in STAGES:
        values = e.get(key) or ()
        if len(values) == len(all_tokens):
            fig.add_bar(x=labels, y=[values[i] for i in keep], name=name, marker_color=colour,
                        hovertemplate="%{x}: %{y:.4f}<extra>" + name + "</extra>")
    t, k, p = (number(e.get("temperature"), 1.0), int(number(e.get("top_k"), 0) or 0),
               number(e.get("top_p"), 1.0))
    settings = f"temperature {t:g}, top-k {k or 'off'}, top-p {p:g}"
    if len(tokens) < len(all_tokens):
        settings += f"; {len(tokens)} of its {len(all_tokens)} tokens shown"
    fig.update_layout(title=plot_text(f"Position {int(e['position'])} (step {int(e['step'])}): {settings}; "
                                      f"{int(number(e.get('kept'), 0) or 0)} tokens left to draw from; ★ drawn"),
                      barmode="group", yaxis_title="probability", xaxis_title="the most probable tokens",
                      height=360, template="plotly_white", margin=dict(l=50, r=20, t=60, b=90),
                      legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0})
    return fig
