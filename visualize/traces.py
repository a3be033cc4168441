"""Trace export and import: one JSON document per run, checked field by field on the way in.

An imported trace comes from anyone, so it is treated as hostile. Uploads are
JSON only (never pickle), capped in size and nesting depth, and every value the
views use is type-checked: each event field against its dataclass in
``decoding.events`` (integers where integers belong, never booleans; finite
numbers; strings only from a known vocabulary; bounded steps, positions, tuple
sizes), and each result field against ``RESULT_FIELDS`` (both in ``visualize/checks.py``).
Unknown result and document keys are dropped; missing event fields get their defaults.
Version 1 documents are upgraded by ``visualize.legacy`` when that module exists.
No model is needed to replay an imported trace.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from typing import Any

from .checks import DOC_FIELDS, SPECS, Invalid, at, check_event, check_result  # noqa: F401 (SPECS: API)

FORMAT = "decoding-playground-trace"
VERSION = 2                   # what export writes
VERSIONS = (1, 2)             # what import reads (1 is upgraded first)
MAX_BYTES = 20 * 2**20
MAX_DEPTH = 12
MAX_RESULTS = 16
MAX_EVENTS = 200_000          # over all results together


def export_trace(doc: dict) -> str:
    """Serialize a run document (environment, prompt, prompt_ids, results) as the current version."""
    body = {k: v for k, v in doc.items() if k not in ("format", "version")}
    return json.dumps({"format": FORMAT, "version": VERSION, **body})


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of parsed JSON, up to ``limit + 1`` (only containers are walked)."""
    stack, deepest = [(value, 1)], 1
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        for x in (v.values() if isinstance(v, dict) else v):
            if isinstance(x, (dict, list)):
                stack.append((x, d + 1))
    return deepest


def _upgrade(doc: dict) -> dict:
    """Version 1 -> 2 (old Jacobi variant names) through ``visualize.legacy`` when it is present."""
    if importlib.util.find_spec("visualize.legacy") is None:
        return doc
    legacy = importlib.import_module("visualize.legacy")
    try:
        return legacy.upgrade(doc)
    except (TypeError, KeyError, AttributeError, IndexError) as exc:
        raise ValueError(f"trace version 1 could not be upgraded: {type(exc).__name__}") from None


def _parse(data: bytes | str, max_bytes: int) -> dict:
    size = len(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
    if size > max_bytes:
        raise ValueError(f"trace file is {size / 2**20:.1f} MB; the limit is {max_bytes / 2**20:g} MB")
    try:
        doc = json.loads(data)
    except RecursionError:
        raise ValueError(f"trace JSON is nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:   # JSONDecodeError, bad UTF-8, an integer literal of thousands of digits
        raise ValueError(f"trace file is not valid JSON: {str(exc)[:120]}") from None
    if not isinstance(doc, dict):
        raise ValueError("trace must be a JSON object")
    if _depth(doc, MAX_DEPTH) > MAX_DEPTH:
        raise ValueError(f"trace JSON is nested deeper than {MAX_DEPTH} levels")
    if doc.get("format") != FORMAT:
        raise ValueError(f"not a decoding-playground trace (format must be {FORMAT!r})")
    version = doc.get("version")
    if type(version) is not int or version not in VERSIONS:
        raise ValueError(f"unsupported trace version {repr(version)[:40]}; expected one of {VERSIONS}")
    return doc


def import_trace(data: bytes | str, max_bytes: int = MAX_BYTES) -> dict:
    """Parse and validate an uploaded trace; raise ``ValueError`` with a clear message.

    Returns a clean version-2 document: the known document keys, and per result
    the known result keys with validated events.
    """
    doc = _parse(data, max_bytes)
    results = doc.get("results")
    if not isinstance(results, list) or not results:
        raise ValueError("trace has no results list")
    if len(results) > MAX_RESULTS:
        raise ValueError(f"trace has {len(results)} results; the limit is {MAX_RESULTS}")
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
        for j, e in enumerate(r["events"]):
            check_event(e, f"results[{i}].events[{j}]")
    return clean
