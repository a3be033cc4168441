"""What a stored object really holds in memory, measured on the object itself, not guessed from its JSON size.

A trace's bytes of JSON say little about its memory: ``{}`` is 2 bytes of JSON and a 64-byte dict, a number of
one digit a 24- or 28-byte object, a repeated key one shared string. The stores (``TraceStore``, ``Recordings``)
bound what they hold by :func:`held_bytes`, which walks the object with ``sys.getsizeof`` as Python holds it.

A long list or a large object is measured on an evenly spaced sample of its items, scaled to all of them (a
trace's 200,000 events are one shape repeated), and the walk as a whole visits at most ``BUDGET`` objects, so
measuring costs a few milliseconds whatever the document holds. Keys of objects are counted once each (the
JSON parser shares repeated keys: equal keys are one string); values are counted as separate objects, which they are after parsing.
``tests/test_memory.py`` checks the figure against ``tracemalloc`` on documents of very different shapes.
"""

from __future__ import annotations

import sys
from typing import Any

SAMPLE = 32          # items measured of a longer list or object; the rest are taken to be like them
BUDGET = 20_000      # objects visited in all; past it each container is measured on one item
_SMALL_INTS = range(-5, 257)      # CPython's cached ints: shared, never allocated again


class _Walk:
    def __init__(self) -> None:
        self.left = BUDGET
        self.keys: set = set()           # the keys counted already (equal keys are one string after parsing)
        self.key_bytes = 0

    def _sample(self, n: int) -> range:
        k = SAMPLE if self.left > 0 else 1
        return range(n) if n <= k else range(0, n, -(-n // k))

    def size(self, obj: Any) -> int:
        """Bytes of ``obj`` and everything it holds, keys of objects apart (``key_bytes``)."""
        self.left -= 1
        t = type(obj)
        if t is str or t is bytes:
            return sys.getsizeof(obj)
        if t is int:
            return 0 if obj in _SMALL_INTS else sys.getsizeof(obj)
        if t is float:
            return sys.getsizeof(obj)
        if obj is None or t is bool:
            return 0
        if t is list or t is tuple:
            return sys.getsizeof(obj) + self._items(obj, len(obj))
        if t is dict:
            return sys.getsizeof(obj) + self._entries(obj)
        held = sys.getsizeof(obj)             # any other object: itself and its attributes
        attrs = getattr(obj, "__dict__", None)
        return held + (self.size(attrs) if isinstance(attrs, dict) else 0)

    def _items(self, seq: Any, n: int) -> int:
        picked = self._sample(n)
        measured = sum(self.size(seq[i]) for i in picked)
        return measured * n // max(len(picked), 1)

    def _entries(self, d: dict) -> int:
        n = len(d)
        picked = self._sample(n)
        if len(picked) == n:
            for k in d:
                self._key(k, 1)
            return sum(self.size(v) for v in d.values())
        keys, values = list(d), list(d.values())
        for i in picked:                      # a large object's keys are its own: scaled like its values
            self._key(keys[i], n / len(picked))
        return sum(self.size(values[i]) for i in picked) * n // len(picked)

    def _key(self, key: Any, weight: float) -> None:
        if key not in self.keys:
            self.keys.add(key)
            self.key_bytes += int(sys.getsizeof(key) * weight)


def held_bytes(*objs: Any) -> int:
    """Bytes the objects hold in memory together (see the module's docstring for how it is measured)."""
    walk = _Walk()
    return sum(walk.size(o) for o in objs) + walk.key_bytes
