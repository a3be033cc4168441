"""Cross-tokenizer drafts: the assistant's tokens above the target tokens they became. Never imports torch.

A ``DraftTranslated`` event (``decoding/events.py``) holds one draft's bytes and
the byte offset where each assistant token and each target token ends. The view
lays both rows over those bytes, one table column per byte, so a token of one
tokenizer sits exactly above or below the tokens of the other that spell the
same bytes. Target tokens are coloured by what the target did with them at that
step (its ``TokenVerified`` events): accepted, rejected, or never checked.
Token text is decoded from the bytes (a piece of a character shows as ``\\xNN``)
and always HTML-escaped, attributes included.
"""

from __future__ import annotations

import html
from typing import Any, Optional

from .tokens import LEGEND, _tint, show_text

MAX_BYTES = 256      # bytes drawn per draft; the rest is counted, not drawn

_CSS = ("<style>.dp-xt table{border-collapse:collapse;margin:4px 0 10px}"
        ".dp-xt td,.dp-xt th{border:1px solid #ddd;padding:2px 4px;font-family:monospace;font-size:12px;"
        "text-align:center;white-space:nowrap}.dp-xt th{background:#f6f6f6;font-weight:normal;text-align:left}"
        ".dp-xt .dp-ok{background:%s}.dp-xt .dp-no{background:%s;text-decoration:line-through}"
        ".dp-xt .dp-rest{color:#888;font-style:italic}.dp-xt .dp-a{background:%s}</style>") % (
    _tint(LEGEND["accepted"][1], 0.35), _tint(LEGEND["rejected"][1], 0.30), _tint(LEGEND["greedy"][1], 0.25))


def translations(result: dict) -> list[dict]:
    return [e for e in result.get("events", ()) if isinstance(e, dict) and e.get("type") == "DraftTranslated"]


def has_translations(result: dict) -> bool:
    return bool(translations(result))


def translation_at(result: dict, step: Optional[int] = None) -> Optional[dict]:
    """The draft shown at replay ``step``: the last one proposed at or before it (None: the last one)."""
    chosen = None
    for e in translations(result):
        if step is None or e.get("step", 0) <= step:
            chosen = e
    return chosen


def spans(ends: Any, size: int) -> Optional[list[tuple[int, int]]]:
    """(start, end) byte spans from cumulative ``ends``; None unless they rise strictly within ``size``."""
    out, start = [], 0
    for end in ends or ():
        if type(end) is not int or not start < end <= size:
            return None
        out.append((start, end))
        start = end
    return out


def piece_text(data: bytes) -> str:
    """A token's bytes as text; a space shows as ``␣`` (where a token starts matters here), bytes that are
    not a whole UTF-8 character as ``\\xNN``."""
    return data.decode("utf-8", errors="backslashreplace").replace(" ", "\u2423")


def _cell(data: bytes, span: tuple[int, int], cls: str, title: str) -> str:
    """One token over its bytes; a token running past ``MAX_BYTES`` shows the bytes up to there."""
    a, b = span
    shown = min(b, MAX_BYTES) - a
    return (f"<td colspan='{shown}' class='{cls}' title='{html.escape(title, quote=True)}'>"
            f"{show_text(piece_text(data[a:a + shown])).replace('<br>', '')}</td>")


def _verdicts(result: dict, e: dict) -> dict[int, bool]:
    """Output position -> accepted, from the target's checks at the draft's step."""
    out: dict[int, bool] = {}
    for v in result.get("events", ()):
        if isinstance(v, dict) and v.get("type") == "TokenVerified" and v.get("step") == e.get("step"):
            out[v.get("position")] = bool(v.get("accepted"))
    return out


def _rows(result: dict, e: dict, data: bytes, a_spans: list, t_spans: list) -> tuple[str, str, int]:
    """The assistant row, the target row and how many target tokens were accepted."""
    q = e.get("assistant_q") or ()
    a_cells = [_cell(data, s, "dp-a", f"assistant id {tok}" + (f" · q {q[i]:.3f}" if i < len(q) else ""))
               for i, (s, tok) in enumerate(zip(a_spans, e["assistant_tokens"])) if s[0] < MAX_BYTES]
    verdicts = _verdicts(result, e)
    t_cells, accepted = [], 0
    for j, (s, tok) in enumerate(zip(t_spans, e["target_tokens"])):
        ok = verdicts.get(e.get("position", 0) + j)
        accepted += ok is True
        if s[0] < MAX_BYTES:
            state = {True: "accepted", False: "rejected", None: "not checked"}[ok]
            t_cells.append(_cell(data, s, {True: "dp-ok", False: "dp-no", None: ""}[ok],
                                 f"target id {tok} · {state}"))
    end = t_spans[-1][1] if t_spans else 0
    if end < min(len(data), MAX_BYTES):
        t_cells.append(f"<td colspan='{min(len(data), MAX_BYTES) - end}' class='dp-rest'>not drafted</td>")
    return "".join(a_cells), "".join(t_cells), accepted


def crosstok_html(result: dict, step: Optional[int] = None) -> str:
    """Both tokenizations of the draft shown at replay ``step``."""
    e = translation_at(result, step)
    if e is None:
        return "<div class='dp-xt'>No cross-tokenizer draft yet.</div>"
    data = bytes(b for b in e.get("text", ()) if type(b) is int and 0 <= b < 256)
    a_tokens, t_tokens = e.get("assistant_tokens") or (), e.get("target_tokens") or ()
    a_spans, t_spans = spans(e.get("assistant_ends"), len(data)), spans(e.get("target_ends"), len(data))
    if a_spans is None or t_spans is None or len(a_spans) != len(a_tokens) or len(t_spans) != len(t_tokens) \
            or len(data) != len(e.get("text", ())):
        return "<div class='dp-xt'>This draft's byte offsets are inconsistent; it cannot be drawn.</div>"
    a_row, t_row, accepted = _rows(result, e, data, a_spans, t_spans)
    how = ("sampling over the tokens both vocabularies share: one target token per assistant token"
           if e.get("intersection") else "greedy: re-encoded through the text")
    more = f" · {len(data) - MAX_BYTES} more bytes not drawn" if len(data) > MAX_BYTES else ""
    head = (f"<div><b>step {int(e.get('step', 0))}</b> · output position {int(e.get('position', 0))} · "
            f"{len(a_tokens)} assistant token{'s' if len(a_tokens) != 1 else ''} → {len(t_tokens)} target "
            f"token{'s' if len(t_tokens) != 1 else ''}, {accepted} accepted · {how}{more}</div>")
    return (f"{_CSS}<div class='dp-xt'>{head}<table><tr><th>assistant</th>{a_row}</tr>"
            f"<tr><th>target</th>{t_row}</tr></table></div>")


def crosstok_view(doc: Optional[dict], step: Optional[int]) -> str:
    """The app's panel: the first result with cross-tokenizer drafts, at replay ``step``."""
    result = next((r for r in (doc or {}).get("results", []) if has_translations(r)), None)
    if result is None:
        return ("<div class='dp-xt'>Run speculative decoding with an assistant whose tokenizer differs from the "
                "target's (gemma-3-270m ← smollm2-135m-instruct) to see both tokenizations of each draft.</div>")
    return crosstok_html(result, step)
