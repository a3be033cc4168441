"""Where model-free drafts came from: ``DraftSource`` events as HTML. Never imports torch.

A result dict is ``RunResult.to_dict()``. Suffix decoding and prompt lookup copy
their drafts from earlier text: the prompt, the output so far, or (suffix
decoding) an earlier output kept in the session's history. Each draft step
records a ``DraftSource``: a window of that text with the match (the earlier
occurrence of the context's last tokens) and the copied continuation. This view
lists them, newest first, with the match highlighted and the copied tokens the
target accepted set apart from the rejected ones; a summary line counts drafts
and accepted tokens per text. Every value that reaches HTML is escaped.
"""

from __future__ import annotations

import html
from typing import Any, Optional

from .tokens import LEGEND, _tint, number, show_text

TEXTS = {"prompt": "the prompt", "output": "the output so far", "history": "an earlier output"}
MAX_ROWS = 40             # drafts listed at most (the newest)
MAX_WINDOW = 96           # tokens of one window drawn at most
MAX_PIECE = 24            # characters of one token drawn (longer ones end in …)
MATCH = "#E69F00"         # the matched tokens (the legend's correction orange)


def _int(value: Any, default: int = 0) -> int:
    v = number(value, None)
    return int(v) if v is not None and v == int(v) else default


def _accepted(events: Any, steps: set) -> dict[int, list]:
    """step -> the target's accepted drafted tokens at that step, in order (only for ``steps``):
    a ``DraftTree``'s accepted path, or the chain's accepted ``TokenVerified`` tokens."""
    accepted: dict[int, list] = {}
    for e in events:
        kind = e.get("type")
        if kind == "DraftTree" and _int(e.get("step")) in steps:
            toks = e.get("tokens") or ()
            accepted[_int(e.get("step"))] = [toks[a] for a in (e.get("accepted") or ())
                                             if isinstance(a, int) and 0 <= a < len(toks)]
        elif kind == "TokenVerified" and e.get("accepted") is True and _int(e.get("step")) in steps:
            accepted.setdefault(_int(e.get("step")), []).append(e.get("token"))
    return accepted


def _item(e: dict, accepted: dict[int, list], window: Optional[int] = MAX_WINDOW) -> dict:
    """One ``DraftSource`` as drawn: its first ``window`` tokens, and how many copied ones were kept."""
    s = _int(e.get("step"))
    tokens = [t for t in (e.get("tokens") or ()) if isinstance(t, int) and not isinstance(t, bool)]
    m1, copied = _int(e.get("match_at")) + _int(e.get("match_len")), _int(e.get("copied"))
    return {"step": s, "position": _int(e.get("position")), "text": e.get("text") if e.get("text") in TEXTS
            else "prompt", "item": _int(e.get("item"), -1), "start": _int(e.get("start")),
            "tokens": tokens[:window], "match_at": _int(e.get("match_at")), "match_len": _int(e.get("match_len")),
            "copied": copied, "occurrences": _int(e.get("occurrences"), 1), "nodes": _int(e.get("nodes")),
            "accepted": len(accepted.get(s, ())), "kept": _common(tokens[m1:m1 + copied], accepted.get(s, ()))}


def _sources(result: dict, step: Optional[int]) -> list[dict]:
    return [e for e in result.get("events", ()) or () if e.get("type") == "DraftSource"
            and (step is None or _int(e.get("step")) <= step)]


def has_sources(result: dict) -> bool:
    return any(e.get("type") == "DraftSource" for e in result.get("events", ()) or ())


def draft_sources(result: dict, step: Optional[int] = None, newest: Optional[int] = None) -> list[dict]:
    """The ``DraftSource`` events up to ``step`` (all: None), the ``newest`` of them (all: None), each with
    how many copied tokens were accepted.

    Each item: ``{step, position, text, item, start, tokens, match_at, match_len, copied, occurrences,
    nodes, accepted, kept}``: ``accepted`` counts the target's accepted tokens at that step (chains: the
    ``TokenVerified`` events; trees: the ``DraftTree``'s accepted path), ``kept`` how many of the copied
    tokens they are (fewer when a tree's other branch won). ``tokens`` holds the first ``MAX_WINDOW``.
    """
    events = _sources(result, step)
    chosen = events if newest is None else events[max(0, len(events) - newest):]
    accepted = _accepted(result.get("events", ()) or (), {_int(e.get("step")) for e in chosen})
    return [_item(e, accepted) for e in chosen]


def _tally(result: dict, step: Optional[int]) -> tuple[dict[str, tuple[int, int]], int]:
    """:func:`source_counts` of every draft up to ``step`` and how many there are, without building items."""
    events = _sources(result, step)
    accepted = _accepted(result.get("events", ()) or (), {_int(e.get("step")) for e in events})
    counts: dict[str, tuple[int, int]] = {}
    for e in events:
        it = _item(e, accepted, window=0)
        d, a = counts.get(it["text"], (0, 0))
        counts[it["text"]] = (d + 1, a + it["kept"])
    return counts, len(events)


def _common(a: list, b: Any) -> int:
    """Length of the common prefix of ``a`` and ``b``: the copied tokens the target accepted."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def source_counts(items: list[dict]) -> dict[str, tuple[int, int]]:
    """text -> (drafts copied from it, accepted tokens copied from it)."""
    counts: dict[str, tuple[int, int]] = {}
    for it in items:
        d, a = counts.get(it["text"], (0, 0))
        counts[it["text"]] = (d + 1, a + it["kept"])
    return counts


def _piece(result: dict, token: int) -> str:
    raw = (result.get("vocab") or {}).get(str(token))
    return raw if isinstance(raw, str) else f"<{token}>"


def _where(it: dict) -> str:
    lo, hi = it["start"] + it["match_at"], it["start"] + it["match_at"] + it["match_len"] + it["copied"] - 1
    if it["text"] == "history":
        return f"earlier output #{it['item'] + 1}, tokens {lo}–{hi}"
    return f"{TEXTS[it['text']]}, tokens {lo}–{hi}"


def window_html(result: dict, it: dict) -> str:
    """The window's tokens: context before, the match (highlighted), the copied tokens (accepted / not)."""
    spans = []
    colour = LEGEND["suffix"][1]
    m0, m1 = it["match_at"], it["match_at"] + it["match_len"]
    for i, tok in enumerate(it["tokens"]):
        piece = _piece(result, tok)
        text = show_text(piece[:MAX_PIECE] + "…" if len(piece) > MAX_PIECE else piece)
        if m0 <= i < m1:
            spans.append(f"<mark class='dp-match' style='background:{_tint(MATCH, 0.45)};"
                         f"border-bottom:2px solid {MATCH}'>{text}</mark>")
        elif m1 <= i < m1 + it["copied"]:
            ok = i - m1 < it["kept"]
            style = (f"background:{_tint(colour)};border-bottom:2px solid {colour}" if ok
                     else "text-decoration:line-through;opacity:.7")
            kind = "accepted" if ok else "rejected"
            spans.append(f"<span class='dp-copied' data-fate='{kind}' style='{style}'>{text}</span>")
        elif i < m0:
            spans.append(f"<span class='dp-muted'>{text}</span>")
    return "".join(spans)


def sources_html(result: dict, step: Optional[int] = None) -> str:
    """Summary per text, then the newest drafts up to ``step`` with their windows."""
    counts, total = _tally(result, step)
    if not total:
        return ("<div class='dp-drafts dp-muted'>No copied drafts recorded (suffix decoding and prompt "
                "lookup record where each draft came from when the run is traced).</div>")
    items = draft_sources(result, step, newest=MAX_ROWS)
    summary = ", ".join(f"{html.escape(TEXTS[t])}: {d} draft{'s' * (d != 1)}, {a} accepted token{'s' * (a != 1)}"
                        for t, (d, a) in counts.items())
    rows = []
    for it in reversed(items):
        how = (f"{it['occurrences']} earlier occurrence(s) of the {it['match_len']}-token match" if it["match_len"]
               else "no match: the text followed across an edit (suffix decoding's edit_tokens)")
        title = html.escape(f"step {it['step']}, output position {it['position']}: copied from {_where(it)}; "
                            f"{how}, {it['nodes']} drafted node(s), {it['accepted']} accepted", quote=True)
        rows.append(f"<tr title='{title}'><td>{it['step']}</td><td>{it['position']}</td>"
                    f"<td>{html.escape(_where(it))}</td><td>{it['match_len'] or 'edit'}</td>"
                    f"<td>{it['kept']}/{it['copied']}</td>"
                    f"<td style='font-family:ui-monospace,monospace'>{window_html(result, it)}</td></tr>")
    hidden = total - len(items)
    more = f"<div class='dp-muted'>… {hidden} earlier drafts not shown …</div>" if hidden > 0 else ""
    return (f"<div class='dp-drafts'><div><b>Copied drafts</b> — {summary}</div>"
            "<table class='dp-draft-table'><thead><tr><th>step</th><th>pos</th><th>copied from</th>"
            "<th>match</th><th>accepted</th><th>earlier text: before, <mark>match</mark>, copied</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>{more}</div>")
