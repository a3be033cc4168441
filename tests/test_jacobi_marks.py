"""The Jacobi view's convergence marks (fast-forwarded and stationary tokens) and per-block figures,
on hand-written iterations whose every mark is worked out in the comments."""

from __future__ import annotations

import re

from visualize.convergence import MARKS, block_figures
from visualize.iterations import jacobi_view, rows

FINAL = [10, 11, 12, 13, 14, 15, 16, 17, 18]    # position 0 came from the prefill


def _it(step, block, iteration, start, guess, converged, committed):
    return {"type": "JacobiIteration", "step": step, "block": block, "iteration": iteration, "start": start,
            "guess": guess, "converged": converged, "committed": committed}


EVENTS = [
    # block 1 (positions 1-4, final 11 12 13 14)
    _it(2, 1, 1, 1, [11, 99, 98, 14], 1, 0),   # 11 newly right alone (99 after it is wrong); 14 newly right alone
    _it(3, 1, 2, 1, [11, 12, 97, 14], 2, 0),   # 12 newly right alone; 14 kept while 97 before it is wrong: stationary
    _it(4, 1, 3, 1, [11, 12, 13, 14], 4, 0),   # 13 newly right, its neighbours were right already: no mark
    _it(5, 1, 4, 1, [11, 12, 13, 14], 4, 4),   # the confirming iteration: nothing new
    # block 2 (positions 5-8, final 15 16 17 18)
    _it(6, 2, 1, 5, [15, 16, 17, 0], 1, 0),    # 15 16 17 newly right together: fast-forwarded, all three
    _it(7, 2, 2, 5, [15, 16, 17, 18], 4, 0),   # 18 newly right alone
    _it(8, 2, 3, 5, [15, 16, 17, 18], 4, 4),
]
DOC = {"params": {"variant": "hybrid"}, "token_ids": FINAL, "events": EVENTS,
       "vocab": {str(t): f"<t{t}>" for t in FINAL + [0, 97, 98, 99]}}


def _marks(page: str) -> list[tuple[str, str]]:
    return [(m, p) for p, m in re.findall(r"data-pos='(\d+)' data-mark='(\w+)'", page)]


def test_fast_forwarded_and_stationary_tokens_are_marked():
    page = jacobi_view(DOC)
    assert sorted(_marks(page)) == [("ff", "5"), ("ff", "6"), ("ff", "7"), ("stay", "4")]
    for text, _ in MARKS.values():                     # the legend names both
        assert text in page
    assert "<t" not in page.replace("<td", "").replace("<tr", "").replace("<th", "").replace("<tbody", "") \
        .replace("<thead", "").replace("<table", "")   # token text is escaped


def test_marks_need_the_blocks_previous_iteration():
    # the same block 2 guess seen as a new block's first iteration (no previous): still fast-forwarded;
    # a row kept from the previous iteration of *another* block is not "kept"
    rs = rows(DOC)
    assert rs[4].prev is None and rs[5].prev is rs[4] and rs[1].prev is rs[0]


def test_per_block_figures():
    assert block_figures(rows(DOC)) == [(1, 4, 4), (2, 3, 4)]
    page = jacobi_view(DOC)
    assert "4 it → 1.0 tok/fwd · 3 it → 1.3 tok/fwd" in page
    # at a replay step the figures cover the iterations up to it
    assert "4 it → 1.0 tok/fwd" in jacobi_view(DOC, step=5) and "3 it" not in jacobi_view(DOC, step=5)


def test_jacobi_stats_report_iterations_and_tokens_per_block():
    # the scripted models of test_jacobi.py, whose iteration counts are worked out there: a chain takes
    # 4 iterations per block of 4; independent tokens 2 (right, then the confirming one)
    from decoding.events import event_to_dict
    from test_jacobi import run, scripted
    for depth, its in ((1, 4), (0, 2)):
        res, events = run(scripted([depth] * 13), "hybrid")
        assert res.stats["iterations_per_block"] == [its] * 3 and res.stats["tokens_per_block"] == [4] * 3
        assert res.stats["mean_iterations_per_block"] == its
        doc = {"params": {"variant": "hybrid"}, "token_ids": res.token_ids,
               "events": [event_to_dict(e) for e in events]}
        assert block_figures(rows(doc)) == [(b, its, 4) for b in (1, 2, 3)]     # the view counts the same
    res, _ = run(scripted([0] * 13), "sliding")          # windows: change all 4, then keep all 4
    assert res.stats["iterations_per_block"] == [2] * 3 and res.stats["tokens_per_block"] == [4] * 3
