"""Traces at the limits of the trace import (visualize/checks.py, visualize/traces.py), for test_view_limits.py.

Each builder returns a document as an upload would hold it: the most numbers one event may hold in
every shape its type allows, the most events, results and entries, the longest strings (with markup
in them), the deepest and widest trees, and the issue's crafted lookahead steps.
"""

from __future__ import annotations

M = 65_536                       # numbers in one event (visualize.checks.MAX_ITEMS)
EVIL = "<img src=x onerror=alert(1)>"


def make_result(name: str, events: list, n: int = 64, vocab_text: str = "w", **over) -> dict:
    ids = [i % 1000 for i in range(n)]
    r = {"strategy": name, "label": name, "token_ids": ids, "pieces": [f"{vocab_text}{i}" for i in ids],
         "vocab": {str(i): f"{vocab_text}{i}" for i in range(1000)}, "events": events, "wall_s": 2.0,
         "tokens_per_s": 32.0, "speedup": 1.0, "target_forwards": 40, "lossless": True, "stats": {}}
    r.update(over)
    return r


def make_doc(*results: dict, **over) -> dict:
    return {"format": "decoding-playground-trace", "version": 2, "prompt": "p", "results": list(results), **over}


def room(event: dict) -> int:
    """The numbers an event's tuples may hold: the checks count every scalar field given as one number too."""
    return M - sum(1 for k, v in event.items() if k != "type" and v is not None and not isinstance(v, list))


def lookahead_step(step: int, window: list, candidates: list = (), accepted: list = (1,)) -> dict:
    return {"type": "LookaheadStep", "step": step, "position": 1, "window": window, "pool_size": 9,
            "candidates": list(candidates), "accepted_candidate": 0 if candidates else -1, "accepted": list(accepted)}


def row(width: int, start: int = 0) -> list:
    return [(start + i) % 50_000 for i in range(width)]


WIDE = room(lookahead_step(1, [], accepted=()))      # the widest window row the checks accept: 65,532


def crafted_wide() -> dict:
    """The issue's first case: one lookahead step whose one window row is 65,536 wide (over the numbers cap
    with the step's scalar fields: refused by name)."""
    return make_doc(make_result("lookahead", [lookahead_step(1, [row(M)], accepted=())]))


def widest_row() -> dict:
    """The same, as wide as the checks accept."""
    return make_doc(make_result("lookahead", [lookahead_step(1, [row(WIDE)], accepted=())]))


def row_4000() -> dict:
    """The issue's measurement outside the app: one row 4,000 wide (the old mask: 297 MB, 1.1 s)."""
    return make_doc(make_result("lookahead", [lookahead_step(1, [row(4000)], accepted=())]))


def crafted_many() -> dict:
    """The issue's second case: 40 lookahead steps with 128 x 256 windows (about 5 MB)."""
    steps = [lookahead_step(s, [row(256, lv) for lv in range(128)]) for s in range(1, 41)]
    return make_doc(make_result("lookahead", steps))


def lookahead_shapes() -> dict:
    """A window of 65k one-token levels, 32k one-token n-grams, one 32k-token n-gram, 32k committed tokens,
    then 3000 small steps."""
    half = WIDE // 2
    small = [lookahead_step(s, [[1, 2]], [[1]], [1, 2]) for s in range(4, 3004)]
    return make_doc(make_result("lookahead", [lookahead_step(1, [[t % 997] for t in range(WIDE - 2)], [[5]], [5]),
                                      lookahead_step(2, [], [[t] for t in range(half)], row(WIDE - half)),
                                      lookahead_step(3, [row(8)] * 7, [row(half - 56)], row(WIDE - half))] + small))


def draft_tree(step: int, n: int, deep: bool) -> dict:
    return {"type": "DraftTree", "step": step, "position": 1, "tokens": row(n),
            "parents": list(range(-1, n - 1)) if deep else [-1] * n, "q": [0.5] * n,
            "accepted": list(range(n)) if deep else [0], "next_token": 5, "mask_size": n + 1, "source": "prophet"}


def chains_and_trees() -> dict:
    """Drafts of every shape: the longest chain, the deepest tree (a path), the widest (all on the root)."""
    deep, wide = draft_tree(2, (M - 5) // 4, True), draft_tree(3, (M - 6) // 3, False)
    chain = {"type": "DraftProposed", "step": 1, "position": 1, "source": "assistant"}
    n = room(chain) // 2
    chain.update(tokens=row(n), q=[0.5] * n)
    verified = [{"type": "TokenVerified", "step": 1, "position": 1 + i, "token": i, "accepted": i < 900,
                 "p_target": 0.5, "q_draft": 0.5} for i in range(1000)]
    dist = {"type": "Distribution", "step": 1, "position": 2}
    n = room(dist) // 4
    dist.update(tokens=row(n), p_target=[0.1] * n, q_draft=[0.2] * n, residual=[0.3] * n)
    timing = [{"type": "StepTiming", "step": s, "draft_ms": 1, "verify_ms": 2, "overhead_ms": 0, "drafted": 4096,
               "accepted": s % 4097} for s in range(1, 20_000)]
    return make_doc(make_result("prophet", [deep, wide]), make_result("speculative", [chain, dist] + verified + timing))


def beams_and_sampling() -> dict:
    """Beam steps of 32 long beams, of 32k one-token beams, 2000 of 32 one-token beams; a sampled position
    with 16k tokens."""
    beams = [{"type": "BeamStep", "step": s, "tokens": [[b] for b in range(32)], "scores": [-1.0] * 32,
              "finished": 0} for s in range(10, 2010)]
    beams += [{"type": "BeamStep", "step": s, "tokens": [row((M - 34) // 32 - 1, b) for b in range(32)],
              "scores": [-1.0] * 32, "finished": 0} for s in range(1, 7)]
    beams += [{"type": "BeamStep", "step": s, "tokens": [[t] for t in range((M - 2) // 2)],
               "scores": [-0.5] * ((M - 2) // 2), "finished": 1} for s in range(7, 10)]
    sample = {"type": "SamplingFilter", "step": 1, "position": 1, "chosen": 0, "top_k": 50, "kept": 1}
    k = room(sample) // 4
    sample.update(tokens=row(k), p_raw=[0.5] * k, p_temperature=[0.5] * k, p_final=[0.5] * k, chosen=row(k)[-1])
    return make_doc(make_result("beam", beams), make_result("sample", [sample]))


def iteration(step: int, start: int, guess: list, committed: int = 0) -> dict:
    e = {"type": "JacobiIteration", "step": step, "block": 0, "iteration": step, "start": start, "guess": guess,
         "converged": 1}
    if committed >= 0:
        e["committed"] = committed
    return e


def jacobi_copies_crosstok() -> dict:
    """Jacobi runs: one iteration at position 10**6 (the page's), 2000 narrow iterations whose committed counts
    come from 20,000 commits of one step (the version-1 rule), one 65k-wide guess; 5000 copied drafts,
    three of 65k tokens; a cross-tokenizer draft of 32k bytes under one target token."""
    far = [iteration(1, 10**6, [5])] + [iteration(s, s % 100, row(4, s)) for s in range(2, 40)]
    narrow = [iteration(1, s % 100, row(4, s), committed=-1) for s in range(2000)]
    commits = [{"type": "TokenCommitted", "step": 1, "position": p, "token": 1, "source": "jacobi"}
               for p in range(20_000)]
    wide = iteration(1, 0, [], committed=-1)
    wide["guess"] = row(room(wide))
    copies = [{"type": "DraftSource", "step": s, "position": s, "match_at": 5, "match_len": 3,
               "copied": M - 20 if s < 4 else 30} for s in range(1, 5000)]
    for c in copies:
        c["tokens"] = row(room(c) if c["step"] < 4 else 40)
    b = (M - 2) // 2
    cross = {"type": "DraftTranslated", "step": 1, "position": 0, "text": [60] * b,
             "assistant_tokens": row(b // 4), "assistant_ends": [4 * (i + 1) for i in range(b // 4)],
             "target_tokens": [7], "target_ends": [b]}
    return make_doc(make_result("jacobi", far, params={"variant": "sliding"}), make_result("jacobi2", narrow + commits),
                make_result("jacobi3", [wide]), make_result("suffix", copies), make_result("assistant", [cross]))


def most_events() -> dict:
    """200,000 events (the cap) over 16 results (the cap), with one time per event (just under 20 MB)."""
    results = []
    for k in range(16):
        events = []
        for i in range(12_500):
            step = i // 3 + 1
            events.append([{"type": "ForwardPass", "step": step, "model": "target", "positions": 1, "ms": 0.5},
                           {"type": "TokenCommitted", "step": step, "position": i, "token": i % 999,
                            "source": "greedy"},
                           {"type": "TokenVerified", "step": step, "position": i, "token": 3, "accepted": False,
                            "p_target": 0.5, "q_draft": 0.5}][i % 3])
        results.append(make_result(f"s{k}", events, n=12_500, pieces=[], times_ms=[i // 10 for i in range(12_500)]))
    return make_doc(*results)


def longest_strings() -> dict:
    """Every text at its cap, markup in all of them: 4096-character tokens, labels, parameters, a 1 MB prompt."""
    long = (EVIL * 200)[:4096]
    events = [{"type": "TokenCommitted", "step": 1 + i // 8, "position": i, "token": i, "source": "greedy"}
              for i in range(600)]
    events += [lookahead_step(3, [row(64)] * 7, [row(7, j) for j in range(32)], row(600)),
               {"type": "DraftTree", "step": 2, "position": 1, "tokens": row(128), "parents": [-1] * 128},
               *({"type": "DraftSource", "step": 2, "position": 1, "tokens": row(96), "match_at": 0,
                  "match_len": 4, "copied": 90} for _ in range(40)),
               {"type": "Distribution", "step": 2, "position": 1, "tokens": row(64), "p_target": [0.1] * 64},
               {"type": "BeamStep", "step": 2, "tokens": [row(16, b) for b in range(32)], "scores": [-1.0] * 32,
                "finished": 0},
               {"type": "JacobiIteration", "step": 2, "block": 0, "iteration": 0, "start": 0, "guess": row(48),
                "converged": 0, "committed": 0}]
    r = make_result(EVIL[:20], events, n=600, vocab_text="", label=long[:128], error=long,
                params={f"{EVIL}{i}"[:64]: long for i in range(64)})
    r["pieces"], r["vocab"] = [long] * 600, {str(i): long for i in range(600)}
    return make_doc(r, prompt=long * 256)


def long_params() -> dict:
    """16 results (the cap), each with 20 parameters of 4096 characters and a 4096-character error."""
    long = (EVIL * 200)[:4096]
    params = {f"k{i}": long for i in range(20)}
    return make_doc(*(make_result(f"p{k}", [], params=params, error=long) for k in range(16)))


def over_the_cap() -> dict:
    """One event over the numbers cap: refused with a named error, whatever its size."""
    return make_doc(make_result("lookahead", [lookahead_step(1, [row(WIDE + 1)], accepted=())]))
