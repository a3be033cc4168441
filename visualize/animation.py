"""A race as an animation: a trace document in, Pillow frames and their durations out. Never imports torch.

The two replays the page offers: ``time`` shows every column at ``t`` ms of its own measured run (real time,
so the fastest strategy finishes first), ``steps`` shows every column after ``s`` target forward passes. Each
frame has the strategy names, the page's token colours and legend (``tokens.LEGEND``), the clock, and under
each finished column its figures (tokens/s, speed-up, tokens per target forward).

Frames are palette images ("P", one fixed palette: the page's colours, unblended text), so they encode small
as a GIF and exactly (a test counts the coloured token cells of a frame by their underline colour). Every input
is capped before anything is built: at most ``MAX_COLUMNS`` columns, the last ``MAX_TOKENS`` tokens of a
column, ``MAX_FRAMES`` frames (thinned evenly for long races, the end always kept), one frame size; a frame
draws only the lines of tokens that fit its columns (the newest, as the page scrolls).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from PIL import Image, ImageDraw, ImageFont

from .race import race_length_ms
from .tokens import LEGEND, duration_ms, event_times, max_step, number

MODES = {"time": "real time", "steps": "target forward passes"}
SIZE = (960, 540)
MAX_FRAMES = 120          # frames drawn at most (one slide's worth: long races are thinned)
MAX_COLUMNS = 7           # the strategies of a run (six and the greedy reference)
MAX_TOKENS = 512          # tokens of one column laid out (the last ones)
MAX_PIECE = 24            # characters of one token drawn
FRAME_MS = 100            # real time: a frame every 100 ms (thinned beyond MAX_FRAMES)
STEP_MS = 160             # steps: one target forward pass per frame ...
MAX_STEPS_MS = 20_000     # ... for at most this long in all
HOLD_MS = 2500            # the last frame stays this long
MARGIN, GAP, LINE_H, BAR_H = 12, 8, 20, 3
COLUMNS_TOP = 78          # below the header, the prompt line and the legend: only token cells use legend colours
CAPTION_H, FOOTER_H, HEAD_H = 22, 52, 40

# The palette: the page's colours (visualize/tokens.py CSS), then each legend source's colour and its tint.
_BASE = {"bg": "#ffffff", "text": "#1f2328", "muted": "#57606a", "border": "#d0d7de", "done": "#1a7f37",
         "band": "#f6f8fa", "other": "#8c959f", "other_tint": "#e4e7ea"}


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))


def _tint(hex_colour: str, alpha: float = 0.28) -> tuple[int, int, int]:
    """The page's tint (rgba at ``alpha``) over white, as the browser blends it."""
    return tuple(round(255 + (c - 255) * alpha) for c in _rgb(hex_colour))


PALETTE: list[tuple[int, int, int]] = [_rgb(c) for c in _BASE.values()]
INDEX = {name: i for i, name in enumerate(_BASE)}
for _name, (_, _colour) in LEGEND.items():
    INDEX[_name], INDEX[_name + "_tint"] = len(PALETTE), len(PALETTE) + 1
    PALETTE += [_rgb(_colour), _tint(_colour)]
SOURCE_COLOURS = {name: _rgb(colour) for name, (_, colour) in LEGEND.items()}   # a cell's underline colour


@functools.lru_cache(maxsize=8)
def _font(size: int, bold: bool = False) -> Any:
    """DejaVu Sans Mono where the system has it (Debian, Spaces' images), else Pillow's own font."""
    for name in (("DejaVuSansMono-Bold.ttf",) if bold else ()) + ("DejaVuSansMono.ttf",):
        for path in (name, f"/usr/share/fonts/truetype/dejavu/{name}"):
            try:
                return ImageFont.truetype(path, size)
            except OSError:
                continue
    try:
        return ImageFont.load_default(size)
    except TypeError:                       # Pillow without FreeType: the fixed bitmap font
        return ImageFont.load_default()


def _width(font: Any, text: str) -> float:
    return font.getlength(text)


def _fit(font: Any, text: str, width: float) -> str:
    """``text`` cut (…) to ``width`` pixels (at most a few hundred characters are ever measured)."""
    text = text[:300]
    if _width(font, text) <= width:
        return text
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _width(font, text[:mid] + "…") <= width:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo] + "…"


def _piece(text: str) -> str:
    """A token as drawn: whitespace made visible as on the page, at most MAX_PIECE characters."""
    if text == "":
        return "∅"
    text = text.replace("\n", "↵").replace("\t", "⇥").replace("\r", "␍")
    return text[:MAX_PIECE] + "…" if len(text) > MAX_PIECE else text


# --------------------------------------------------------------------------- the frames' clock
def plan(doc: dict, mode: str, max_frames: int = MAX_FRAMES) -> list[tuple[float, int]]:
    """(clock, duration ms) of each frame: ``time`` clocks are ms of each run, ``steps`` clocks target forward
    passes. At most ``max_frames`` frames; the last is held ``HOLD_MS``. Durations are whole 10 ms (a GIF's
    unit) and add up to the race's length (real time) or to the steps' length."""
    check_mode(mode)
    results = _results(doc)
    max_frames = max(2, int(max_frames))
    if mode == "time":
        total = race_length_ms(results)
        n = max(1, min(max_frames - 1, math.ceil(total / FRAME_MS)))
        clocks = [total * i / n for i in range(n + 1)]
        ends = [10 * round(c / 10) for c in clocks]
    else:
        top = max((max_step(r) for r in results), default=0)
        n = max(1, min(max_frames - 1, top))
        clocks = [float(round(top * i / n)) for i in range(n + 1)]
        per = max(40, 10 * int(min(STEP_MS * max(top, 1) / n, MAX_STEPS_MS / n) / 10))   # whole 10 ms, within
        ends = [per * i for i in range(n + 1)]
    durations = [max(10, b - a) for a, b in zip(ends, ends[1:])] + [HOLD_MS]
    return list(zip(clocks, durations))


def check_mode(mode: Any) -> str:
    if not isinstance(mode, str) or mode not in MODES:      # a list or a dict would not hash: a refusal by name
        raise ValueError(f"mode must be one of {', '.join(repr(m) for m in MODES)} (real time or target forward "
                         f"passes), got {str(mode)[:40]!r}")
    return mode


def _results(doc: dict) -> list[dict]:
    results = doc.get("results") if isinstance(doc, dict) else None
    return [r for r in (results or [])[:MAX_COLUMNS] if isinstance(r, dict)]


# --------------------------------------------------------------------------- one column, laid out once
@dataclass
class _Column:
    title: str
    box: tuple[int, int, int, int]
    end: float                          # the clock at which it has finished (ms or steps)
    commits: list                       # (clock, position, source), in clock order
    cells: dict                         # position -> (line, x, width, text), the last MAX_TOKENS positions
    figures: list
    lines_fit: int


def column_boxes(n: int, size: tuple[int, int] = SIZE) -> list[tuple[int, int, int, int]]:
    """The (left, top, right, bottom) box of each of ``n`` columns."""
    width, height = size
    n = max(1, min(n, MAX_COLUMNS))
    w = (width - 2 * MARGIN - GAP * (n - 1)) / n
    return [(round(MARGIN + i * (w + GAP)), COLUMNS_TOP, round(MARGIN + i * (w + GAP) + w), height - CAPTION_H)
            for i in range(n)]


def _figures(result: dict) -> list[str]:
    if result.get("error"):
        return ["failed"]
    n = len(result.get("token_ids") or ())
    fwd = number(result.get("target_forwards"), 0.0) or 0.0
    per = number((result.get("stats") or {}).get("mean_tokens_per_target_forward"), None)
    per = per if per is not None else (n / fwd if fwd else None)
    speed, tps = number(result.get("speedup"), None), number(result.get("tokens_per_s"), None)
    return [f"{tps:.1f} tok/s" if tps is not None else "– tok/s",
            f"speed-up {speed:.2f}×" if speed is not None else "speed-up –",
            f"{per:.2f} tok/fwd" if per is not None else "– tok/fwd"]


def _column(result: dict, box: tuple[int, int, int, int], mode: str) -> _Column:
    font = _font(13)
    events = result.get("events") or []
    times = event_times(result) if mode == "time" else None
    commits = []
    for i, e in enumerate(events):
        if isinstance(e, dict) and e.get("type") == "TokenCommitted" and isinstance(e.get("position"), int):
            clock = times[i] if times is not None else float(number(e.get("step"), 0.0) or 0.0)
            commits.append((clock, e["position"], str(e.get("source"))))
    commits.sort(key=lambda c: c[0])
    pieces = result.get("pieces") or []
    ids = result.get("token_ids") or []
    last = max([p for _, p, _ in commits] + [len(ids) - 1, -1])
    first = max(0, last + 1 - MAX_TOKENS)
    inner = box[2] - box[0] - 12
    cells, line, x = {}, 0, 0.0
    for pos in range(first, last + 1):
        raw = pieces[pos] if pos < len(pieces) and isinstance(pieces[pos], str) else f"<{pos}>"
        text = _fit(font, _piece(raw), inner - 6)
        w = _width(font, text) + 4
        if x > 0 and x + w > inner:
            line, x = line + 1, 0.0
        cells[pos] = (line, x, w, text)
        x += w + 2
        if raw.endswith("\n"):          # a newline ends the line, as on the page
            line, x = line + 1, 0.0
    label = str(result.get("label") or result.get("strategy") or "?")
    title = label + (" (reference)" if result.get("reference") else "") + (" (lossy)" if result.get("lossy") else "")
    end = duration_ms(result) if mode == "time" else float(max_step(result))
    area = box[3] - box[1] - HEAD_H - FOOTER_H
    return _Column(title, box, end, commits, cells, _figures(result), max(1, area // LINE_H))


# --------------------------------------------------------------------------- drawing
def _legend(draw: ImageDraw.ImageDraw, sources: list[str], y: int) -> None:
    font, x = _font(12), MARGIN
    for name in sources:
        label = LEGEND[name][0]
        w = _width(font, label) + 12
        draw.rectangle([x, y, x + w, y + 16], fill=INDEX[name + "_tint"])
        draw.text((x + 6, y + 1), label, fill=INDEX["text"], font=font)
        draw.rectangle([x, y + 17, x + w, y + 17 + BAR_H - 1], fill=INDEX[name])
        x += w + 8


def _background(doc: dict, columns: list[_Column], mode: str, caption: str, size: tuple[int, int]) -> Image.Image:
    """What every frame shares: title, prompt, legend, column boxes and titles, caption."""
    im = Image.new("P", size, INDEX["bg"])
    im.putpalette([c for rgb in PALETTE for c in rgb])
    draw = ImageDraw.Draw(im)
    width, height = size
    env = doc.get("environment") if isinstance(doc.get("environment"), dict) else {}
    target = env.get("target") if isinstance(env.get("target"), dict) else {}
    title = f"Decoding Playground · {target.get('name') or 'race'}"
    draw.text((MARGIN, 8), _fit(_font(16, True), title, width * 0.55), fill=INDEX["text"], font=_font(16, True))
    prompt = " ".join(str(doc.get("prompt") or "").split())
    draw.text((MARGIN, 32), _fit(_font(12), f"Prompt: {prompt}", width - 2 * MARGIN), fill=INDEX["muted"],
              font=_font(12))
    used = {source for col in columns for _, _, source in col.commits}
    _legend(draw, [k for k in LEGEND if k in used], 50)
    for col in columns:
        left, top, right, bottom = col.box
        draw.rectangle(col.box, outline=INDEX["border"], width=1)
        draw.text((left + 6, top + 5), _fit(_font(13, True), col.title, right - left - 12), fill=INDEX["text"],
                  font=_font(13, True))
    draw.text((MARGIN, height - CAPTION_H + 4), _fit(_font(12), caption, width - 2 * MARGIN), fill=INDEX["muted"],
              font=_font(12))
    return im


def _draw_column(draw: ImageDraw.ImageDraw, col: _Column, committed: dict, clock: float, mode: str) -> None:
    left, top, right, bottom = col.box
    done = clock >= col.end
    font, small = _font(13), _font(12)
    shown = [p for p in committed if p in col.cells]
    last_line = max((col.cells[p][0] for p in shown), default=0)
    offset = max(0, last_line - col.lines_fit + 1)
    status = (f"{min(clock, col.end) / 1e3:.2f} / {col.end / 1e3:.2f} s" if mode == "time"
              else f"step {int(min(clock, col.end))} / {int(col.end)}")
    status += f" · {len(committed)} tok" + (" ✓" if done else "")
    draw.text((left + 6, top + 23), _fit(small, status, right - left - 12),
              fill=INDEX["done" if done else "muted"], font=small)
    y0 = top + HEAD_H
    for pos in shown:
        line, x, w, text = col.cells[pos]
        if not offset <= line < offset + col.lines_fit:
            continue
        source = committed[pos]
        colour = source if source in LEGEND else "other"
        x0, y = left + 6 + round(x), y0 + (line - offset) * LINE_H
        x1 = x0 + round(w) - 1
        draw.rectangle([x0, y, x1, y + LINE_H - 4], fill=INDEX[colour + "_tint"])
        draw.text((x0 + 2, y + 1), text, fill=INDEX["text"], font=font)
        draw.rectangle([x0, y + LINE_H - 3 - BAR_H, x1, y + LINE_H - 4], fill=INDEX[colour])  # over descenders
    if done:
        draw.rectangle(col.box, outline=INDEX["done"], width=2)
        for i, text in enumerate(col.figures):
            draw.text((left + 6, bottom - FOOTER_H + 4 + 15 * i), _fit(small, text, right - left - 12),
                      fill=INDEX["text"], font=small)


def frames(doc: dict, mode: str = "time", caption: str = "", size: tuple[int, int] = SIZE,
           max_frames: int = MAX_FRAMES) -> Iterator[tuple[Image.Image, int]]:
    """(frame, duration ms) of the race, one at a time (an encoder need not hold them all)."""
    schedule = plan(doc, mode, max_frames)
    results = _results(doc)
    columns = [_column(r, box, mode) for r, box in zip(results, column_boxes(len(results), size))]
    base = _background(doc, columns, mode, caption, size)
    total = schedule[-1][0] if schedule else 0.0
    committed: list[dict] = [{} for _ in columns]
    seen = [0] * len(columns)
    for clock, duration in schedule:
        for i, col in enumerate(columns):         # the commits up to this clock, once each over the frames
            while seen[i] < len(col.commits) and col.commits[seen[i]][0] <= clock:
                _, pos, source = col.commits[seen[i]]
                committed[i][pos] = source
                seen[i] += 1
        im = base.copy()
        draw = ImageDraw.Draw(im)
        readout = (f"t = {clock / 1e3:.2f} s of {total / 1e3:.2f} s (real time)" if mode == "time"
                   else f"step {int(clock)} of {int(total)} (target forward passes)")
        font = _font(14, True)
        draw.text((size[0] - MARGIN - _width(font, readout), 9), readout, fill=INDEX["text"], font=font)
        for i, col in enumerate(columns):
            _draw_column(draw, col, committed[i], clock, mode)
        yield im, duration


@dataclass
class Animation:
    frames: list
    durations: list                     # ms per frame

    @property
    def total_ms(self) -> int:
        return sum(self.durations)


def animate(doc: dict, mode: str = "time", caption: str = "", size: tuple[int, int] = SIZE,
            max_frames: int = MAX_FRAMES) -> Animation:
    """Every frame of the race and its duration (at most ``max_frames``)."""
    pairs = list(frames(doc, mode, caption, size, max_frames))
    return Animation([im for im, _ in pairs], [d for _, d in pairs])


def committed_at(result: dict, clock: float, mode: str) -> int:
    """How many positions of ``result`` have been committed by ``clock`` (what a frame shows, before the cap)."""
    times = event_times(result) if mode == "time" else None
    positions = set()
    for i, e in enumerate(result.get("events") or []):
        if isinstance(e, dict) and e.get("type") == "TokenCommitted":
            at = times[i] if times is not None else (number(e.get("step"), 0.0) or 0.0)
            if at <= clock:
                positions.add(e.get("position"))
    return len(positions)


def count_cells(image: Image.Image, box: Optional[tuple[int, int, int, int]] = None) -> int:
    """How many token cells ``image`` shows (in ``box``): the top-left pixel of each underline bar, found by its
    colour (a legend source's) with a different colour left of it and above it. For tests and checks."""
    rgb = image.convert("RGB")
    left, top, right, bottom = box or (0, COLUMNS_TOP, rgb.width, rgb.height)
    px = rgb.load()
    colours = set(SOURCE_COLOURS.values()) | {_rgb(_BASE["other"])}
    count = 0
    for y in range(max(top, 1), bottom):
        for x in range(max(left, 1), right):
            c = px[x, y]
            if c in colours and px[x - 1, y] != c and px[x, y - 1] != c:
                count += 1
    return count
