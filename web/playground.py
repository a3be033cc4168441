"""One app's state: every store a request can add to, owned by one object built per app.

``app.build_demo(settings)`` builds a :class:`PlaygroundApp` (or takes one) and hands it to every handler
(``web/handlers.py``), the compute (``web/compute.py``) and the ``/race`` endpoint (``web/api.py``). Nothing a
request adds to lives at module level, so two apps in one process share nothing, and a test builds its own app
instead of patching globals. Every store is bounded (``LIMITS`` in ``web/service.py``, the classes in
``web/crowd.py`` and ``web/guards.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from web.crowd import Board, Line, Recordings
from web.export import ExportFiles
from web.guards import Histories, TraceFiles, TraceStore
from web.service import DEFAULT_SETTINGS, LIMITS, SESSION_FALLBACK, Jobs, Settings


def _jobs() -> Jobs:
    return Jobs(LIMITS["jobs_per_session"], capacity=4 * LIMITS["queue_size"],
                queued_ttl_s=LIMITS["time_limit_s"] * (LIMITS["queue_size"] + 1), count_s=LIMITS["time_limit_s"])


def _histories() -> Histories:
    return Histories(LIMITS["history_sessions"], LIMITS["history_tokens"], LIMITS["history_nodes"],
                     unshared=(SESSION_FALLBACK,))


@dataclasses.dataclass
class PlaygroundApp:
    """The stores of one app and the operator's settings (what was chosen at start: target, model policy)."""
    settings: Settings = DEFAULT_SETTINGS
    jobs: Jobs = dataclasses.field(default_factory=_jobs)                        # Stop tickets, per session
    line: Line = dataclasses.field(                                              # every run, sweep, export waits here
        default_factory=lambda: Line(slots=LIMITS["compute_slots"], capacity=LIMITS["queue_size"]))
    board: Board = dataclasses.field(default_factory=Board)                     # identical requests: one computation
    recordings: Recordings = dataclasses.field(                                  # ... and its recording afterwards
        default_factory=lambda: Recordings(LIMITS["recordings_bytes"]))
    store: TraceStore = dataclasses.field(                                       # documents the views replay from
        default_factory=lambda: TraceStore(LIMITS["trace_store_bytes"]))
    trace_files: TraceFiles = dataclasses.field(default_factory=lambda: TraceFiles(LIMITS["trace_files"]))
    histories: Histories = dataclasses.field(default_factory=_histories)        # earlier outputs, per session
    exports: ExportFiles = dataclasses.field(                                    # animations made, on disk
        default_factory=lambda: ExportFiles(keep=LIMITS["export_files"], max_bytes=LIMITS["export_bytes"]))
    startup: Any = None       # web/startup.Startup while the start's choices are made behind the page (None: made)
    quiet_baselines: Any = None   # web/quiet.QuietBaselines: greedy's quiet decode step per (model, mode)

    @classmethod
    def create(cls, settings: Settings = DEFAULT_SETTINGS, recordings_dir: Optional[str] = None) -> "PlaygroundApp":
        """An app whose recordings persist in ``recordings_dir`` (None: in memory only)."""
        app = cls(settings)
        if recordings_dir:
            app.recordings.persist_to(recordings_dir)
        return app
