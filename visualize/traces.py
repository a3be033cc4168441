"""Trace export and import: one JSON document per run, validated on the way in.

Uploads are JSON only (never pickle), capped in size and nesting depth, and
checked against the schema: a results list whose entries carry the keys the
views need, and events that ``decoding.events.event_from_dict`` accepts. No
model is needed to replay an imported trace.
"""

from __future__ import annotations

import json
from typing import Any

from decoding.events import event_from_dict  # pure dataclasses; no torch

FORMAT = "decoding-playground-trace"
VERSION = 1
MAX_BYTES = 20 * 2**20
MAX_DEPTH = 12
MAX_RESULTS = 16
MAX_EVENTS = 200_000
REQUIRED = {"strategy": str, "token_ids": list, "events": list}


def export_trace(doc: dict) -> str:
    """Serialize a run document (environment, prompt, prompt_ids, results)."""
    return json.dumps({"format": FORMAT, "version": VERSION, **doc})


def _depth(value: Any, limit: int) -> int:
    stack, deepest = [(value, 1)], 1
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return deepest


def import_trace(data: bytes | str) -> dict:
    """Parse and validate an uploaded trace; raise ``ValueError`` with a clear message."""
    size = len(data.encode("utf-8") if isinstance(data, str) else data)
    if size > MAX_BYTES:
        raise ValueError(f"trace file is {size / 2**20:.1f} MB; the limit is {MAX_BYTES // 2**20} MB")
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"trace file is not valid JSON: {exc}") from None
    except RecursionError:
        raise ValueError(f"trace JSON is nested deeper than {MAX_DEPTH} levels") from None
    if not isinstance(doc, dict):
        raise ValueError("trace must be a JSON object")
    if _depth(doc, MAX_DEPTH) > MAX_DEPTH:
        raise ValueError(f"trace JSON is nested deeper than {MAX_DEPTH} levels")
    if doc.get("format") != FORMAT:
        raise ValueError(f"not a decoding-playground trace (format must be {FORMAT!r})")
    if doc.get("version") != VERSION:
        raise ValueError(f"unsupported trace version {doc.get('version')!r}; expected {VERSION}")
    results = doc.get("results")
    if not isinstance(results, list) or not results:
        raise ValueError("trace has no results list")
    if len(results) > MAX_RESULTS:
        raise ValueError(f"trace has {len(results)} results; the limit is {MAX_RESULTS}")
    for i, r in enumerate(results):
        if not isinstance(r, dict):
            raise ValueError(f"results[{i}] must be an object")
        for key, typ in REQUIRED.items():
            if not isinstance(r.get(key), typ):
                raise ValueError(f"results[{i}].{key} is missing or not a {typ.__name__}")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in r["token_ids"]):
            raise ValueError(f"results[{i}].token_ids must be integers")
        if len(r["events"]) > MAX_EVENTS:
            raise ValueError(f"results[{i}] has too many events (limit {MAX_EVENTS})")
        for j, e in enumerate(r["events"]):
            try:
                event_from_dict(e)
            except ValueError as exc:
                raise ValueError(f"results[{i}].events[{j}]: {exc}") from None
        for key in ("pieces",):
            if key in r and not (isinstance(r[key], list) and all(isinstance(p, str) for p in r[key])):
                raise ValueError(f"results[{i}].{key} must be a list of strings")
        if "vocab" in r and not isinstance(r["vocab"], dict):
            raise ValueError(f"results[{i}].vocab must be an object")
    return doc
