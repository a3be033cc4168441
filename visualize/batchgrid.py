"""The batch race's view: each row's accepted length per step, and the steps a row waited for the slowest.

Reads the plain entries of ``decoding.harness.batch_race.race_batch`` (``BatchStep`` events as dicts, rows as dicts);
never imports torch. An HTML grid, one line per row and one cell per verify step: the number of drafted tokens
the target accepted there (shaded by it), or a hatched "wait" cell once the row had finished and only kept the
batch company. Every text is escaped; rows and steps are capped before anything is built.
"""

from __future__ import annotations

import html
from typing import Any, Sequence

MAX_ROWS = 8            # rows drawn (a batch holds at most this many)
MAX_STEPS = 160         # steps drawn per strategy; later ones are counted, not drawn
MAX_LABEL = 60          # characters of a row's label


def _text(value: Any, limit: int = MAX_LABEL) -> str:
    """``value`` as escaped text, cut to ``limit`` characters before escaping."""
    s = str(value)
    return html.escape(s if len(s) <= limit else s[:limit - 1] + "…", quote=True)


def _int(value: Any) -> int:
    try:
        return max(0, int(value))
    except (TypeError, ValueError, OverflowError):
        return 0


def _steps(entry: dict) -> list[dict]:
    return [e for e in entry.get("events", ())[:MAX_STEPS] if isinstance(e, dict) and e.get("type") == "BatchStep"]


def _cell(step: dict, row: int, top: int) -> str:
    waiting = {_int(w) for w in step.get("waiting", ())}
    if row in waiting:
        return '<td class="bw" title="finished: waited for the slowest row">wait</td>'
    accepted = step.get("accepted", ())
    n = _int(accepted[row]) if row < len(accepted) else 0
    shade = 0.12 + 0.78 * (n / top) if top else 0.12
    committed = step.get("committed", ())
    title = f"step {_int(step.get('step'))}: {n} accepted, " \
            f"{_int(committed[row]) if row < len(committed) else 0} committed"
    return f'<td style="background:rgba(37,99,235,{shade:.2f})" title="{_text(title, 120)}">{n}</td>'


def batch_grid_html(entry: dict, labels: Sequence[str] = ()) -> str:
    """One strategy's batch: a grid of accepted lengths (rows x steps) with each row's waited steps and verdict."""
    steps = _steps(entry)
    rows = entry.get("rows", ())[:MAX_ROWS]
    top = max((_int(a) for s in steps for a in s.get("accepted", ())[:MAX_ROWS]), default=0)
    head = "".join(f"<th>{_int(s.get('step'))}</th>" for s in steps)
    lines = []
    for i, row in enumerate(rows):
        label = labels[i] if i < len(labels) else f"row {i}"
        verdict = "= greedy" if row.get("equals_greedy") else "≠ greedy"
        cells = "".join(_cell(s, i, top) for s in steps)
        lines.append(f'<tr><th class="bl" title="{_text(label, 400)}">{_text(label)}</th>'
                     f"<td class=\"bs\">{_int(row.get('tokens'))} tok · waited {_int(row.get('waited_steps'))} · "
                     f"{_text(verdict)}</td>{cells}</tr>")
    more = len([e for e in entry.get("events", ()) if isinstance(e, dict)]) - len(steps)
    tail = f"<p>{_int(more)} later steps not drawn.</p>" if more > 0 else ""
    title = (f"{_text(entry.get('strategy', ''))}: batch of {_int(entry.get('batch'))}, "
             f"{_text(entry.get('batch_tokens_per_s'))} tok/s batched vs "
             f"{_text(entry.get('single_tokens_per_s'))} tok/s one after another "
             f"(×{_text(entry.get('throughput_ratio'))})")
    return (f'<div class="batch-race"><h4>{title}</h4><div style="overflow-x:auto"><table class="bt">'
            f"<tr><th>row</th><th>summary</th>{head}</tr>{''.join(lines)}</table></div>{tail}</div>")


STYLE = ("<style>.bt{border-collapse:collapse;font:12px monospace}.bt td,.bt th{border:1px solid #ddd;"
         "padding:2px 4px;text-align:center}.bt .bl{text-align:left;max-width:18em;overflow:hidden;"
         "white-space:nowrap}.bt .bs{white-space:nowrap}.bt .bw{background:repeating-linear-gradient(45deg,"
         "#eee,#eee 3px,#ccc 3px,#ccc 6px);color:#666}</style>")


def batch_race_html(entries: Sequence[dict], labels: Sequence[str] = ()) -> str:
    """Every strategy's grid, with the legend: a number is the drafted tokens a row accepted at that step."""
    if not entries:
        return ""
    legend = ("<p>Each cell: drafted tokens the target accepted for that row at that step (greedy drafts none). "
              "<b>wait</b>: the row had finished and waited for the slowest row.</p>")
    return STYLE + legend + "".join(batch_grid_html(e, labels) for e in entries[:8])
