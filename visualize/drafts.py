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
MATCH = "#E69F00"         # the matched tokens (the legend's correction orange)


def _int(value: Any, default: int = 0) -> int:
    v = number(value, None)
    return int(v) if v is not None and v == int(v) else default


def draft_sources(result: dict, step: Optional[int] = None) -> list[dict]:
    """The ``DraftSource`` events up to ``step`` (all: None), each with how many copied tokens were accepted.

    Each item: ``{step, position, text, item, start, tokens, match_at, match_len, copied, occurrences,
    nodes, accepted, kept}``: ``accepted`` counts the target's accepted tokens at that step (chains: the
    ``TokenVerified`` events; trees: the ``DraftTree``'s accepted path), ``kept`` how many of the copied
    tokens they are (fewer when a tree's other branch won).
    """
    events = result.get("events", ()) or ()
    accepted: dict[int, list[int]] = {}      # step -> the accepted drafted tokens, in order
    for e in events:
        kind = e.get("type")
        if kind == "DraftTree":
            toks = list(e.get("tokens") or ())
            accepted[_int(e.get("step"))] = [toks[a] for a in (e.get("accepted") or ())
                                             if isinstance(a, int) and 0 <= a < len(toks)]
        elif kind == "TokenVerified" and e.get("accepted") is True:
            accepted.setdefault(_int(e.get("step")), []).append(e.get("token"))
    out = []
    for e in events:
        if e.get("type") != "DraftSource":
            continue
        s = _int(e.get("step"))
        if step is not None and s > step:
            continue
        tokens = [t for t in (e.get("tokens") or ()) if isinstance(t, int) and not isinstance(t, bool)]
        text = e.get("text") if e.get("text") in TEXTS else "prompt"
        m1 = _int(e.get("match_at")) + _int(e.get("match_len"))
        out.append({"step": s, "position": _int(e.get("position")), "text": text, "item": _int(e.get("item"), -1),
                    "start": _int(e.get("start")), "tokens": tokens[:MAX_WINDOW],
                    "match_at": _int(e.get("match_at")), "match_len": _int(e.get("match_len")),
                    "copied": _int(e.get("copied")), "occurrences": _int(e.get("occurrences"), 1),
                    "nodes": _int(e.get("nodes")), "accepted": len(accepted.get(s, ())),
                    "kept": _common(tokens[m1:m1 + _int(e.get("copied"))], accepted.get(s, ()))})
    return out


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
        text = show_text(_piece(result, tok))
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
    items = draft_sources(result, step)
    if not items:
        return ("<div class='dp-drafts dp-muted'>No copied drafts recorded (suffix decoding and prompt "
                "lookup record where each draft came from when the run is traced).</div>")
    counts = source_counts(items)
    summary = ", ".join(f"{html.escape(TEXTS[t])}: {d} draft{'s' * (d != 1)}, {a} accepted token{'s' * (a != 1)}"
                        for t, (d, a) in counts.items())
    rows = []
    for it in reversed(items[-MAX_ROWS:]):
        how = (f"{it['occurrences']} earlier occurrence(s) of the {it['match_len']}-token match" if it["match_len"]
               else "no match: the text followed across an edit (suffix decoding's edit_tokens)")
        title = html.escape(f"step {it['step']}, output position {it['position']}: copied from {_where(it)}; "
                            f"{how}, {it['nodes']} drafted node(s), {it['accepted']} accepted", quote=True)
        rows.append(f"<tr title='{title}'><td>{it['step']}</td><td>{it['position']}</td>"
                    f"<td>{html.escape(_where(it))}</td><td>{it['match_len'] or 'edit'}</td>"
                    f"<td>{it['kept']}/{it['copied']}</td>"
                    f"<td style='font-family:ui-monospace,monospace'>{window_html(result, it)}</td></tr>")
    hidden = len(items) - MAX_ROWS
    more = f"<div class='dp-muted'>… {hidden} earlier drafts not shown …</div>" if hidden > 0 else ""
    return (f"<div class='dp-drafts'><div><b>Copied drafts</b> — {summary}</div>"
            "<table class='dp-draft-table'><thead><tr><th>step</th><th>pos</th><th>copied from</th>"
            "<th>match</th><th>accepted</th><th>earlier text: before, <mark>match</mark>, copied</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>{more}</div>")
