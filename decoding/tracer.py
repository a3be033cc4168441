"""Tracers collect events while a strategy runs.

Strategies guard event construction with ``if tracer.enabled:`` so that the
``NullTracer`` costs one attribute read per site. Tracing never feeds back into
decoding, so it cannot change the tokens (a test checks this).
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from decoding.events import event_from_dict, event_to_dict


class Tracer:
    """Appends events in order."""

    enabled = True

    def __init__(self) -> None:
        self.events: list[Any] = []

    def emit(self, event: Any) -> None:
        self.events.append(event)

    def to_dicts(self) -> list[dict]:
        return [event_to_dict(e) for e in self.events]


class NullTracer:
    """Records nothing."""

    enabled = False
    events: tuple = ()

    def emit(self, event: Any) -> None:  # pragma: no cover - never called behind the guard
        pass

    def to_dicts(self) -> list[dict]:
        return []


NULL_TRACER = NullTracer()


def events_to_json(events: Iterable[Any]) -> str:
    return json.dumps([event_to_dict(e) for e in events])


def events_from_dicts(items: Iterable[dict]) -> list[Any]:
    return [event_from_dict(d) for d in items]
