"""Share links to finished races: ``…/?race=<id>`` opens a recorded race, computing nothing.

A race id is random (``secrets.token_urlsafe``), drawn when its recording is stored and saved inside the
recording file, so nothing about the prompt or the request key can be read from it, or guessed from them, and
it survives a restart (``web.recordings.Recordings.by_share`` finds it again). An id is checked here, by length and
alphabet, before any lookup: whatever a browser or a script sends never reaches a dict or a folder unchecked.

Only recorded races have an id. A run that drafted from the visitor's own history (``RunRequest.private``) is
never recorded, so it never has a link: its drafts would show the visitor's earlier outputs to whoever the link
is passed to, and a link shown after every run is not an explicit enough choice to publish them.
No Gradio and no torch here.
"""

from __future__ import annotations

import html
import re
import secrets
from typing import Any, Optional

ID_BYTES = 12                       # 96 random bits
ID_LENGTH = 16                      # token_urlsafe(12): 16 characters of A-Z a-z 0-9 _ -
ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{%d}" % ID_LENGTH)
QUERY = "race"                      # the page's query parameter: ?race=<id>


def new_id() -> str:
    """A fresh random race id (never derived from the request)."""
    return secrets.token_urlsafe(ID_BYTES)


def check_id(value: Any, name: str = "race_id") -> str:
    """``value`` as a race id, else ValueError naming ``name`` (the value itself is never echoed: it may be
    anything a visitor typed)."""
    if not is_id(value):
        raise ValueError(f"{name} must be {ID_LENGTH} characters of A-Z, a-z, 0-9, '_' and '-' "
                         f"(the end of a share link …/?{QUERY}=<id>)")
    return value


def is_id(value: Any) -> bool:
    """Whether ``value`` has a race id's form (``check_id`` says what is wrong when not)."""
    return isinstance(value, str) and len(value) == ID_LENGTH and ID_PATTERN.fullmatch(value) is not None


def share_html(race_id: Optional[str]) -> str:
    """The Share link under the race (relative: the browser resolves it against the page's own address)."""
    if not race_id or not is_id(race_id):
        return ("<div class='dp-muted' id='share-none'>No share link: only recorded races can be shared (a run "
                "stopped early, timed while the machine was busy, or drafting from your own history is not "
                "recorded).</div>")
    rid = html.escape(race_id, quote=True)
    return (f"<div class='dp-share'>🔗 <a id='share-link' href='?{QUERY}={rid}' target='_blank' "
            f"rel='noopener'>Share this race</a> <code>…/?{QUERY}={rid}</code> (opens it as a recording, "
            f"computing nothing; kept while the server keeps its recent races)</div>")


def share_views(race_id: Optional[str]) -> dict:
    """The page's share views for a finished race: the link and the id the export reads."""
    ok = bool(race_id) and is_id(race_id)
    return {"share": share_html(race_id if ok else None), "race_id": race_id if ok else ""}


def shared_note(when: str, device: str, message: str) -> str:
    """The status of a race opened from its link: a recording, when and where it ran."""
    return html.escape(f"Shared race, replayed from its recording: computed at {when} on {device}; nothing is "
                       f"computed now, and the speed figures are the ones measured then. Press ▶ Play in real "
                       f"time to watch it race. {message}", quote=False)


def unknown_note(problem: str) -> str:
    return html.escape(f"This share link does not open a race: {problem}. Here is the normal page.", quote=False)
