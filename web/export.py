"""A race's animation as a file: GIF (Pillow) or MP4 (imageio-ffmpeg's own ffmpeg), bounded in size, time,
memory and disk. No Gradio and no torch here; the frames come from ``visualize/animation.py``.

Bounds, each fixed before any work: the frames are capped (``animation.MAX_FRAMES``, columns, tokens, one
frame size), so a GIF holds at most MAX_FRAMES palette frames in memory (about 62 MB at 960×540) and an MP4
none (they stream to ffmpeg). A file over ``MAX_BYTES`` is drawn again with half the frames (twice at most),
then refused. Files live in one folder of this process (``ExportFiles``): at most ``keep`` files and
``max_bytes`` in all, oldest deleted first, a failed encoding's file deleted at once, the folder removed at
exit; the same race, format and replay asked again is answered with the file already made.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Iterable, Optional

from PIL import Image

from visualize.animation import MAX_FRAMES, SIZE, check_mode, frames
from web.bounded import Bounded, remove_file, temp_folder

FORMATS = ("gif", "mp4")
MAX_BYTES = 10 * 2**20       # one exported file
MP4_FPS = 10                 # the video's frame rate: each animation frame is repeated for its duration


def check_format(value: Any) -> str:
    if value not in FORMATS:
        raise ValueError(f"format must be 'gif' or 'mp4', got {str(value)[:40]!r}")
    return value


def caption(when: str, device: str) -> str:
    return f"Recorded {when} on {device} · replayed with the timings measured then · Decoding Playground"


class ExportFiles:
    """Exported animations in one folder of this process: the newest ``keep`` files, ``max_bytes`` in all."""

    def __init__(self, keep: int = 16, max_bytes: int = 96 * 2**20, directory: Optional[str] = None) -> None:
        self.keep, self.max_bytes = keep, max_bytes
        self.directory = directory or temp_folder("decoding-playground-exports-")
        os.makedirs(self.directory, exist_ok=True)
        # key -> (path, bytes); a file pushed out (or replaced by another under its key) is deleted; the newest
        # file is kept even alone over max_bytes (``render`` caps one file at MAX_BYTES, far below it)
        self._files = Bounded(max_items=keep, max_bytes=max_bytes, sizeof=lambda entry: entry[1],
                              on_drop=lambda key, entry: remove_file(entry[0]), oversized="alone")

    def get(self, key: Any) -> Optional[str]:
        hit = self._files.get(key)
        return hit[0] if hit is not None and os.path.isfile(hit[0]) else None

    def new_path(self, suffix: str) -> str:
        fd, path = tempfile.mkstemp(prefix="race-", suffix=suffix, dir=self.directory)
        os.close(fd)
        return path

    def add(self, key: Any, path: str) -> str:
        old = self._files.get(key)
        if old is not None and old[0] == path:
            self._files.pop(key)            # the same file measured again: not deleted as a replaced one
        self._files.put(key, (path, os.path.getsize(path)))
        return path

    def count(self) -> int:
        return len(os.listdir(self.directory))


def encode_gif(pairs: Iterable[tuple[Image.Image, int]], path: str) -> None:
    pairs = list(pairs)                     # at most MAX_FRAMES palette frames (the caller's cap)
    first, rest = pairs[0][0], [im for im, _ in pairs[1:]]
    first.save(path, format="GIF", save_all=True, append_images=rest, duration=[d for _, d in pairs], loop=0,
               disposal=1)


def encode_mp4(pairs: Iterable[tuple[Image.Image, int]], path: str, size: tuple[int, int] = SIZE) -> None:
    """H.264 at MP4_FPS: each frame repeated for its duration (cumulated, so the video lasts what the GIF does)."""
    import imageio_ffmpeg   # optional at import: the app runs without it, only the MP4 export needs it
    # imageio-ffmpeg starts ffmpeg with ``preexec_fn=os.setpgrp``, which makes Python fork() and run Python
    # in the child: in this many-threaded process (the compute line, Gradio, inductor's compile pool) the
    # child can spin before exec and never start ffmpeg (seen once in the suite: a child at 100 % CPU for
    # minutes, the export waiting on it). Its documented switch drops the preexec_fn, so the child is
    # spawned without running Python; ffmpeg then shares the app's process group, which only matters to
    # a Ctrl-C in a terminal.
    os.environ["IMAGEIO_FFMPEG_NO_PREVENT_SIGINT"] = "1"

    writer = imageio_ffmpeg.write_frames(path, size, fps=MP4_FPS, codec="libx264", pix_fmt_in="rgb24",
                                         pix_fmt_out="yuv420p", macro_block_size=2, quality=None,
                                         ffmpeg_log_level="error",
                                         output_params=["-preset", "veryfast", "-crf", "26", "-threads", "2",
                                                        "-movflags", "+faststart"])
    writer.send(None)                       # start ffmpeg
    try:
        elapsed, sent = 0, 0
        for im, duration in pairs:
            elapsed += duration
            data = im.convert("RGB").tobytes()
            while sent < max(1, round(elapsed * MP4_FPS / 1000)):
                writer.send(data)
                sent += 1
    finally:
        writer.close()


def render(doc: dict, fmt: str, mode: str, note: str, files: ExportFiles, key: Any = None,
           max_bytes: int = MAX_BYTES, max_frames: int = MAX_FRAMES) -> str:
    """The race as a ``fmt`` file in ``files`` (its path). ValueError for a bad format or mode, or when even
    a quarter of the frames make a file over ``max_bytes``."""
    check_format(fmt)
    check_mode(mode)
    for attempt in range(3):
        path = files.new_path("." + fmt)
        try:
            pairs = frames(doc, mode, note, SIZE, max(2, max_frames >> attempt))
            (encode_gif if fmt == "gif" else encode_mp4)(pairs, path)
            if os.path.getsize(path) <= max_bytes:
                return files.add(key if key is not None else path, path)
        except BaseException:
            remove_file(path)
            raise
        remove_file(path)
    raise ValueError(f"the {fmt} of this race would be over {max_bytes >> 20} MB; try the other format")
