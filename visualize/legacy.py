"""Reading traces written by older versions (pure Python: no torch, no decoding imports).

Version 2 of the trace format renamed the Jacobi variants after the paper
(Santilli et al. 2023) and changed their stopping rule. A version-1 document
keeps the iterations it recorded; only its names move:

* v1 ``gs_jacobi`` (the sliding window that committed every verified token)
  is ``sliding``;
* v1 ``jacobi`` (blocks in sequence, each iterated until verified) is
  ``gs_jacobi``, the paper's blocks-in-sequence algorithm;
* v1 ``hybrid`` ended a block at the first verified EOS, before the block
  converged. The paper's HGJ checks EOS only in a converged block, so the v1
  run is not HGJ: it becomes ``gs_jacobi_eos_exit``, a name for what it did.

A Jacobi result without a variant ran the v1 default, ``gs_jacobi`` with
``repeat`` init, and says so after the upgrade. Every renamed result keeps its
old name under ``upgraded_from``. Version-1 ``JacobiIteration`` events lack
``committed`` (how many leading guesses the iteration decided for good); it is
filled in from the ``TokenCommitted`` events of the same forward.
"""

from __future__ import annotations

from bisect import bisect_left


V1_VARIANTS = {"gs_jacobi": "sliding", "jacobi": "gs_jacobi", "hybrid": "gs_jacobi_eos_exit"}
V1_DEFAULTS = {"variant": "gs_jacobi", "init": "repeat"}


def committed_counts(events: list) -> dict[int, int]:
    """For each JacobiIteration (by index in ``events``), the guesses its forward committed.

    Counts the ``TokenCommitted`` events stamped with the iteration's step whose
    position lies in the iteration's block: what a version-1 trace recorded. Positions
    are sorted per step once, so each iteration costs a binary search, not a scan
    (a trace of many commits at one step stays linear).
    """
    by_step: dict[int, list[int]] = {}
    for e in events:
        if isinstance(e, dict) and e.get("type") == "TokenCommitted" and isinstance(e.get("position"), int):
            by_step.setdefault(e.get("step"), []).append(e["position"])
    for positions in by_step.values():
        positions.sort()
    counts: dict[int, int] = {}
    for i, e in enumerate(events):
        if isinstance(e, dict) and e.get("type") == "JacobiIteration":
            start, size = e.get("start", 0), len(e.get("guess") or ())
            start = start if isinstance(start, (int, float)) else 0
            positions = by_step.get(e.get("step"), ())
            counts[i] = bisect_left(positions, start + size) - bisect_left(positions, start)
    return counts


def _upgrade_result(result: dict) -> dict:
    params = result.get("params")
    params = dict(params) if isinstance(params, dict) else {}
    for key, value in V1_DEFAULTS.items():
        params.setdefault(key, value)
    old = params["variant"]
    params["variant"] = V1_VARIANTS.get(old, old) if isinstance(old, str) else old
    new = dict(result, params=params, upgraded_from={"version": 1, "variant": old})
    events = result.get("events")
    if isinstance(events, list):
        counts = committed_counts(events)
        new["events"] = [dict(e, committed=counts[i]) if i in counts and "committed" not in e else e
                         for i, e in enumerate(events)]
    return new


def upgrade(doc: dict) -> dict:
    """A version-1 trace document as version 2; a version-2 one unchanged. Never mutates ``doc``.

    Only Jacobi results change (see the module docstring). Raises ``ValueError``
    for a document that is not an object or has another version.
    """
    if not isinstance(doc, dict):
        raise ValueError("trace must be a JSON object")
    version = doc.get("version")
    if version == 2 and not isinstance(version, bool):
        return doc
    if version != 1 or isinstance(version, bool):
        raise ValueError(f"unsupported trace version {version!r}; expected 1 or 2")
    results = doc.get("results")
    if isinstance(results, list):
        results = [_upgrade_result(r) if isinstance(r, dict) and r.get("strategy") == "jacobi" else r
                   for r in results]
    return dict(doc, version=2, results=results) if "results" in doc else dict(doc, version=2)
