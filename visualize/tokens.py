"""Token-level replay frames: result dicts in, HTML out. Never imports torch.

A result dict is the JSON shape of ``decoding.runner.RunResult.to_dict()``.
Every event carries ``step`` (target forwards done), the replay clock: the
frame at step ``s`` shows what each strategy had committed after ``s`` target
forward passes, plus the drafts the target rejected on the way (struck through
where they were proposed).
"""

from __future__ import annotations

import html
import math
from typing import Any, Iterable

# One legend for every view (Okabe–Ito palette, safe for colour-blind viewers).
LEGEND: dict[str, tuple[str, str]] = {
    "greedy": ("greedy step", "#56B4E9"),
    "sample": ("sampled", "#CC79A7"),
    "beam": ("beam search", "#0072B2"),
    "accepted": ("accepted draft", "#009E73"),
    "rejected": ("rejected draft", "#D55E00"),
    "correction": ("correction", "#E69F00"),
    "bonus": ("bonus token", "#F0E442"),
    "jacobi": ("Jacobi-converged", "#999999"),
    "ngram": ("n-gram hit", "#000000"),
    "suffix": ("suffix-tree draft", "#7B3294"),
}


def _tint(hex_colour: str, alpha: float = 0.28) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def show_text(piece: str) -> str:
    """Escape a token's text for HTML, keeping whitespace visible and faithful."""
    if piece == "":
        return "<span class='dp-empty'>∅</span>"
    out = html.escape(piece).replace(" ", "&nbsp;").replace("\t", "⇥&nbsp;")
    return out.replace("\n", "<span class='dp-nl'>↵</span><br>")


def plot_text(value: Any) -> str:
    """Text for a plotly label: plotly draws a few HTML tags and decodes entities, so escape the markup."""
    return str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def number(value: Any, default: float | None = 0.0) -> float | None:
    """``value`` as a float for formatting, ``default`` when it is not a number (or is a bool). A JSON
    integer too large for a float is plus or minus infinity (``float()`` would raise OverflowError)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return default
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


# What one replay frame draws at most, over all columns together: a frame is
# rebuilt on every slider move, so its cost must not grow with the trace.
MAX_FRAME_ITEMS = 6144
MIN_COLUMN_ITEMS = 256
MAX_PIECE = 80        # characters of one token drawn (a real token is rarely longer than 30)
MAX_PARAMS = 300      # characters of a column's parameter line


_NUMBER_TYPES = frozenset((int, float))


def max_step(result: dict) -> int:
    return max((int(e.get("step", 0)) for e in result.get("events", ())), default=0)


def event_times(result: dict) -> list[float]:
    """When each event happened, in ms since the strategy's run started.

    The runner records ``times_ms`` (one per event); a trace without them (older
    versions) falls back to the cumulative time of its forward passes, so each
    event is placed after the forwards recorded before it.
    """
    events = result.get("events") or ()
    times = result.get("times_ms")
    if isinstance(times, list) and len(times) == len(events) and set(map(type, times)) <= _NUMBER_TYPES:
        return list(map(float, times))         # numbers, never bools (type(True) is bool)
    out, clock = [], 0.0
    for e in events:
        if e.get("type") == "ForwardPass":
            clock += max(number(e.get("ms")) or 0.0, 0.0)
        out.append(clock)
    return out


def duration_ms(result: dict) -> float:
    """How long the strategy ran: its wall time, else the time of its last event."""
    wall = number(result.get("wall_s"), None)
    if wall is not None and wall > 0:
        return wall * 1e3
    times = event_times(result)
    return times[-1] if times else 0.0


def _vocab_text(result: dict, token: int) -> str:
    return result.get("vocab", {}).get(str(token), f"<{token}>")


def _gather(result: dict, step: int | None, at_ms: float | None) -> tuple[dict[int, dict], dict[int, list]]:
    """The events drawn at ``step`` (or ``at_ms``): the last commit per position, the rejected drafts per position."""
    events = result.get("events", ())
    if at_ms is not None:
        events = [e for e, t in zip(events, event_times(result)) if not t > at_ms]
    if step is not None:
        events = [e for e in events if not e.get("step", 0) > step]
    committed: dict[int, dict] = {}
    rejected: dict[int, list[dict]] = {}
    for e in events:
        kind = e.get("type")
        if kind == "TokenCommitted":
            committed[int(e["position"])] = e
        elif kind == "TokenVerified" and not e.get("accepted"):
            rejected.setdefault(int(e["position"]), []).append(e)
    return committed, rejected


def _items(result: dict, step: int | None, at_ms: float | None, limit: int | None) -> tuple[list[dict], int]:
    """The newest ``limit`` items to draw (all: None) and how many earlier ones there are.

    Only the drawn items are built, walking back from the newest position: a frame costs what it shows,
    however long the run.
    """
    pieces = result.get("pieces") or []
    committed, rejected = _gather(result, step, at_ms)
    order: list[tuple[int, Any, str]] = []        # (position, event or token id, what), newest last
    if step is None and at_ms is None and not committed and result.get("token_ids"):
        # a trace without events (or a failed run) still shows its tokens
        order = [(pos, e, "rejected") for pos in sorted(rejected) for e in rejected[pos]]
        order.extend((pos, tok, "token") for pos, tok in enumerate(result["token_ids"]))
        total = len(order)
        hidden = 0 if limit is None else max(0, total - limit)
        order = order[hidden:]
    else:
        total = len(committed) + sum(map(len, rejected.values()))
        hidden = 0 if limit is None else max(0, total - limit)
        for pos in sorted(set(committed) | set(rejected), reverse=True):   # newest first, until enough
            if len(order) >= total - hidden:
                break
            if pos in committed:
                order.append((pos, committed[pos], "committed"))
            order.extend((pos, e, "rejected") for e in reversed(rejected.get(pos, ())))
        del order[total - hidden:]
        order.reverse()
    items = []
    for pos, e, what in order:
        if what == "rejected":
            items.append({"text": _vocab_text(result, e["token"]), "token": e["token"], "source": "rejected",
                          "position": pos, "prob": e.get("p_target"), "step": e["step"], "struck": True})
        elif what == "committed":
            text = pieces[pos] if 0 <= pos < len(pieces) else _vocab_text(result, e["token"])
            items.append({"text": text, "token": e["token"], "source": e["source"], "position": pos,
                          "prob": e.get("prob"), "step": e["step"], "struck": False})
        else:
            text = pieces[pos] if pos < len(pieces) else _vocab_text(result, e)
            items.append({"text": text, "token": e, "source": "greedy", "position": pos, "prob": None,
                          "step": 0, "struck": False})
    return items, hidden


def token_items(result: dict, step: int | None = None, at_ms: float | None = None) -> list[dict]:
    """Ordered items to draw at ``step`` (or at ``at_ms`` of the run's wall clock): committed
    tokens and rejected drafts.

    Each item: {"text", "token", "source", "position", "prob", "step", "struck"}.
    """
    return _items(result, step, at_ms, None)[0]


def highlighted(result: dict, step: int | None = None) -> list[tuple[str, str | None]]:
    """``gr.HighlightedText`` value: [(text, label)]."""
    return [(it["text"], LEGEND.get(it["source"], (it["source"], ""))[0]) for it in token_items(result, step)]


def _prob_text(prob: Any) -> str:
    return "" if number(prob, None) is None else f", p={prob:.3f}"


def tokens_html(result: dict, step: int | None = None, limit: int | None = None,
                at_ms: float | None = None) -> str:
    """The tokens at ``step`` (or ``at_ms``) as coloured spans; with ``limit``, only the newest ``limit`` items.

    A token longer than ``MAX_PIECE`` characters shows its start, marked … (its title says how long it is).
    """
    items, hidden = _items(result, step, at_ms, limit)
    spans = [f"<span class='dp-muted'>… {hidden} earlier items not shown …</span> "] if hidden else []
    diff = result.get("first_divergence")        # marked: the first token that differs from greedy's
    diff = diff if isinstance(diff, int) and not isinstance(diff, bool) else None
    for it in items:
        label = LEGEND.get(it["source"], (it["source"], ""))[0]
        text = str(it["text"])
        cut = f" ({len(text)} characters, the first {MAX_PIECE} shown)" if len(text) > MAX_PIECE else ""
        first = not it["struck"] and it["position"] == diff
        title = html.escape(f"#{it['position']} id {it['token']}: {label}{_prob_text(it['prob'])} "
                            f"(step {it['step']}){cut}" + (" · the first token that differs from greedy's"
                                                           if first else ""), quote=True)
        cls = "dp-tok dp-struck" if it["struck"] else "dp-tok dp-diff" if first else "dp-tok"
        source = html.escape(str(it["source"]), quote=True)   # its colour comes from CSS (TOKEN_CSS)
        spans.append(f"<span class='{cls}' data-source='{source}' title='{title}'>"
                     f"{show_text(text[:MAX_PIECE] + '…' if cut else text)}</span>")
    return "".join(spans) or "<span class='dp-muted'>(nothing yet)</span>"


def legend_html(sources: Iterable[str] | None = None) -> str:
    keys = list(sources) if sources is not None else list(LEGEND)
    chips = [f"<span class='dp-chip' style='background:{_tint(LEGEND[k][1])};border-bottom:3px solid "
             f"{LEGEND[k][1]}'>{html.escape(LEGEND[k][0])}</span>" for k in keys if k in LEGEND]
    return "<div class='dp-legend'>" + "".join(chips) + "</div>"


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    return f"{value:.{digits}f}" if isinstance(value, float) else html.escape(str(value))


def lossy_html(result: dict) -> str:
    """What a lossy run (relaxed acceptance) changed: the tokens that differ from greedy's and where the first
    is (temperature 0), or the mean log-probability of its tokens under the target (sampling)."""
    differ, first = number(result.get("differing_tokens"), None), result.get("first_divergence")
    logprob = number(result.get("target_logprob"), None)
    if differ is not None:
        n = len(result.get("token_ids") or ())
        where = "" if first is None else f", the first at position {first} (marked)"
        text = (f"lossy: {differ:.0f} of {n} tokens differ from greedy's{where}" if differ
                else "lossy: the same tokens as greedy")
    elif logprob is not None:
        text = f"lossy: mean log p of its tokens under the target {logprob:.3f}"
    else:
        text = "lossy: no greedy reference to compare with"
    return f"<span class='dp-lossy-note'>{html.escape(text)}</span>"


def lossy_badge(result: dict) -> str:
    """The column title's badge for a lossy run, naming its acceptance rule (escaped: a trace may be imported)."""
    if not result.get("lossy"):
        return ""
    rule = str((result.get("params") or {}).get("acceptance", "relaxed"))[:32]
    tip = html.escape(f"acceptance={rule}: accepts drafted tokens the exact rule would reject "
                      f"(more tokens per forward, not greedy's tokens)", quote=True)
    return f" <span class='dp-lossy' title='{tip}'>lossy · {html.escape(rule)}</span>"


def verdict_html(result: dict) -> str:
    if result.get("error"):
        return f"<span class='dp-bad'>{html.escape(str(result['error']))}</span>"
    if result.get("lossy"):
        return lossy_html(result)
    if not result.get("lossless"):
        return "<span class='dp-muted'>not lossless (no check)</span>"
    if result.get("matches_greedy") is True:
        return "<span class='dp-good'>✓ identical to greedy</span>"
    if result.get("matches_greedy") is False:
        margin = result.get("divergence_margin")
        why = f"; top-2 logit margin there {margin:.4g}" if isinstance(margin, (int, float)) else ""
        where = html.escape(str(result.get("first_divergence")))
        return f"<span class='dp-bad'>✗ diverges at position {where}{html.escape(why)}</span>"
    return "<span class='dp-muted'>no greedy reference</span>"


def stats_html(result: dict) -> str:
    n = len(result.get("token_ids") or [])
    cells = [("tokens", n), ("seconds", _fmt(result.get("wall_s"))), ("tok/s", _fmt(result.get("tokens_per_s"))),
             ("speedup", _fmt(result.get("speedup"))), ("target fwd", result.get("target_forwards")),
             ("draft fwd", result.get("draft_forwards"))]
    stats = result.get("stats") or {}
    for key in ("alpha", "mean_tokens_per_target_forward", "step_compression"):
        if isinstance(stats.get(key), (int, float)):
            cells.append((key.replace("mean_tokens_per_target_forward", "tok/fwd"), _fmt(float(stats[key]))))
    body = "".join(f"<div><b>{html.escape(str(v))}</b><small>{html.escape(k)}</small></div>" for k, v in cells)
    return f"<div class='dp-stats'>{body}</div><div class='dp-verdict'>{verdict_html(result)}</div>"


def _clock_line(result: dict, top: int, at_ms: float) -> tuple[str, bool]:
    """The step line of a column at ``at_ms`` of the wall-clock replay, and whether it has finished."""
    times, events = event_times(result), result.get("events") or ()
    shown = max((int(e.get("step", 0)) for e, t in zip(events, times) if t <= at_ms), default=0)
    total = duration_ms(result)
    done = at_ms >= total
    line = f"step {shown} / {top} · {min(at_ms, total) / 1e3:.2f} s of {total / 1e3:.2f} s"
    return line + (" · <b class='dp-flag'>finished</b>" if done else ""), done


def _live_line(result: dict) -> str:
    if result.get("waiting"):
        return "waiting for its turn"
    if result.get("warming"):
        return "<b class='dp-now'>warming up</b> (untimed)"
    n = len(result.get("token_ids") or ())
    return (f"<b class='dp-now'>running now</b> · {n} token{'s' * (n != 1)} · "
            f"{number(result.get('elapsed_s')) or 0.0:.1f} s")


def _params_line(params: dict, limit: int = MAX_PARAMS) -> str:
    """``k=v, ...`` cut to ``limit`` characters (…), built no further than that."""
    parts, size = [], 0
    for k, v in params.items():
        part = f"{str(k)[:limit]}={str(v)[:limit]}"
        parts.append(part)
        size += len(part) + 2
        if size > limit:
            return ", ".join(parts)[:limit] + "…"
    return ", ".join(parts)


def column_html(result: dict, step: int | None = None, limit: int | None = None,
                at_ms: float | None = None) -> str:
    """One strategy's column at ``step`` (or at ``at_ms`` of the wall-clock replay).

    A live result (``"running"`` or ``"waiting"`` set, ``decoding.live.Live``) is drawn
    as it stands, marked, without final statistics.
    """
    title = html.escape(str(result.get("label") or result.get("strategy", "?")))
    if result.get("reference"):
        title += " <small>(reference)</small>"
    title += lossy_badge(result)
    params = _params_line(result.get("params") or {})
    top = max_step(result)
    live = bool(result.get("running") or result.get("waiting"))
    state, footer = "", stats_html(result)
    if live:
        line = _live_line(result)
        state, footer = (" dp-waiting" if result.get("waiting") else " dp-running"), ""
    elif at_ms is not None:
        line, done = _clock_line(result, top, at_ms)
        state, footer = (" dp-finished", footer) if done else ("", "")
    else:
        line = f"step {top if step is None else min(step, top)} / {top}"
    body = "" if result.get("waiting") else tokens_html(result, None if live else step, limit, at_ms)
    return (f"<div class='dp-col{state}' data-strategy='{html.escape(str(result.get('strategy', '')), quote=True)}'>"
            f"<div class='dp-title'>{title}</div>"
            f"<div class='dp-params'>{html.escape(params) or '&nbsp;'}</div>"
            f"<div class='dp-step'>{line}</div>"
            f"<div class='dp-tokens'>{body}</div>{footer}</div>")


CSS = """
.dp-grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(260px,1fr));gap:12px}
.dp-col{border:1px solid #d0d7de;border-radius:10px;padding:10px;background:#fff;color:#1f2328}
.dp-title{font-weight:700;font-size:1.05em}.dp-params,.dp-step{font-size:.8em;color:#57606a}
.dp-tokens{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.9em;line-height:1.9;margin:8px 0;
  max-height:420px;overflow:auto;word-break:break-word}
.dp-tok{padding:1px 0;margin-right:1px;border-radius:3px}.dp-struck{text-decoration:line-through;opacity:.8}
.dp-nl{color:#8c959f}.dp-empty{color:#8c959f}.dp-muted{color:#8c959f}
.dp-stats{display:flex;flex-wrap:wrap;gap:10px}.dp-stats div{display:flex;flex-direction:column;min-width:52px}
.dp-stats small{color:#57606a;font-size:.75em}.dp-verdict{margin-top:6px;font-size:.85em}
.dp-good{color:#1a7f37;font-weight:600}.dp-bad{color:#cf222e;font-weight:600}
.dp-legend{display:flex;flex-wrap:wrap;gap:6px;margin:4px 0}.dp-chip{padding:2px 8px;border-radius:4px;font-size:.85em;color:#1f2328}
.dp-running{border:2px solid #0072B2;box-shadow:0 0 0 3px rgba(0,114,178,.15)}.dp-now{color:#0072B2}
.dp-waiting{opacity:.55}.dp-finished{border:2px solid #009E73}.dp-flag{color:#1a7f37}
.dp-lossy{font-size:.75em;font-weight:600;color:#fff;background:#D55E00;border-radius:4px;padding:1px 6px}
.dp-lossy-note{color:#D55E00;font-weight:600}.dp-diff{outline:2px solid #D55E00;outline-offset:1px}
"""


def _sources(results: list[dict]) -> set:
    """The legend entries the columns use (what ``token_items`` would colour), from one pass over the events."""
    used: set = set()
    for r in results:
        committed = {e.get("source") for e in r.get("events", ()) if e.get("type") == "TokenCommitted"}
        used |= committed
        if any(e.get("type") == "TokenVerified" and not e.get("accepted") for e in r.get("events", ())):
            used.add("rejected")
        if r.get("token_ids") and not committed:
            used.add("greedy")    # drawn as greedy tokens when a result has no events
    return used


# one rule per source instead of a style attribute on every token: a frame of thousands of tokens stays small
TOKEN_CSS = (f".dp-tok{{background:{_tint('#999999')};border-bottom:3px solid #999999}}"
             + "".join(f".dp-tok[data-source='{k}']{{background:{_tint(c)};border-bottom:3px solid {c}}}"
                       for k, (_, c) in LEGEND.items()))


def columns_html(results: list[dict], step: int | None = None, max_items: int = MAX_FRAME_ITEMS,
                 at_ms: float | None = None) -> str:
    """All strategies side by side at one replay step (or at ``at_ms`` of the wall clock),
    at most ``max_items`` tokens over all columns."""
    if not results:
        return "<div class='dp-muted'>Run a comparison (or import a trace) to see it here.</div>"
    used = _sources(results)
    legend = legend_html([k for k in LEGEND if k in used])
    per_column = max(MIN_COLUMN_ITEMS, max_items // len(results))
    cols = "".join(column_html(r, step, per_column, at_ms) for r in results)
    return f"<style>{CSS}{TOKEN_CSS}</style>{legend}<div class='dp-grid'>{cols}</div>"
