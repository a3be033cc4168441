"""Plotly figures from result dicts (the ``RunResult.to_dict()`` shape). Never imports torch.

The figures drawn for every run and import are built from plain dicts (``figure``): the same JSON as plotly's
validating setters write, at a tenth of the cost.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

from .tokens import LEGEND, number, plot_text

_PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"]
MAX_BARS = 2000   # forward passes drawn per strategy and model (a trace can hold far more) ...
MAX_TIMELINE = 8000   # ... and over the whole figure (16 imported strategies share it)
MAX_MODELS = 2    # rows per strategy: target and draft (an unchecked result may name more; they are left out)
MAX_SWEEP_VALUES = 64   # distinct values drawn per swept parameter (the app sweeps at most 12 settings)


def _name(r: dict) -> str:
    return plot_text(r.get("label") or r.get("strategy", "?")) + (" (ref)" if r.get("reference") else "")


@functools.lru_cache(maxsize=1)
def _white() -> dict:
    """The ``plotly_white`` template as plain data (what validating ``template="plotly_white"`` inlines; a figure
    copies it, so the cached one is never changed)."""
    return pio.templates["plotly_white"].to_plotly_json()


MARGIN = {"l": 40, "r": 20, "t": 50, "b": 40}


def figure(data: list, layout: dict) -> Any:
    """A figure from plain trace and layout dicts written as plotly's validators write them (titles as
    ``{"text": ...}``, ``marker: {"color": ...}``, ``template: "plotly_white"`` inlined), built without
    validating them property by property (which cost more than the drawing). ``tests/test_import_speed.py``
    holds each figure to the JSON a validated build of it writes."""
    layout = dict(layout)
    if layout.get("template") == "plotly_white":
        layout["template"] = _white()
    return go.Figure({"data": data, "layout": layout}, _validate=False)


def _layout(title: str, height: int, **more: Any) -> dict:
    return {"title": {"text": title}, "height": height, "margin": MARGIN, "template": "plotly_white", **more}


def speed_chart(results: list[dict]) -> Any:
    """Tokens/s per strategy, annotated with the speedup against greedy."""
    ok = [r for r in results if not r.get("error")]
    names = [_name(r) for r in ok]
    bar = {"type": "bar", "x": names, "y": [r.get("tokens_per_s") or 0 for r in ok],
           "marker": {"color": [_PALETTE[i % len(_PALETTE)] for i in range(len(ok))]},
           "text": [("–" if number(r.get("speedup"), None) is None else f"{r['speedup']:.2f}× greedy") for r in ok],
           "textposition": "outside", "hovertemplate": "%{x}<br>%{y:.1f} tok/s<br>%{text}<extra></extra>"}
    top = max([r.get("tokens_per_s") or 0 for r in ok] + [1e-9])
    return figure([bar], _layout("Tokens per second (label: speedup vs greedy)", 340,
                                 yaxis={"range": [0, top * 1.25], "title": {"text": "tokens / s"}}))


def forward_timeline(results: list[dict]) -> Any:
    """Every forward pass along wall-clock time, one row per strategy, target vs draft.

    One bar trace per (strategy, model) holds all of its passes, so the figure
    stays light with hundreds of forwards; beyond ``MAX_BARS`` per row the rest
    are left out (the title says so).
    """
    traces = []
    colours = {"target": "#0072B2", "draft": "#E69F00"}
    shown = set()
    cut = False
    per_row = min(MAX_BARS, max(1, MAX_TIMELINE // (MAX_MODELS * max(1, len(results)))))
    for r in results:
        t = 0.0
        bars: dict[str, dict[str, list]] = {}
        for e in r.get("events", ()):
            if e.get("type") != "ForwardPass":
                continue
            model = e.get("model", "target")
            b = bars.get(model)
            if b is None and len(bars) < MAX_MODELS:
                b = bars[model] = {"x": [], "base": [], "text": []}
            if b is None or len(b["x"]) >= per_row:
                cut = True
                continue
            b["x"].append(e["ms"])
            b["base"].append(t)
            b["text"].append(plot_text(f"{e.get('kind', '')}: {e['positions']} positions, {e['ms']:.1f} ms "
                                       f"(step {e['step']})"))
            t += e["ms"]
        for model, b in bars.items():
            traces.append({"type": "bar", "y": [_name(r)] * len(b["x"]), "x": b["x"], "base": b["base"],
                           "orientation": "h", "name": model, "marker": {"color": colours.get(model, "#999999")},
                           "showlegend": model not in shown, "customdata": b["text"],
                           "hovertemplate": f"{plot_text(model)} %{{customdata}}<extra></extra>"})
            shown.add(model)
    title = "Forward passes along wall-clock time" + (f" (first {per_row} per row)" if cut else "")
    return figure(traces, _layout(title, 120 + 40 * max(1, len(results)), barmode="overlay",
                                  xaxis={"title": {"text": "milliseconds (sum of forward time)"}}))


def time_breakdown(results: list[dict]) -> Any:
    """"Why no speedup?": draft time, target (verify) time and overhead per generated token.

    Target and draft times are the sums of their forward passes; overhead is the
    rest of the wall time (sampling, verification logic, tracing, Python).
    """
    ok = [r for r in results if not r.get("error") and r.get("token_ids")]
    names = [_name(r) for r in ok]
    parts: dict[str, list[float]] = {"draft forwards": [], "target forwards": [], "overhead": []}
    for r in ok:
        n = len(r["token_ids"])
        ms = {"target": 0.0, "draft": 0.0}
        for e in r.get("events", ()):
            if e.get("type") == "ForwardPass":
                ms[e.get("model", "target")] = ms.get(e.get("model", "target"), 0.0) + float(e["ms"])
        wall = float(r.get("wall_s") or 0.0) * 1e3
        parts["draft forwards"].append(ms["draft"] / n)
        parts["target forwards"].append(ms["target"] / n)
        parts["overhead"].append(max(0.0, wall - ms["target"] - ms["draft"]) / n)
    traces = [{"type": "bar", "x": names, "y": values, "name": label, "marker": {"color": colour},
               "hovertemplate": "%{x}: %{y:.1f} ms per token<extra>" + label + "</extra>"}
              for (label, values), colour in zip(parts.items(), ("#E69F00", "#0072B2", "#999999"))]
    return figure(traces, _layout("Why (no) speedup: milliseconds per generated token", 340, barmode="stack",
                                  yaxis={"title": {"text": "ms / token"}}))


def has_prediction(result: dict) -> bool:
    return not result.get("error") and number((result.get("stats") or {}).get("predicted_speedup"), None) is not None


def leviathan_chart(results: list[dict]) -> Any:
    """Speedup predicted by Leviathan et al. (E / (gamma c + 1), from measured alpha, gamma, c) vs measured."""
    ok = [r for r in results if has_prediction(r)]
    names = [_name(r) for r in ok]
    predicted = [r["stats"]["predicted_speedup"] for r in ok]
    measured = [number(r.get("speedup")) for r in ok]
    detail = [f"alpha {number(r['stats'].get('alpha')):.2f}, gamma {number(r['stats'].get('gamma')):.1f}, "
              f"c {number(r['stats'].get('cost_ratio')):.3f}" for r in ok]
    traces = [{"type": "bar", "x": names, "y": predicted, "name": "predicted E/(γc+1)",
               "marker": {"color": "#56B4E9"}, "customdata": detail,
               "hovertemplate": "%{x}: %{y:.2f}× predicted<br>%{customdata}<extra></extra>"},
              {"type": "bar", "x": names, "y": measured, "name": "measured", "marker": {"color": "#009E73"},
               "hovertemplate": "%{x}: %{y:.2f}× measured<extra></extra>"}]
    one = {"type": "line", "xref": "x domain", "x0": 0, "x1": 1, "yref": "y", "y0": 1.0, "y1": 1.0,
           "line": {"dash": "dot", "color": "#666666"}}            # add_hline(y=1.0) as plotly writes it
    return figure(traces, _layout("Leviathan-predicted vs measured speedup", 340, barmode="group",
                                  yaxis={"title": {"text": "× greedy"}}, shapes=[one]))


def source_counts(results: list[dict]) -> Any:
    """How each strategy's tokens were produced (stacked), coloured by the shared legend."""
    names = [_name(r) for r in results]
    tallies = [Counter(e.get("source") for e in r.get("events", ()) if e.get("type") == "TokenCommitted")
               for r in results]                                    # one pass over each result's events
    traces = []
    for source, (label, colour) in LEGEND.items():
        counts = [tally.get(source, 0) for tally in tallies]
        if any(counts):
            traces.append({"type": "bar", "x": names, "y": counts, "name": label, "marker": {"color": colour}})
    return figure(traces, _layout("Where the tokens came from", 320, barmode="stack",
                                  yaxis={"title": {"text": "tokens"}}))


def _order(value: Any) -> tuple:
    """Sort key for swept values: numbers by value, then words (``true``, a variant name)."""
    return (1, str(value), 0.0) if isinstance(value, str) else (0, "", float(value))


def sweep_figure(sweep: dict) -> Any:
    """Speedup over a parameter sweep: a curve for one parameter, a heatmap for two (best over the rest).

    ``sweep``: ``{"strategy", "keys": [k1, ...], "points": [{"values": [v1, ...], "speedup",
    "tokens_per_target_forward"}]}``, as the benchmark and the app's sweep write it.
    """
    keys, points = sweep["keys"], sweep["points"]
    keys = [plot_text(k) for k in keys]
    title = f"{plot_text(sweep['strategy'])}: speedup over greedy"
    fig = go.Figure()
    if len(keys) == 1:
        xs = [p["values"][0] for p in points]
        fig.add_scatter(x=xs, y=[p["speedup"] for p in points], mode="lines+markers", name="speedup vs greedy",
                        line={"color": "#009E73"})
        fig.add_scatter(x=xs, y=[p.get("tokens_per_target_forward") for p in points], mode="lines+markers",
                        name="tokens per target forward", line={"color": "#0072B2", "dash": "dash"})
        fig.add_hline(y=1.0, line_dash="dot", line_color="#666666")
        fig.update_layout(title=title, xaxis_title=keys[0], yaxis_title="×")
    else:
        xs = sorted({p["values"][0] for p in points}, key=_order)
        ys = sorted({p["values"][1] for p in points}, key=_order)
        best: dict[tuple, float] = {}                # one pass over the points, not one per cell
        for p in points:
            cell = (p["values"][0], p["values"][1])
            best[cell] = max(best.get(cell, p["speedup"]), p["speedup"])
        cut = "" if len(xs) <= MAX_SWEEP_VALUES and len(ys) <= MAX_SWEEP_VALUES else \
            f" (the first {min(len(xs), MAX_SWEEP_VALUES)} × {min(len(ys), MAX_SWEEP_VALUES)} values)"
        xs, ys = xs[:MAX_SWEEP_VALUES], ys[:MAX_SWEEP_VALUES]
        z = [[best.get((x, y)) for x in xs] for y in ys]
        fig.add_heatmap(x=[plot_text(x) for x in xs], y=[plot_text(y) for y in ys], z=z, colorscale="Viridis",
                        colorbar={"title": "× greedy"}, texttemplate="%{z:.2f}")
        rest = f" (best over {', '.join(keys[2:])})" if len(keys) > 2 else ""
        fig.update_layout(title=title + rest + cut, xaxis_title=keys[0], yaxis_title=keys[1])
    fig.update_layout(height=360, template="plotly_white", margin=dict(l=40, r=20, t=50, b=40))
    return fig
