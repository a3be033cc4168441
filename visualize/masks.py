"""Lookahead's 4D attention mask as a picture: which token of a step may see which. Never imports torch.

A lookahead step feeds ``pending + branch + window`` in one forward
(``decoding/strategies/lookahead.py``): the pending committed token (the *key*), the
verification branch (pool n-grams merged by common prefix into a tree) and the
2D window (``levels`` x ``width`` guesses). ``step_layout`` and ``paths_tree``
are pure-Python twins of ``decoding.lookahead.step_layout`` and
``decoding.tree.TokenTree.from_paths`` (a test holds them equal), so a traced
``LookaheadStep`` is enough to redraw the mask its forward used.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import plotly.graph_objects as go

from decoding.treeshape import depth_first, merge_paths, reorder  # pure Python; no torch

from .windows import step_at
from .tokens import LEGEND, plot_text

MAX_ROWS = 160       # queries (and keys) drawn at most: a real step has up to 1 + 32*8 + 7*32 rows, traces more
MAX_PATHS = 64       # n-grams merged into the drawn branch (a real step verifies at most 32) ...
MAX_PATH_LEN = 16    # ... and tokens of each (a real n-gram has at most 7)
MAX_LEVELS = 16      # window levels drawn when the window does not fit (a real one has at most 7)
# what a visible cell means, by the key (column) the query sees
KINDS = {            # code: (legend text, colour)
    0: ("blocked", "#ffffff"),
    1: ("sees the key (the newest committed token)", LEGEND["greedy"][1]),
    2: ("branch: sees its n-gram's earlier tokens", LEGEND["accepted"][1]),
    3: ("window: sees level 0 up to its column", LEGEND["correction"][1]),
    4: ("window: sees its own column in earlier levels", LEGEND["sample"][1]),
}


def paths_tree(paths: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
    """(tokens, parents) of paths merged by common prefix, nodes in depth-first order (``TokenTree.from_paths``)."""
    tokens, parents = merge_paths(paths)
    return reorder(tokens, parents, depth_first(parents))


def step_layout(pending: int, parents: Sequence[int], levels: int, width: int
                ) -> tuple[list[list[bool]], list[int], int]:
    """``(allowed[T][T], positions[T] relative to the key, first window row)``, as ``lookahead.step_layout``."""
    n = len(parents)
    total = pending + n + levels * width
    allowed = [[False] * total for _ in range(total)]
    rel = [0] * total
    for r in range(pending):                       # 1. pending tokens: causal
        for c in range(r + 1):
            allowed[r][c] = True
        rel[r] = r - pending + 1
    depth: list[int] = []
    for i, p in enumerate(parents):                # 2. branch nodes: pending, ancestors, themselves
        r = pending + i
        for c in range(pending):
            allowed[r][c] = True
        if p >= 0:
            allowed[r] = [a or b for a, b in zip(allowed[r], allowed[pending + p])]
        allowed[r][r] = True
        depth.append(1 if p < 0 else depth[p] + 1)
        rel[r] = depth[i]
    first = pending + n
    for lv in range(levels):                       # 3. window cells: pending, level 0 up to i, own column
        for i in range(width):
            r = first + lv * width + i
            for c in range(pending):
                allowed[r][c] = True
            for c in range(first, first + i + 1):
                allowed[r][c] = True
            for m in range(1, lv + 1):
                allowed[r][first + m * width + i] = True
            rel[r] = i + lv + 1
    return allowed, rel, first


def kinds(allowed: list[list[bool]], pending: int, first: int, width: int) -> list[list[int]]:
    """The ``KINDS`` code of every cell: what a visible key is to its query."""
    out = []
    for r, row in enumerate(allowed):
        codes = []
        for c, ok in enumerate(row):
            if not ok:
                codes.append(0)
            elif c < pending:
                codes.append(1)
            elif c < first:
                codes.append(2)
            else:
                codes.append(3 if c < first + width and r >= first else 4)
        out.append(codes)
    return out


def _text(result: dict, token: Any) -> str:
    raw = (result.get("vocab") or {}).get(str(token))
    shown = repr(raw)[1:-1] if isinstance(raw, str) else f"<{token}>"
    return plot_text(shown[:10] or "∅")


def shown_sizes(branch: int, levels: int, width: int, rows: int = MAX_ROWS) -> tuple[int, int, int]:
    """How many branch nodes, window levels and columns to draw in ``rows`` rows (one is the key).

    The window keeps up to half the rows when it needs them; a window that does not fit keeps its
    levels (at most ``MAX_LEVELS``) and the first columns of each. What is drawn is the first part of
    the step's mask: the same cells, so the picture never costs more than ``rows`` squared.
    """
    room = rows - 1
    left = room - min(branch, room - min(levels * width, room // 2))       # the window's rows
    if levels * width <= left:
        lv, w = levels, width
    else:
        lv = min(levels, MAX_LEVELS, left)
        w = min(width, left // lv)
    return min(branch, room - lv * w), lv, w                               # the branch takes what is left


def _cut_note(n_paths: int, long_path: bool, nodes: tuple[int, int], window: tuple[int, int, int, int]) -> str:
    """What the picture leaves out, in words (empty when it shows the whole step)."""
    parts = []
    if n_paths > MAX_PATHS or long_path:
        parts.append(f"branch of the first {min(n_paths, MAX_PATHS)} of {n_paths} n-grams, "
                     f"each cut to {MAX_PATH_LEN} tokens")
    if nodes[0] < nodes[1]:
        parts.append(f"first {nodes[0]} of {nodes[1]} branch nodes")
    lv, w, levels, width = window
    if (lv, w) != (levels, width):
        parts.append(f"first {w} of {width} columns of {lv} of {levels} levels")
    return ("<br>shown: " + "; ".join(parts)) if parts else ""


def mask_figure(result: dict, step: Optional[int] = None) -> Any:
    """The attention mask of the lookahead step shown at replay ``step`` (rows: queries, columns: keys).

    A step too large to draw shows the first part of its mask (``shown_sizes``) and says what it left out;
    only what is drawn is built.
    """
    e = step_at(result, step)
    fig = go.Figure()
    if e is None:
        fig.update_layout(title="No lookahead step yet", height=260, template="plotly_white")
        return fig
    levels_all = [lv for lv in e.get("window") or () if lv]
    width = min((len(lv) for lv in levels_all), default=0)
    paths = e.get("candidates") or ()
    tokens, parents = paths_tree([p[:MAX_PATH_LEN] for p in paths[:MAX_PATHS]])
    nb, lv, w = shown_sizes(len(tokens), len(levels_all), width)
    window = [levels_all[v][:w] for v in range(lv)]
    out = result.get("token_ids") or []
    pos = int(e.get("position", 0))
    key = out[pos - 1] if 0 < pos <= len(out) else None
    allowed, rel, first = step_layout(1, parents[:nb], lv, w)
    labels = ["key " + (_text(result, key) if key is not None else "")]
    labels += [f"b{i} {_text(result, t)}" for i, t in enumerate(tokens[:nb])]
    labels += [f"L{v}c{i} {_text(result, window[v][i])}" for v in range(lv) for i in range(w)]
    labels = [f"{lab} @{rel[i]:+d}" for i, lab in enumerate(labels)]
    z = kinds(allowed, 1, first, w)
    k = len(KINDS)
    scale = [[edge, colour] for code, (_, colour) in KINDS.items() for edge in (code / k, (code + 1) / k)]
    fig.add_heatmap(z=z, x=labels, y=labels, colorscale=scale, zmin=-0.5, zmax=k - 0.5, showscale=False,
                    xgap=1, ygap=1, customdata=[[KINDS[c][0] for c in row] for row in z],
                    hovertemplate="query %{y}<br>key %{x}<br>%{customdata}<extra></extra>")
    legend = " · ".join(f"<span style='color:{c}'>■</span> {t}" for code, (t, c) in KINDS.items() if code)
    cut = _cut_note(len(paths), any(len(p) > MAX_PATH_LEN for p in paths[:MAX_PATHS]), (nb, len(tokens)),
                    (lv, w, len(levels_all), width))
    fig.update_xaxes(side="top", tickangle=-60, tickfont={"size": 9})
    fig.update_yaxes(autorange="reversed", tickfont={"size": 9})
    size = len(labels)
    fig.update_layout(title=dict(text=f"Lookahead attention mask at step {int(e.get('step', 0))}: 1 key + "
                                      f"{len(tokens)} branch + {len(levels_all)}×{width} window tokens "
                                      f"(@: position after the key){cut}<br><sup>{legend}</sup>", y=0.98),
                      height=260 + 18 * size, template="plotly_white", margin=dict(l=130, r=20, t=190, b=20))
    return fig
