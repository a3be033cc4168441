"""The benchmark's HTML report (``python -m playground bench --html``): plotly figures of a bench document."""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go

from visualize.charts import sweep_figure


def html_report(doc: dict, path: str) -> None:
    """A self-contained plotly report: speedup per category and method, plus sweeps."""
    summary = [s for s in doc["summary"] if s["category"] != "all"]
    methods = list(dict.fromkeys(s["method"] for s in summary))
    cats = list(dict.fromkeys(s["category"] for s in summary))
    fig = go.Figure()
    for m in methods:
        ys = [next((s["speedup_geomean"] for s in summary if s["method"] == m and s["category"] == c), None)
              for c in cats]
        fig.add_bar(name=m, x=cats, y=ys)
    fig.update_layout(title="Speedup vs our greedy (geometric mean over prompts)", barmode="group",
                      yaxis_title="speedup x")
    parts = [fig.to_html(full_html=False, include_plotlyjs="cdn")]
    for sweep in doc.get("sweeps", []):
        parts.append(sweep_figure(sweep).to_html(full_html=False, include_plotlyjs=False))
    body = "\n".join(parts)
    env = doc.get("environment", {})
    Path(path).write_text(f"<html><head><meta charset='utf-8'><title>decoding bench</title></head><body>"
                          f"<h1>Decoding benchmark</h1><p>{env.get('device')} {env.get('dtype')} "
                          f"torch {env.get('torch')} transformers {env.get('transformers')}</p>{body}"
                          f"</body></html>", encoding="utf-8")

