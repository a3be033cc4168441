"""The Jacobi iteration x position heatmap (the paper's dependency view). Never imports torch."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go


def has_iterations(result: dict) -> bool:
    return any(e.get("type") == "JacobiIteration" for e in result.get("events", ()))


def jacobi_heatmap(result: dict, max_positions: int = 64) -> Any:
    """Rows: Jacobi iterations (forward passes); columns: output positions.

    A cell is coloured by the target's probability of the token guessed there in
    that iteration; cells whose token is already fixed (verified) are marked ✓.
    The x axis carries the committed text.
    """
    its = [e for e in result.get("events", ()) if e.get("type") == "JacobiIteration"]
    pieces = result.get("pieces") or []
    vocab = result.get("vocab", {})
    n = min(max_positions, max((e["start"] + len(e["guess"]) for e in its), default=0))
    z, text, rows = [], [], []
    for e in its:
        row, labels = [None] * n, [""] * n
        for i, tok in enumerate(e["guess"]):
            pos = e["start"] + i
            if pos >= n:
                break
            row[pos] = e["probs"][i] if i < len(e["probs"]) else None
            mark = "✓" if i < e["converged"] else ""
            labels[pos] = f"{mark}{vocab.get(str(tok), tok)!r}"
        z.append(row)
        text.append(labels)
        rows.append(f"step {e['step']} · block {e['block']} it {e['iteration']}")
    xs = [f"{i}:{pieces[i]!r}" if i < len(pieces) else str(i) for i in range(n)]
    fig = go.Figure(go.Heatmap(z=z, x=xs, y=rows, text=text, hovertemplate="%{y}<br>%{x}<br>%{text}<br>"
                               "p=%{z:.3f}<extra></extra>", colorscale="Viridis", zmin=0, zmax=1,
                               colorbar={"title": "p(target)"}))
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title="Jacobi: guesses per iteration (✓ = fixed)", height=200 + 22 * len(rows),
                      template="plotly_white", margin=dict(l=160, r=20, t=50, b=120))
    return fig
