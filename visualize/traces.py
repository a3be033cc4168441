"""Trace export and import: one JSON document per run, checked field by field on the way in.

An imported trace comes from anyone, so it is treated as hostile. Uploads are
JSON only (never pickle), read incrementally by ``visualize.jsonstream`` with its
caps enforced while reading (file size, nesting depth, events over all results,
results, entries per list or object, lists and objects in all, string and number
lengths), so a file over a cap is refused before it is all in memory, and the
memory it took is handed back. Every value the views use is then type-checked:
each event field against its dataclass in ``decoding.events`` (integers where
integers belong, never booleans; finite numbers; strings only from a known
vocabulary; bounded steps, positions, tuple sizes), and each result field against
``RESULT_FIELDS`` (both in ``visualize/checks.py``). Unknown result and document
keys are dropped; missing event fields get their defaults. Version 1 documents
are upgraded by ``visualize.legacy`` when that module exists. No model is needed
to replay an imported trace.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import io
import json
import os
from typing import Any, BinaryIO

from .checks import (DOC_FIELDS, MAX_DOC_TEXT, SPECS, Invalid, at, check_event, check_events,  # noqa: F401 (API)
                     check_result)
from .jsonstream import Limits, Refused, Rule, read_json

FORMAT = "decoding-playground-trace"
VERSION = 2                   # what export writes
VERSIONS = (1, 2)             # what import reads (1 is upgraded first)
MAX_BYTES = 20 * 2**20
MAX_DEPTH = 12
MAX_RESULTS = 16
MAX_EVENTS = 200_000          # over all results together
MAX_LISTED_RESULTS = 1024     # results counted (for the message) before a file is refused outright
MAX_CONTAINERS = 1_000_000    # lists and objects in the whole document (a real trace: a few per event)
MAX_ENTRIES = max(MAX_EVENTS, 100_000)   # one list (times_ms: one per event) or object (vocab: 100,000 ids)
# where the trace's lists are: a document's results, each result's events (jsonstream roles)
ROLES = {("", ""): "doc", ("doc", "results"): "results", ("results", "*"): "result", ("result", "events"): "events"}


def export_trace(doc: dict) -> str:
    """Serialize a run document (environment, prompt, prompt_ids, results) as the current version."""
    body = {k: v for k, v in doc.items() if k not in ("format", "version")}
    return json.dumps({"format": FORMAT, "version": VERSION, **body})


def _upgrade(doc: dict) -> dict:
    """Version 1 -> 2 (old Jacobi variant names) through ``visualize.legacy`` when it is present."""
    if importlib.util.find_spec("visualize.legacy") is None:
        return doc
    legacy = importlib.import_module("visualize.legacy")
    try:
        return legacy.upgrade(doc)
    except (TypeError, KeyError, AttributeError, IndexError) as exc:
        raise ValueError(f"trace version 1 could not be upgraded: {type(exc).__name__}") from None


def _limits(max_bytes: int) -> Limits:
    return Limits(max_bytes=max_bytes, max_depth=MAX_DEPTH, max_entries=MAX_ENTRIES, max_containers=MAX_CONTAINERS,
                  max_string=12 * MAX_DOC_TEXT + 2,   # the longest text, each character a pair of \u escapes
                  roles=ROLES, rules={"results": Rule(MAX_LISTED_RESULTS, keep=MAX_RESULTS),
                                      "events": Rule(MAX_EVENTS)})


def _refusal(exc: Refused, max_bytes: int) -> str:
    """The message for a cap crossed while reading."""
    if exc.kind == "bytes":
        return f"trace file is over {max_bytes / 2**20:g} MB; the limit is {max_bytes / 2**20:g} MB"
    if exc.kind == "depth":
        return f"trace JSON is nested deeper than {MAX_DEPTH} levels"
    if exc.kind == "events":
        return f"trace has more than {MAX_EVENTS} events; the limit is {MAX_EVENTS}"
    if exc.kind == "results":
        return f"trace has more than {MAX_LISTED_RESULTS} results; the limit is {MAX_RESULTS}"
    what = {"entries": "entries in one list or object", "containers": "lists and objects in all",
            "string": "characters in one string"}[exc.kind]
    return f"trace JSON has more than {exc.limit} {what}" + (f" (at {exc.path})" if exc.path else "")


def _read(stream: BinaryIO, max_bytes: int) -> tuple[dict, int]:
    """The document, checked as far as reading goes, and how many results it listed."""
    try:
        doc, counts = read_json(stream, _limits(max_bytes))
    except Refused as exc:
        raise ValueError(_refusal(exc, max_bytes)) from None
    except ValueError as exc:   # not JSON, bad UTF-8, an integer literal of thousands of digits
        raise ValueError(f"trace file is not valid JSON: {str(exc)[:120]}") from None
    if not isinstance(doc, dict):
        raise ValueError("trace must be a JSON object")
    if doc.get("format") != FORMAT:
        raise ValueError(f"not a decoding-playground trace (format must be {FORMAT!r})")
    version = doc.get("version")
    if type(version) is not int or version not in VERSIONS:
        raise ValueError(f"unsupported trace version {repr(version)[:40]}; expected one of {VERSIONS}")
    results = doc.get("results")
    return doc, counts.get("results", 0) if isinstance(results, list) else 0


def _checked(doc: dict, listed: int) -> dict:
    """A clean version-2 document: the known document keys, and per result the known keys with validated events."""
    results = doc.get("results")
    if not isinstance(results, list) or not results:
        raise ValueError("trace has no results list")
    if listed > MAX_RESULTS:
        raise ValueError(f"trace has {listed} results; the limit is {MAX_RESULTS}")
    if doc["version"] == 1:
        doc = _upgrade(doc)
        results = doc.get("results") if isinstance(doc, dict) else None
        if not isinstance(results, list) or not results or len(results) > MAX_RESULTS:
            raise ValueError("trace version 1 could not be upgraded: no results list")
    clean: dict[str, Any] = {"format": FORMAT, "version": VERSION}
    for key, check in DOC_FIELDS.items():
        if key in doc:
            try:
                check(doc[key])
            except Invalid as exc:
                raise at(exc, key) from None
            clean[key] = doc[key]
    clean["results"] = []
    for i, r in enumerate(results):
        try:
            clean["results"].append(check_result(r))
        except Invalid as exc:
            raise at(exc, f"results[{i}]") from None
    total = sum(len(r["events"]) for r in clean["results"])
    if total > MAX_EVENTS:
        raise ValueError(f"trace has {total} events; the limit is {MAX_EVENTS}")
    for i, r in enumerate(clean["results"]):
        try:
            check_events(r["events"])
        except Invalid as exc:
            raise at(exc, f"results[{i}].events") from None
    return clean


def _import(stream: BinaryIO, max_bytes: int) -> dict:
    """Read and check; on a refusal, free what was read before raising (see ``_give_back``)."""
    try:
        return _checked(*_read(stream, max_bytes))
    except ValueError as exc:
        message = str(exc)      # the exception's frames hold the partial document: let them go first
    _give_back()
    raise ValueError(message)


def _size_error(size: int, max_bytes: int) -> ValueError:
    return ValueError(f"trace file is {size / 2**20:.1f} MB; the limit is {max_bytes / 2**20:g} MB")


def import_trace(data: bytes | str, max_bytes: int = MAX_BYTES) -> dict:
    """Parse and validate an uploaded trace held in memory; raise ``ValueError`` with a clear message.

    Returns a clean version-2 document: the known document keys, and per result
    the known result keys with validated events.
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if len(raw) > max_bytes:
        raise _size_error(len(raw), max_bytes)
    return _import(io.BytesIO(raw), max_bytes)


def import_trace_file(path: str | os.PathLike, max_bytes: int = MAX_BYTES) -> dict:
    """:func:`import_trace` for a file, read in chunks: a file over a cap is refused before it is all read.

    Raises ``OSError`` when the file cannot be read, ``ValueError`` (a clear message) when it is refused.
    """
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > max_bytes:
            raise _size_error(size, max_bytes)
        return _import(fh, max_bytes)


_LIBC: list = []


def _give_back() -> None:
    """Hand the memory of a refused upload back to the system.

    Python frees the partial document at once, but glibc keeps freed heap pages for later use, so a
    refused 19 MB upload would leave the process holding what its parse took; ``malloc_trim(0)``
    returns it. Elsewhere (no glibc) this does nothing.
    """
    if not _LIBC:
        try:
            _LIBC.append(ctypes.CDLL(None).malloc_trim)
        except (OSError, AttributeError):
            _LIBC.append(None)
    if _LIBC[0] is not None:
        _LIBC[0](0)
