"""Jobs and admission: the Stop flags of queued and running jobs, and how many one browser session may hold."""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from typing import Any, Callable, Optional

SESSION_FALLBACK = "local"   # direct calls (tests, scripts) have no browser session


@dataclasses.dataclass
class _Ticket:
    session: str
    flag: threading.Event
    admitted: float
    running: bool = False


class Jobs:
    """The Stop flags of queued and running jobs, one ticket per job.

    ``admit`` runs when a job enters the queue (before it waits), ``start`` when
    it starts, ``finish`` when it ends. A Stop sets the flags of its session's
    tickets and creates nothing, so Stops from other sessions cannot push a
    running job's flag out, and a Stop pressed while the job waits is still set
    when it starts. Tickets of jobs that never start (their client left the
    queue) expire after ``queued_ttl_s``; beyond ``capacity`` the oldest waiting
    ticket goes first. Running tickets are never dropped before ``finish``.

    A session may hold ``per_session`` unstopped jobs; a waiting ticket stops
    counting after ``count_s`` (its client may have cancelled it in a way this
    table cannot see), so the bound is at most ``per_session`` new jobs per
    ``count_s`` while older ones still wait.
    """

    def __init__(self, per_session: int, capacity: int, queued_ttl_s: float, count_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.per_session, self.capacity, self.clock = per_session, capacity, clock
        self.queued_ttl_s, self.count_s = queued_ttl_s, count_s
        self._tickets: dict[int, _Ticket] = {}    # admission order
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._tickets)

    def _drop_stale(self) -> None:
        now = self.clock()
        for key in [k for k, t in self._tickets.items() if not t.running and now - t.admitted > self.queued_ttl_s]:
            del self._tickets[key]
        # over capacity: waiting tickets go oldest first, stopped ones (most likely cancelled) before the rest
        waiting = sorted((k for k, t in self._tickets.items() if not t.running),
                         key=lambda k: not self._tickets[k].flag.is_set())
        while len(self._tickets) >= self.capacity and waiting:
            del self._tickets[waiting.pop(0)]

    def admit(self, session: str) -> int:
        """A ticket for a job entering the queue; ValueError when the session has too many jobs."""
        with self._lock:
            self._drop_stale()
            now = self.clock()
            live = sum(1 for t in self._tickets.values() if t.session == session and not t.flag.is_set()
                       and (t.running or now - t.admitted <= self.count_s))
            if live >= self.per_session:
                raise ValueError(f"this session already has {live} jobs queued or running (the limit is "
                                 f"{self.per_session}); wait for one to finish or press Stop")
            key = next(self._ids)
            self._tickets[key] = _Ticket(session, threading.Event(), self.clock())
            return key

    def start(self, key: Optional[int], session: str) -> tuple[int, threading.Event]:
        """The job's ticket and Stop flag (kept set if Stop was pressed while it waited)."""
        with self._lock:
            ticket = self._tickets.get(key) if key is not None else None
            if ticket is None:     # not admitted through the queue (a direct call), or expired meanwhile
                self._drop_stale()
                key, ticket = next(self._ids), _Ticket(session, threading.Event(), self.clock())
                self._tickets[key] = ticket
            # the key travels server-side with the request; Gradio may name the session only now
            ticket.session, ticket.running = session, True
            return key, ticket.flag

    def finish(self, key: int) -> None:
        with self._lock:
            self._tickets.pop(key, None)

    def flag(self, key: Any) -> threading.Event:
        """The Stop flag of a started job (a fresh, unset one for a key this table does not hold)."""
        with self._lock:
            ticket = self._tickets.get(key) if isinstance(key, int) else None
            return ticket.flag if ticket is not None else threading.Event()

    def stop(self, session: str) -> tuple[int, int]:
        """Set the Stop flags of ``session``'s jobs; returns (running, waiting) counts."""
        with self._lock:
            mine = [t for t in self._tickets.values() if t.session == session]
            for t in mine:
                t.flag.set()
            running = sum(t.running for t in mine)
            return running, len(mine) - running
