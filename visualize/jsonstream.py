"""Incremental JSON reading with caps: a hostile upload is refused before it is all in memory.

``read_json`` parses one JSON document from a binary stream read in chunks. Its results are those of
``json.loads`` on the same bytes: the same encodings (``json.detect_encoding``, then ``surrogatepass``),
``NaN`` and ``Infinity`` literals, lone surrogates in ``\\u`` escapes, the last of duplicate keys, the
same integer digit limit (4300). It counts while it reads and raises :class:`Refused` the moment a cap
in :class:`Limits` is crossed: bytes, nesting depth, entries of one list or object, lists and objects in
all, characters of one string. Memory therefore stays proportional to what was accepted so far.

Lists can be given a *role* from their place in the document (``Limits.roles``); a role's rule
(``Limits.rules``) caps its items over the whole document (a trace's events, all results together) and
may keep only the first items of each list (the rest are read, counted and dropped).

Speed: a container whose closing bracket comes within ``FAST`` characters is parsed by the json module's
C scanner in one call (bounded: it cannot hold more than ``FAST`` characters), and runs of numbers in a
long list by one regular expression; only the structure around them is walked in Python.
"""

from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass, field
from json.decoder import scanstring
from typing import Any, BinaryIO, Optional

CHUNK = 1 << 20          # bytes read at a time
FAST = 1 << 16           # characters a container may span to be parsed by the C scanner in one call
_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")   # ASCII digits, as the C scanner
# up to 1024 numbers at a time: an unbounded repeat keeps backtracking state per number (39 MB for 65k)
_RUN = re.compile(r"(?:-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?[ \t\n\r]*,[ \t\n\r]*){1,1024}")
_CONSTANTS = (("null", None), ("true", True), ("false", False), ("NaN", float("nan")),
              ("Infinity", float("inf")), ("-Infinity", float("-inf")))
_SCAN = json.JSONDecoder().scan_once     # json.loads' own scanner (C when available)
VALUE, ITEM, KEY, FIRST_KEY, COLON, AFTER = range(6)   # what comes next
CONTAINER, IS_DICT, NAME, ROLE, COUNT = range(5)       # a frame on the stack of open containers


@dataclass(frozen=True)
class Rule:
    """The items of every list with one role: at most ``total`` over the document, the first ``keep`` of each."""
    total: int
    keep: Optional[int] = None


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What one read may hold, given by name: the document's bytes and nesting depth (required), then the caps
    below, and the roles of lists with their rules."""
    roles: dict = field(default_factory=dict)   # (parent role, key or "*" for an item) -> role; root: ("", "")
    rules: dict = field(default_factory=dict)   # role -> Rule, for lists
    max_bytes: int
    max_depth: int
    max_entries: int = 200_000        # items of one list, keys of one object
    max_containers: int = 1_000_000   # lists and objects in the whole document
    max_string: int = 6 * 2**20       # characters of one string as written (an escape counts its six)


class Refused(ValueError):
    """A cap crossed while reading: ``kind`` ("bytes", "depth", "entries", "containers", "string" or a list
    role), its ``limit``, and ``path``: where in the document (``results[0].events[7]``; for "containers" and
    "depth", the container being read)."""

    def __init__(self, kind: str, limit: int, path: str = "") -> None:
        super().__init__(f"more than {limit} {kind} at {path or 'the top'}")
        self.kind, self.limit, self.path = kind, limit, path


class Malformed(ValueError):
    """Not JSON (the message says what was expected and at which character)."""


def read_json(stream: BinaryIO, limits: Limits) -> tuple[Any, dict[str, int]]:
    """The document in ``stream`` and, per list role, how many items its last list of that role held."""
    return _Parser(stream, limits).parse()


def _name(key: Any) -> str:
    return key if isinstance(key, str) and key.isidentifier() else repr(key)[:40]


class _Parser:
    def __init__(self, stream: BinaryIO, limits: Limits) -> None:
        self.stream, self.lim = stream, limits
        head = stream.read(4)
        self.nbytes, self.eof = len(head), False
        self.decoder = codecs.getincrementaldecoder(json.detect_encoding(head) if head else "utf-8")("surrogatepass")
        self.buf, self.offset = self.decoder.decode(head), 0
        self.stack: list = []
        self.memo: dict = {}
        self.counts: dict[str, int] = {}
        self.totals: dict[str, int] = {}
        self.containers = 0
        self.no_batch_before = 0              # a failed batch's end, in buffer positions (reset on refill)
        # the C scanner reads whole containers: only where no list, object or string of FAST characters
        # can cross a cap (a trace's caps are far above it; small caps, as in tests, walk everything)
        self.fast = limits.max_entries >= FAST and limits.max_string >= FAST

    # ------------------------------------------------------------------ input
    def _refill(self, pos: int, want: int = 16) -> tuple[str, int]:
        """Drop what was read before ``pos`` and read until ``want`` characters follow it (or the end)."""
        rest = [self.buf[pos:]]
        have = len(rest[0])
        self.offset += pos
        self.no_batch_before = max(0, self.no_batch_before - pos)
        while have < want and not self.eof:
            data = self.stream.read(CHUNK)
            self.nbytes += len(data)
            if self.nbytes > self.lim.max_bytes:
                raise Refused("bytes", self.lim.max_bytes)
            self.eof = not data
            text = self.decoder.decode(data, final=self.eof)
            rest.append(text)
            have += len(text)
        self.buf = "".join(rest)
        return self.buf, 0

    def _error(self, what: str, pos: int) -> Malformed:
        return Malformed(f"{what} (char {self.offset + pos})")

    def _path(self, index: Optional[int] = None, item: bool = True) -> str:
        """Where reading is: the open containers and the item being read in the innermost one (its key, or
        ``index``, by default the next one); ``item=False``: the innermost container itself."""
        parts = []
        for depth, fr in enumerate(self.stack):
            last = depth == len(self.stack) - 1
            if last and not item:
                break
            if fr[IS_DICT]:
                parts.append(("." if parts else "") + _name(fr[NAME]))
            else:
                at = index if last and index is not None else fr[COUNT] if fr[ROLE] else len(fr[CONTAINER])
                parts.append(f"[{at}]")
        return "".join(parts)

    # ------------------------------------------------------------------ scalars
    def _string(self, buf: str, pos: int) -> Optional[tuple[str, int]]:
        """(text, end) of the string whose quote is at ``pos``; None: it goes on past the buffer."""
        try:
            text, end = scanstring(buf, pos + 1, True)
        except json.JSONDecodeError as exc:
            if self.eof or (not exc.msg.startswith("Unterminated") and exc.pos < len(buf) - 6):
                raise self._error(exc.msg, exc.pos) from None
            end = len(buf)              # read on (a cut escape or no closing quote yet), unless too long
            text = None
        if end - pos > self.lim.max_string:
            raise Refused("string", self.lim.max_string, self._path())
        return None if text is None else (text, end)

    def _scalar(self, buf: str, pos: int) -> Optional[tuple[Any, int]]:
        """(number or constant, end) at ``pos``; None: it may go on past the buffer."""
        m = _NUMBER.match(buf, pos)
        if m is not None:
            end = m.end()
            if len(buf) - end < 3 and not self.eof:   # it may go on: digits, "." or "e+" then digits
                return None
            try:
                return (float(m.group()) if m.group(1) or m.group(2) else int(m.group())), end
            except ValueError as exc:   # an integer of more than 4300 digits, as json.loads says
                raise Malformed(str(exc)) from None
        for word, value in _CONSTANTS:
            if buf.startswith(word, pos):
                return value, pos + len(word)
        raise self._error("Expecting value", pos)

    def _run(self, items: list, buf: str, pos: int) -> int:
        """Numbers each followed by a comma, appended to ``items`` in one go; returns the position after."""
        m = _RUN.match(buf, pos)
        if m is None:
            return pos
        parts = m.group().split(",")[:-1]
        if len(items) + len(parts) > self.lim.max_entries:
            raise Refused("entries", self.lim.max_entries, self._path(self.lim.max_entries))
        try:
            if any(ch in m.group() for ch in ".eE"):
                items.extend(float(p) if "." in p or "e" in p or "E" in p else int(p) for p in parts)
            else:
                items.extend(map(int, parts))
        except ValueError as exc:
            raise Malformed(str(exc)) from None
        return m.end()

    # ------------------------------------------------------------------ containers
    def _scan(self, text: str, wrapped: bool = False) -> Any:
        """``text`` parsed by the C scanner when it is exactly one value within the caps; None otherwise.
        ``wrapped``: the text is items in brackets added around them (not a container of the document)."""
        try:
            value, stop = _SCAN(text, 0)
        except (ValueError, StopIteration, RecursionError):
            return None                       # cut inside a string, or not JSON: the walk decides
        if stop != len(text):
            return None
        nested = text.count("[") + text.count("{") - wrapped   # its containers (strings may add a few)
        room = self.lim.max_depth - len(self.stack) + wrapped
        if nested + wrapped > room and _text_depth(text, room) > room:
            return None                       # too deep: the walk says where
        self.containers += nested
        if self.containers > self.lim.max_containers:
            raise Refused("containers", self.lim.max_containers, self._path(item=False))
        return value

    def _fast(self, buf: str, pos: int, opener: str) -> Optional[tuple[Any, int]]:
        """The container at ``pos`` parsed in one call, when it closes within ``FAST`` characters."""
        if not self.fast:
            return None
        end = buf.find("}" if opener == "{" else "]", pos + 1, pos + FAST)
        value = None if end < 0 else self._scan(buf[pos:end + 1])
        if value is None:
            return None
        if isinstance(value, dict):           # share key strings across objects, as one json.loads call does
            memo = self.memo
            value = {memo.setdefault(k, k): v for k, v in value.items()}
        return value, end + 1

    def _batch(self, buf: str, pos: int, opener: str) -> Optional[tuple[list, int]]:
        """Several items of a list, from the container at ``pos`` up to the last one that closes within
        ``FAST`` characters and is followed by a comma, parsed in one call (an events list, window rows)."""
        if pos < self.no_batch_before or not self.fast:
            return None
        end = buf.rfind(("}" if opener == "{" else "]") + ",", pos + 1, min(len(buf), pos + FAST))
        if end < 0:
            return None
        items = self._scan("[" + buf[pos:end + 1] + "]", wrapped=True)
        if items is None:                     # the comma was inside a string: not again before it
            self.no_batch_before = end + 1
            return None
        return items, end + 1

    def _role(self) -> Optional[str]:
        """The role of a container opened now: from its parent's role and its key (or "*" for an item)."""
        if not self.stack:
            return self.lim.roles.get(("", ""))
        parent = self.stack[-1]
        if parent[ROLE] is None:
            return None
        return self.lim.roles.get((parent[ROLE], parent[NAME] if parent[IS_DICT] else "*"))

    def _open(self, is_dict: bool, role: Optional[str]) -> None:
        stack, lim = self.stack, self.lim
        if len(stack) >= lim.max_depth:
            raise Refused("depth", lim.max_depth, self._path(item=False))
        self.containers += 1
        if self.containers > lim.max_containers:
            raise Refused("containers", lim.max_containers, self._path(item=False))
        stack.append([{} if is_dict else [], is_dict, None, role, 0])

    def _close(self) -> Any:
        fr = self.stack.pop()
        if fr[ROLE] is not None and not fr[IS_DICT]:
            self.counts[fr[ROLE]] = fr[COUNT]
        return fr[CONTAINER]

    def _add(self, values: list) -> None:
        """Put finished values into the innermost open container (a list, or an object under its key)."""
        top = self.stack[-1]
        items, role = top[CONTAINER], top[ROLE]
        if top[IS_DICT]:
            items[top[NAME]] = values[0]
        elif role is None:
            items.extend(values)
        else:
            before = top[COUNT]
            top[COUNT] += len(values)
            rule = self.lim.rules.get(role)
            if rule is not None:
                total = self.totals[role] = self.totals.get(role, 0) + len(values)
                if total > rule.total:
                    raise Refused(role, rule.total, self._path(before + rule.total - (total - len(values))))
                if rule.keep is not None:
                    values = values[:max(0, rule.keep - before)]
            items.extend(values)
        if len(items) > self.lim.max_entries:
            raise Refused("entries", self.lim.max_entries, self._path(self.lim.max_entries))

    # ------------------------------------------------------------------ the walk
    def parse(self) -> tuple[Any, dict[str, int]]:
        stack = self.stack
        buf, pos = self._refill(0)
        state, done, root = VALUE, False, None
        while True:
            pos = _WS.match(buf, pos).end()
            if len(buf) - pos < 16 and not self.eof:     # room for a constant or a short token
                buf, pos = self._refill(pos, 16 + CHUNK)
                continue
            if pos >= len(buf):
                break
            if done:
                raise self._error("Extra data", pos)
            c = buf[pos]
            top = stack[-1] if stack else None
            if state == AFTER:                                   # 1. after a value: a comma or the close
                if c == ",":
                    pos, state = pos + 1, KEY if top[IS_DICT] else VALUE
                    continue
                if c != ("}" if top[IS_DICT] else "]"):
                    raise self._error("Expecting ',' delimiter", pos)
                pos, value = pos + 1, self._close()
            elif state in (KEY, FIRST_KEY):                      # 2. a key (or the close of an empty object)
                if c == "}" and state == FIRST_KEY:
                    pos, value = pos + 1, self._close()
                elif c != '"':
                    raise self._error("Expecting property name enclosed in double quotes", pos)
                else:
                    got = self._string(buf, pos)
                    if got is None:
                        buf, pos = self._refill(pos, 2 * (len(buf) - pos) + CHUNK)
                        continue
                    top[NAME], pos, state = self.memo.setdefault(got[0], got[0]), got[1], COLON
                    continue
            elif state == COLON:
                if c != ":":
                    raise self._error("Expecting ':' delimiter", pos)
                pos, state = pos + 1, VALUE
                continue
            else:                                                # 3. a value (or the close of an empty list)
                if c == "]" and state == ITEM:
                    pos, value = pos + 1, self._close()
                elif c == "{" or c == "[":
                    role = self._role()
                    if role is None and top is not None and not top[IS_DICT]:
                        many = self._batch(buf, pos, c)
                        if many is not None:
                            self._add(many[0])
                            pos, state = many[1], AFTER
                            continue
                    fast = self._fast(buf, pos, c) if role is None else None
                    if fast is None:
                        self._open(c == "{", role)
                        pos, state = pos + 1, FIRST_KEY if c == "{" else ITEM
                        continue
                    value, pos = fast
                else:
                    if top is not None and not top[IS_DICT] and top[ROLE] is None and (c == "-" or c.isdigit()):
                        after = self._run(top[CONTAINER], buf, pos)
                        if after != pos:
                            pos, state = after, VALUE
                            continue
                    got = self._string(buf, pos) if c == '"' else self._scalar(buf, pos)
                    if got is None:
                        buf, pos = self._refill(pos, 2 * (len(buf) - pos) + CHUNK)
                        continue
                    value, pos = got
            if stack:                                            # 4. the value goes into its container
                self._add([value])
                state = AFTER
            else:
                root, done = value, True
        if not done or stack:
            raise self._error("Expecting value" if not stack else "Unterminated container", pos)
        return root, self.counts


_ESCAPE = re.compile(r"\\.")                   # a backslash and the character it escapes
# every ASCII character but brackets and quotes, deleted (what is left outside strings: brackets only, since
# valid JSON has no other character there; anything else left is inside a string)
_STRUCTURE = {c: None for c in range(128) if chr(c) not in '[]{}"'}
_PAIRS = str.maketrans("[]{}", "()()")


def _text_depth(text: str, limit: int) -> int:
    """Nesting depth of valid JSON text, up to ``limit + 1``: strings taken out (escapes first, so no pattern
    keeps state per character; then every other piece between quotes is a string's), then innermost bracket
    pairs removed a round at a time."""
    if "\\" in text:
        text = _ESCAPE.sub("", text)
    brackets = "".join(text.translate(_STRUCTURE).split('"')[::2]).translate(_PAIRS)
    depth = 0
    while brackets and depth <= limit:
        brackets, depth = brackets.replace("()", ""), depth + 1
    return depth
