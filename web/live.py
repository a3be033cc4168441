"""The live race: what ``runner.run_comparison`` has produced so far, read from another thread.

The app runs a comparison in a worker thread and polls ``Live.snapshot()`` a few
times a second to redraw the columns while tokens are produced. Nothing here
touches torch; the runner feeds it results and tracers (``runner.HookTracer``).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional, Sequence

from decoding.events import event_to_dict


class Live:
    """What ``run_comparison`` has produced so far, readable from another thread while it runs.

    ``snapshot()`` returns ``{"done": [result dicts], "running": partial dict or None,
    "waiting": [(strategy, label)]}``. The running strategy's dict has its events and
    ``times_ms`` so far, the committed ``token_ids``, a ``vocab`` for the tokens it
    names, ``elapsed_s`` and ``"running": True`` (``"warming": True`` before its
    timed run starts). Finished results are converted once; the running one's
    events incrementally, so a snapshot costs what is new since the last one.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done: list[dict] = []
        self._waiting: list[tuple[str, str]] = []
        self._later: list[tuple[str, str]] = []      # lanes of a later comparison (a second model), after these
        self._running: Optional[dict] = None
        self._hook: Any = None   # the running strategy's runner.HookTracer
        self._events: list[dict] = []
        self._vocab: dict[str, str] = {}
        self._decode: Optional[Callable[[int], str]] = None
        self._tokenizer: Any = None

    # ------------------------------------------------------------------ written by the runner
    def plan(self, names: Sequence[tuple[str, str]], tokenizer: Any) -> None:
        with self._lock:
            self._waiting = list(names)
            if self._later[:len(self._waiting)] == self._waiting:   # the later comparison has begun
                self._later = self._later[len(self._waiting):]
            if tokenizer is not None and tokenizer is not self._tokenizer:   # a second model may name ids otherwise
                self._tokenizer, self._vocab = tokenizer, {}
                self._decode = lambda t: tokenizer.decode([t])

    def begin(self, rr: Any, hook: Any, warming: bool) -> None:
        with self._lock:
            if self._waiting and self._waiting[0][0] == rr.strategy:
                self._waiting.pop(0)
            self._running = {"strategy": rr.strategy, "label": rr.label, "params": dict(rr.params),
                             "reference": rr.reference, "lossless": rr.lossless, "lossy": rr.lossy, "warming": warming,
                             "t0": time.perf_counter()}
            self._hook, self._events = hook, []

    def finish(self, rr: Any) -> None:
        row = rr.to_dict()
        with self._lock:
            self._done.append(row)
            self._running, self._hook, self._events = None, None, []

    def then(self, names: Sequence[tuple[str, str]]) -> None:
        """Lanes that a later comparison will run (a race of two models: the second model's), shown waiting
        after the current plan's until that comparison plans them itself."""
        with self._lock:
            self._later = [*self._later, *names]

    # ------------------------------------------------------------------ read by anyone
    def snapshot(self) -> dict:
        with self._lock:
            running = None
            if self._running is not None:
                running = self._partial()
            return {"done": list(self._done), "running": running, "waiting": [*self._waiting, *self._later]}

    def _partial(self) -> dict:
        info, hook = self._running, self._hook
        events: list = hook.events if hook is not None else []
        n = min(len(events), len(hook.times) if hook is not None else 0)
        for e in events[len(self._events):n]:
            row = event_to_dict(e)
            self._events.append(row)
            for key in ("token",):
                tok = row.get(key)
                if isinstance(tok, int) and str(tok) not in self._vocab and self._decode is not None:
                    self._vocab[str(tok)] = self._decode(tok)
        committed: dict[int, int] = {}
        for row in self._events:
            if row["type"] == "TokenCommitted":
                committed[row["position"]] = row["token"]
        tokens = [committed[i] for i in range(len(committed)) if i in committed]
        return {**{k: v for k, v in info.items() if k != "t0"}, "running": True,
                "events": list(self._events), "times_ms": list(hook.times[:len(self._events)]) if hook else [],
                "token_ids": tokens, "vocab": dict(self._vocab), "pieces": [],
                "elapsed_s": round(time.perf_counter() - info["t0"], 3)}
