"""Every limit of the web service, in one frozen value an app holds (``Settings.limits``, ``PlaygroundApp.limits``).

A public Space is an open API: a request may carry any JSON value in any field, from a fresh session, thousands of
times. So every size, count and time a request can reach is bounded here, checked before the work it bounds, and a
test that needs other bounds builds its app with its own ``Limits`` (``dataclasses.replace(DEFAULT_LIMITS, ...)``)
instead of patching a module.
"""

from __future__ import annotations

import dataclasses

from web.quiet import QuietLimits


@dataclasses.dataclass(frozen=True)
class Limits:
    max_new_tokens: int = 512         # tokens one strategy may generate
    prompt_chars: int = 32_768        # checked before tokenizing
    prompt_tokens: int = 2048         # checked after
    strategies: int = 6               # per run (plus the greedy reference)
    time_limit_s: float = 180.0       # generation time per request
    sweep_points: int = 12
    sweep_keys: int = 2
    sweep_chars: int = 500
    request_bytes: int = 2**20        # any HTTP request body except an upload
    upload_bytes: int = 20 * 2**20    # a trace file
    queue_size: int = 32              # runs and sweeps waiting for a compute slot (beyond it: "queue full")
    compute_slots: int = 1            # runs computed at the same time (one model, one device)
    recordings_bytes: int = 256 * 2**20     # memory for recorded runs replayed to identical requests
    jobs_per_session: int = 2         # queued or running runs, sweeps and imports of one browser session
    trace_files: int = 64             # exported trace files kept on disk
    export_files: int = 16            # exported animations kept on disk (oldest deleted first) ...
    export_bytes: int = 96 * 2**20    # ... within this many bytes
    trace_store_bytes: int = 512 * 2**20    # memory for the replay documents of all sessions
    race_frames_bytes: int = 16 * 2**20     # memory for recorded races' wall-clock frames, shared by their replays
    cache_cleanup_s: tuple[int, int] = (300, 1800)   # Gradio's delete_cache: every 5 min, files older than 30 min
    # browser sessions whose Gradio state is kept, least recently used dropped first (Gradio's default: 10,000).
    # With web/gradio_overrides.LeanSessionState a session costs ~14 KB fresh and ~43 KB after a replayed race
    # (Intel Xeon, gradio 6.31; 0.42 MB and 0.45 MB without it): at most ~0.35 GB of a 16 GB Space.
    sessions: int = 8000
    history_sessions: int = 64        # browser sessions whose suffix-decoding history is kept (least recent dropped)
    history_tokens: int = 2048        # earlier output tokens one session's history keeps (oldest outputs dropped)
    history_nodes: int = 1_000_000    # suffix-tree nodes over all histories (about 300 bytes each)
    # a run is recorded only if timed quiet (web/quiet.py: the thresholds and what they mean); else the example is
    # recorded again after quiet_retry_idle x the recorder's idle wait
    quiet: QuietLimits = QuietLimits()
    quiet_retry_idle: int = 30

    @property
    def line_capacity(self) -> int:
        """Requests Gradio's queue holds for the compute line (and the Stop tickets kept for them)."""
        return 4 * self.queue_size


DEFAULT_LIMITS = Limits()
