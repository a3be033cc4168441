"""Server paths never reach a visitor: absolute file system paths in messages and documents become ``[path]``."""

from __future__ import annotations

import re
from typing import Any

# URL paths of the app itself, which a message may name (a share link's "/?race=<id>", "/gradio_api/...", an
# endpoint): they are not the server's files, so they stay
APP_PATHS = r"/(?:\?|gradio_api/|(?:healthz|race|export_race)(?![\w/.-]))"
# a path starts with / or ~/ (not inside a word, a URL or a relative path, not one of the app's URL paths, and not
# the / of a closing tag such as </script>, which is markup to escape, not a path to hide)
_PATH = re.compile(r"(?<![\w.:/~-])(?!(?<=<)/[A-Za-z][\w-]*>)(?!" + APP_PATHS + r")(?:~/|/)(?!/)[^\s'\"<>()\[\],;]+")


def redact_paths(text: str) -> str:
    """Replace absolute file system paths (``/home/...``, ``~/...``) with ``[path]``; URLs and the app's own URL
    paths (``/?race=<id>``, ``/gradio_api/...``) stay."""
    return _PATH.sub("[path]", text)


def public_message(exc: BaseException) -> str:
    return redact_paths(str(exc))


def redact_all(value: Any) -> Any:
    """``value`` with every string in it passed through :func:`redact_paths` (an environment record)."""
    if isinstance(value, str):
        return redact_paths(value)
    if isinstance(value, dict):
        return {k: redact_all(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_all(v) for v in value]
    return value
