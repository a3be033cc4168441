"""One app's state: every store a request can add to, owned by one object built per app.

``app.build_demo(settings)`` builds a :class:`PlaygroundApp` (or takes one) and hands it to every handler
(``web/handlers.py``), the compute (``web/compute.py``) and the ``/race`` endpoint (``web/api.py``). Nothing a
request adds to lives at module level, so two apps in one process share nothing, and a test builds its own app
(with its own ``Limits``: ``PlaygroundApp(Settings(limits=...))``) instead of patching globals. Every store is
bounded by the app's limits (``web/limits.py``; the classes in ``web/crowd.py`` and ``web/guards.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from web.crowd import Board, Line
from web.recordings import Recordings
from web.export import ExportFiles
from web.guards import Histories, TraceFiles, TraceStore
from web.jobs import SESSION_FALLBACK, Jobs
from web.limits import Limits
from web.settings import DEFAULT_SETTINGS, Settings



@dataclasses.dataclass
class PlaygroundApp:
    """The stores of one app and the operator's settings (what was chosen at start: target, model policy, limits).
    A store left out is built from ``settings.limits``."""
    settings: Settings = DEFAULT_SETTINGS
    jobs: Jobs = None                         # Stop tickets, per session
    line: Line = None                         # every run, sweep, export waits here
    board: Board = dataclasses.field(default_factory=Board)     # identical requests: one computation
    recordings: Recordings = None             # ... and its recording afterwards
    store: TraceStore = None                  # documents the views replay from
    trace_files: TraceFiles = None
    histories: Histories = None               # earlier outputs, per session
    exports: ExportFiles = None               # animations made, on disk
    startup: Any = None       # web/startup.Startup while the start's choices are made behind the page (None: made)
    quiet_baselines: Any = None   # web/quiet.QuietBaselines: greedy's quiet decode step per (model, mode)

    def __post_init__(self) -> None:
        lim = self.limits
        built = {
            "jobs": lambda: Jobs(lim.jobs_per_session, capacity=lim.line_capacity,
                                 queued_ttl_s=lim.time_limit_s * (lim.queue_size + 1), count_s=lim.time_limit_s),
            "line": lambda: Line(slots=lim.compute_slots, capacity=lim.queue_size),
            "recordings": lambda: Recordings(lim.recordings_bytes),
            "store": lambda: TraceStore(lim.trace_store_bytes, lim.race_frames_bytes),
            "trace_files": lambda: TraceFiles(lim.trace_files),
            "histories": lambda: Histories(lim.history_sessions, lim.history_tokens, lim.history_nodes,
                                           unshared=(SESSION_FALLBACK,)),
            "exports": lambda: ExportFiles(keep=lim.export_files, max_bytes=lim.export_bytes),
        }
        for name, make in built.items():
            if getattr(self, name) is None:
                setattr(self, name, make())

    @property
    def limits(self) -> Limits:
        """Every bound of this app's requests and stores (the operator's ``Settings.limits``)."""
        return self.settings.limits

    @classmethod
    def create(cls, settings: Settings = DEFAULT_SETTINGS, recordings_dir: Optional[str] = None) -> "PlaygroundApp":
        """An app whose recordings persist in ``recordings_dir`` (None: in memory only)."""
        app = cls(settings)
        if recordings_dir:
            app.recordings.persist_to(recordings_dir)
        return app
