"""The draft tree at a replay step, and its tree attention mask. Never imports torch.

A result dict is ``RunResult.to_dict()``. Tree drafts are ``DraftTree`` events;
a chain draft (``DraftProposed``, every version of the trace format) is shown as
the tree whose parents are ``i - 1``, its accepted length read from the step's
``TokenVerified`` events. The figure has two panels:

* the tree: x is the depth below the root (the newest committed token), one row
  per leaf; nodes on the accepted path are green, the children the target tried
  and rejected red, the rest grey (never reached); the target's own token after
  the path (correction or bonus) hangs off the last accepted node;
* the mask: which query (row) may attend to which draft position (column) in the
  verify forward -- the root and every node see their ancestors and themselves.
"""

from __future__ import annotations

import html
from typing import Any, Optional

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .tokens import LEGEND

MAX_NODES = 128          # larger trees (hand-made traces) are cut to their first nodes


def _events(result: dict, kinds: tuple[str, ...]) -> list[dict]:
    return [e for e in result.get("events", ()) if e.get("type") in kinds]


def draft_steps(result: dict) -> list[int]:
    """Replay steps at which this result verified a draft (a tree or a non-empty chain)."""
    return sorted({int(e["step"]) for e in _events(result, ("DraftTree", "DraftProposed")) if e.get("tokens")})


def has_trees(result: dict) -> bool:
    return any(e.get("type") == "DraftTree" for e in result.get("events", ()))


def tree_at(result: dict, step: Optional[int] = None) -> Optional[dict]:
    """The draft verified at replay ``step`` (the last at or before it; None: the last one).

    Returns ``{step, position, tokens, parents, q, accepted, next_token, kind, source, nodes}``
    where ``accepted`` lists the accepted path's nodes, ``kind`` is "tree" or "chain", and
    ``nodes`` is the draft's size: only its first ``MAX_NODES`` nodes are kept (and drawn).
    """
    chosen = None
    for e in _events(result, ("DraftTree", "DraftProposed")):
        if e.get("tokens") and (step is None or int(e["step"]) <= step):
            chosen = e
    if chosen is None:
        return None
    tokens = [int(t) for t in chosen["tokens"][:MAX_NODES]]
    n = len(tokens)
    if chosen["type"] == "DraftTree":
        parents = [int(p) if -1 <= int(p) < i else -1 for i, p in enumerate(chosen["parents"][:n])]
        accepted = [int(a) for a in chosen.get("accepted", ())[:n] if 0 <= int(a) < n]
        nxt = int(chosen.get("next_token", -1))
        kind = "tree"
    else:   # a chain: accepted length from the step's verifications, next token from its correction
        parents = list(range(-1, n - 1))
        verified = [e for e in _events(result, ("TokenVerified",)) if e["step"] == chosen["step"]]
        accepted = list(range(min(n, sum(1 for e in verified if e.get("accepted")))))
        fix = [e for e in _events(result, ("CorrectionToken",)) if e["step"] == chosen["step"]]
        nxt = int(fix[-1]["token"]) if fix else -1
        kind = "chain"
    q = [float(x) for x in chosen.get("q", ())[:n]]
    return {"step": int(chosen["step"]), "position": int(chosen.get("position", 0)), "tokens": tokens,
            "parents": parents, "q": q, "accepted": accepted, "next_token": nxt, "kind": kind,
            "source": str(chosen.get("source", "")), "nodes": len(chosen["tokens"]), "layers": layer_note(chosen)}


MAX_LISTED = 12          # skipped layers named in a title; the rest are counted


def layer_note(event: dict) -> str:
    """Which of the target's own layers drafted a self-draft (``DraftProposed.layers``), in words; "" for other
    drafters."""
    total, exit_layer = int(event.get("layers", 0) or 0), int(event.get("exit_layer", 0) or 0)
    if total <= 0:
        return ""
    skipped = sorted({int(i) for i in event.get("skipped", ()) or ()})
    if skipped:
        named = ", ".join(map(str, skipped[:MAX_LISTED])) + (f" and {len(skipped) - MAX_LISTED} more"
                                                            if len(skipped) > MAX_LISTED else "")
        return f"{total - len(skipped)} of {total} layers (skipping {named})"
    return f"layers 0-{exit_layer - 1} of {total} (exit after layer {exit_layer - 1})"


def mask_matrix(parents: list[int]) -> list[list[int]]:
    """Rows/columns: the root, then each node. 1 where the row may attend to the column."""
    n = len(parents)
    rows = [[0] * (n + 1) for _ in range(n + 1)]
    rows[0][0] = 1
    for i, p in enumerate(parents):
        r = i + 1
        rows[r] = list(rows[0 if p < 0 else p + 1])
        rows[r][r] = 1
    return rows


def _layout(parents: list[int]) -> list[float]:
    """A y coordinate per node: leaves in depth-first order, parents centred over their children."""
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        kids.setdefault(p, []).append(i)
    y: dict[int, float] = {}
    row = [0.0]

    def place(node: int) -> float:
        children = kids.get(node, [])
        if not children:
            y[node] = row[0]
            row[0] += 1.0
        else:
            ys = [place(c) for c in children]
            y[node] = (ys[0] + ys[-1]) / 2
        return y[node]

    place(-1)
    return [y[i] for i in range(len(parents))] + [y[-1]]


def _text(result: dict, token: int) -> str:
    raw = result.get("vocab", {}).get(str(token))
    shown = repr(raw[:17])[1:-1] if isinstance(raw, str) else f"<{token}>"
    return html.escape(shown[:16] or "∅")


def tree_figure(result: dict, step: Optional[int] = None) -> Any:
    """The draft tree verified at ``step`` and its attention mask, side by side."""
    t = tree_at(result, step)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.64, 0.36], horizontal_spacing=0.08,
                        subplot_titles=("draft tree (x: depth below the newest token)", "tree attention mask"))
    if t is None:
        fig.update_layout(title="No draft verified yet at this step", height=320, template="plotly_white")
        return fig
    tokens, parents, accepted = t["tokens"], t["parents"], set(t["accepted"])
    depth = [0] * len(tokens)
    for i, p in enumerate(parents):
        depth[i] = 1 if p < 0 else depth[p] + 1
    ys = _layout(parents)
    root_y = ys[-1]
    last = t["accepted"][-1] if t["accepted"] else -1
    tried = {c for c, p in enumerate(parents) if p == last}        # the children checked where the path stopped
    # 1. edges, then nodes coloured by their fate
    ex, ey = [], []
    for i, p in enumerate(parents):
        ex += [depth[p] if p >= 0 else 0, depth[i], None]
        ey += [ys[p] if p >= 0 else root_y, ys[i], None]
    fig.add_scatter(x=ex, y=ey, mode="lines", line={"color": "#bbbbbb", "width": 1}, hoverinfo="skip",
                    showlegend=False, row=1, col=1)
    groups = {"accepted": ([], LEGEND["accepted"][1]), "rejected": ([], LEGEND["rejected"][1]),
              "not reached": ([], "#cccccc")}
    for i in range(len(tokens)):
        fate = "accepted" if i in accepted else ("rejected" if i in tried else "not reached")
        groups[fate][0].append(i)
    for fate, (nodes, colour) in groups.items():
        if nodes:
            fig.add_scatter(x=[depth[i] for i in nodes], y=[ys[i] for i in nodes], mode="markers+text",
                            text=[_text(result, tokens[i]) for i in nodes], textposition="middle right",
                            marker={"size": 12, "color": colour, "line": {"width": 1, "color": "#555555"}},
                            customdata=[[i, t["q"][i] if i < len(t["q"]) else None] for i in nodes],
                            hovertemplate="node %{customdata[0]}: %{text}<br>q=%{customdata[1]}<extra>" + fate
                            + "</extra>", name=fate, row=1, col=1)
    fig.add_scatter(x=[0], y=[root_y], mode="markers", marker={"size": 14, "color": LEGEND["greedy"][1],
                    "symbol": "square"}, name="root (newest token)", hoverinfo="name", row=1, col=1)
    if t["next_token"] >= 0:
        kind = "bonus" if not any(p == last for p in parents) else "correction"
        x0, y0 = (depth[last], ys[last]) if last >= 0 else (0, root_y)
        fig.add_scatter(x=[x0, x0 + 1], y=[y0, y0], mode="lines+markers+text",
                        text=["", _text(result, t["next_token"])], textposition="middle right",
                        line={"color": LEGEND[kind][1], "dash": "dot"},
                        marker={"size": [0, 12], "color": LEGEND[kind][1], "symbol": "diamond"},
                        name=f"target's {kind}", hoverinfo="name", row=1, col=1)
    # 2. the mask: rows = queries, columns = keys (root first), accepted rows emphasized
    m = mask_matrix(parents)
    z = [[cell * (2 if r - 1 in accepted or r == 0 else 1) for cell in row] for r, row in enumerate(m)]
    labels = ["root"] + [f"{i}:{_text(result, tok)}" for i, tok in enumerate(tokens)]
    fig.add_heatmap(z=z, x=labels, y=labels, colorscale=[[0, "#ffffff"], [0.5, "#b7c9e2"], [1, "#009E73"]],
                    zmin=0, zmax=2, showscale=False, hovertemplate="query %{y}<br>key %{x}<extra></extra>",
                    row=1, col=2)
    fig.update_yaxes(autorange="reversed", showticklabels=False, row=1, col=1)
    fig.update_yaxes(autorange="reversed", row=1, col=2, tickfont={"size": 8})
    fig.update_xaxes(title_text="depth", dtick=1, row=1, col=1)
    fig.update_xaxes(tickfont={"size": 8}, tickangle=-60, row=1, col=2)
    cut = f" (the first {len(tokens)} shown)" if t["nodes"] > len(tokens) else ""
    by = html.escape(t["source"]) + (f" ({html.escape(t['layers'])})" if t["layers"] else "")
    title = (f"{t['kind']} of {t['nodes']} nodes{cut} drafted by {by} at step {t['step']} "
             f"(output position {t['position']}): {len(t['accepted'])} accepted")
    fig.update_layout(title=title, height=260 + 14 * max(len(tokens), 8), template="plotly_white",
                      margin=dict(l=30, r=20, t=70, b=80), legend={"orientation": "h", "y": -0.15})
    return fig
