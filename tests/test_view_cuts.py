"""A view that shows less than its input says so, visibly and escaped, and builds only what it shows
(issue 25). The largest traces are drawn under a memory cap in test_view_limits.py; these are the
per-view checks, small enough to run in-process."""

from __future__ import annotations

import tracemalloc

import pytest

from visualize import acceptance, beams, charts, crosstok, drafts, filters, iterations, legacy, masks, page, windows
from visualize import tokens, trees

EVIL = "<img src=x onerror=alert(1)>"


def _lookahead(step, window, candidates=(), accepted=(1,)):
    return {"type": "LookaheadStep", "step": step, "position": 1, "window": window, "pool_size": 9,
            "candidates": list(candidates), "accepted_candidate": 0 if candidates else -1, "accepted": list(accepted)}


def _result(events, **over):
    r = {"strategy": "x", "label": "x", "token_ids": [1, 2, 3], "pieces": ["a", "b", "c"],
         "vocab": {str(i): f"w{i}" for i in range(50)}, "events": events}
    return {**r, **over}


def _peak_mb(fn) -> float:
    """Peak memory Python allocated while ``fn`` ran, in MB."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


# --------------------------------------------------------------------------- what each cut view says
def test_the_mask_draws_the_first_part_of_a_large_step_and_says_what_it_left_out():
    paths = [[i, i + 1] for i in range(100)]
    fig = masks.mask_figure(_result([_lookahead(1, [list(range(300))] * 3, paths)]), 1)
    heat = fig.data[0]
    assert len(heat.z) == len(heat.x) == masks.MAX_ROWS and all(len(row) == masks.MAX_ROWS for row in heat.z)
    nodes = sum(1 for label in heat.x if label.startswith("b"))
    columns = sum(1 for label in heat.x if label.startswith("L0c"))
    title = fig.layout.title.text
    merged = len(masks.paths_tree(paths[:masks.MAX_PATHS])[0])
    assert f"branch of the first {masks.MAX_PATHS} of 100 n-grams" in title
    assert f"first {nodes} of {merged} branch nodes" in title and f"first {columns} of 300 columns of 3 of 3" in title
    _, parents = masks.paths_tree(paths[:masks.MAX_PATHS])
    allowed, _, _ = masks.step_layout(1, parents[:nodes], 3, columns)
    assert [[c != 0 for c in row] for row in heat.z] == allowed       # the same cells as the whole step's mask


@pytest.mark.parametrize("branch", [0, 40, 300])
@pytest.mark.parametrize("levels,width", [(7, 32), (128, 256), (1, 65_532), (65_530, 1), (2, 3), (0, 0)])
def test_the_mask_keeps_every_level_it_can_and_the_first_columns(branch, levels, width):
    nodes, lv, w = masks.shown_sizes(branch, levels, width)
    assert 1 + nodes + lv * w <= masks.MAX_ROWS and nodes <= branch and lv <= levels and w <= width
    if 1 + branch + levels * width <= masks.MAX_ROWS:
        assert (nodes, lv, w) == (branch, levels, width)               # a step that fits is drawn whole
    else:
        assert 1 + nodes + lv * w == masks.MAX_ROWS or (nodes == branch and (lv, w) != (levels, width))
        assert lv == min(levels, masks.MAX_LEVELS) or lv * w == levels * width
        assert nodes >= min(branch, (masks.MAX_ROWS - 1) // 2)       # the branch keeps at least half


def test_the_lookahead_tables_and_chart_say_what_they_leave_out():
    big = _lookahead(1, [list(range(100))] * 70, [list(range(70))] * 80, list(range(90)))
    steps = [big] + [_lookahead(s, [[1]], [[1]], [1]) for s in range(2, windows.MAX_STEPS + 10)]
    r = _result(steps, vocab={"1": EVIL * 40})
    html = windows.lookahead_step_html(r, 1)
    assert "Showing the first 64 of 70 window levels, first 64 of 100 columns." in html
    assert "Showing the first 64 of 80 n-grams, first 64 of 70 tokens of each n-gram, first 64 of 90 committed" in html
    assert "<img" not in windows.lookahead_step_html(r, 5) and "…" in windows.lookahead_step_html(r, 5)
    fig = windows.lookahead_figure(r)
    assert f"(first {windows.MAX_STEPS} of {len(steps)} steps)" in fig.layout.title.text
    assert len(fig.data[0].x) == windows.MAX_STEPS
    assert all(len(t) <= 2 * windows.MAX_HOVER for t in fig.data[1].hovertext)


def test_trees_beams_sampling_and_the_inspector_say_what_they_leave_out():
    n = trees.MAX_NODES + 72
    tree = {"type": "DraftTree", "step": 1, "position": 1, "tokens": list(range(n)), "parents": [-1] * n,
            "q": [0.5] * n, "accepted": [0], "next_token": 5, "mask_size": n + 1, "source": "prophet"}
    title = trees.tree_figure(_result([tree]), 1).layout.title.text
    assert f"of {n} nodes (the first {trees.MAX_NODES} shown)" in title
    step = {"type": "BeamStep", "step": 1, "tokens": [[i] for i in range(40)], "scores": [-1.0] * 40, "finished": 0}
    assert f"the first {beams.MAX_BEAMS} of 40 beams" in beams.beam_figure(_result([step])).layout.title.text
    k = filters.MAX_BARS + 36
    sample = {"type": "SamplingFilter", "step": 1, "position": 1, "tokens": list(range(k)), "p_raw": [0.5] * k,
              "chosen": k - 1}
    fig = filters.sampling_figure(_result([sample]))
    assert f"{filters.MAX_BARS + 1} of its {k} tokens shown" in fig.layout.title.text
    assert len(fig.data[0].x) == filters.MAX_BARS + 1 and fig.data[0].x[-1].startswith("★")   # the drawn token
    dist = {"type": "Distribution", "step": 1, "position": 2, "tokens": list(range(k)), "p_target": [0.1] * k}
    fig = acceptance.inspector(_result([dist], vocab={"3": EVIL * 100}), 2)
    assert f"(the first {acceptance.MAX_TOKENS} of {k} tokens)" in fig.layout.title.text
    assert len(fig.data[0].x) == acceptance.MAX_TOKENS and "<" not in "".join(fig.data[0].x)
    assert max(len(x) for x in fig.data[0].x) < 60


def test_the_timeline_and_the_sweep_say_what_they_leave_out():
    forward = {"type": "ForwardPass", "step": 1, "model": "target", "positions": 1, "ms": 1.0}
    results = [_result([forward] * 600, strategy=f"s{i}") for i in range(16)]
    fig = charts.forward_timeline(results)
    per_row = charts.MAX_TIMELINE // (charts.MAX_MODELS * 16)
    assert f"(first {per_row} per row)" in fig.layout.title.text and sum(len(t.x) for t in fig.data) == 16 * per_row
    points = [{"values": [x, y], "speedup": 1.0} for x in range(70) for y in range(3)]
    fig = charts.sweep_figure({"strategy": "s", "keys": ["a", EVIL], "points": points})
    assert "(the first 64 × 3 values)" in fig.layout.title.text and len(fig.data[0].z[0]) == 64
    assert "<img" not in fig.to_json()


def test_jacobi_says_which_positions_and_iterations_it_shows():
    far = {"type": "JacobiIteration", "step": 1, "block": 0, "iteration": 0, "start": 10**6, "guess": [5],
           "converged": 0, "committed": 0}
    view = iterations.jacobi_view(_result([far]))
    assert "Showing positions 0–47 of 1000001" in view and view.count("<th data-pos=") == iterations.WINDOW
    many = [dict(far, step=s, start=s % 50) for s in range(1, 1100)]
    assert "Showing positions 0–" in iterations.jacobi_view(_result(many))           # over MAX_ROWS: focused
    html = page.step_html({"results": [_result(many)]}, None)["jacobi"]
    assert f"The first {page.MAX_JACOBI_ROWS} of 1099 Jacobi iterations are drawn." in html


def test_columns_copied_drafts_and_cross_tokenizer_drafts_say_what_they_leave_out():
    long = EVIL * 200
    r = _result([{"type": "TokenCommitted", "step": 1, "position": 0, "token": 1, "source": "greedy"}],
                pieces=[long], params={f"k{i}": long for i in range(20)})
    html = tokens.columns_html([r])
    assert f"({len(long)} characters, the first {tokens.MAX_PIECE} shown)" in html and "…" in html
    assert "<img" not in html and len(html) < 12_000
    copies = [{"type": "DraftSource", "step": s, "position": s, "tokens": [1] * 200, "match_at": 0, "match_len": 2,
               "copied": 100} for s in range(1, 61)]
    html = drafts.sources_html(_result(copies, vocab={"1": long}))
    assert f"… {60 - drafts.MAX_ROWS} earlier drafts not shown …" in html and "<img" not in html
    assert html.count("dp-copied") == drafts.MAX_ROWS * (drafts.MAX_WINDOW - 2)
    b = 60_000
    cross = {"type": "DraftTranslated", "step": 1, "position": 0, "text": [60] * b, "assistant_tokens": [1],
             "assistant_ends": [b], "target_tokens": [2], "target_ends": [b]}
    html = crosstok.crosstok_html(_result([cross]), 1)
    assert f"{b - crosstok.MAX_BYTES} more bytes not drawn" in html and len(html) < 20 * crosstok.MAX_BYTES


# --------------------------------------------------------------------------- built only what they show
def test_a_frame_builds_only_the_items_it_draws():
    n = 60_000
    r = _result([{"type": "TokenCommitted", "step": i, "position": i, "token": 1, "source": "greedy"}
                 for i in range(n)], token_ids=[1] * n, pieces=["p"] * n)
    assert _peak_mb(lambda: tokens.tokens_html(r, None, limit=100)) < 8   # every item built: about 25 MB


def test_the_copied_drafts_view_builds_only_the_rows_it_draws():
    copies = [{"type": "DraftSource", "step": s, "position": s, "tokens": list(range(90)), "match_at": 0,
               "match_len": 2, "copied": 80} for s in range(1, 20_000)]
    r = _result(copies)
    assert _peak_mb(lambda: drafts.sources_html(r)) < 4                    # every row built: about 40 MB


def test_the_beam_view_builds_only_the_steps_it_draws():
    steps = [{"type": "BeamStep", "step": s, "tokens": [[b] for b in range(32)], "scores": [-1.0] * 32, "finished": 0}
             for s in range(1, 5000)]
    r = _result(steps)
    assert len(beams.beam_tree(r, last=beams.WINDOW)) <= beams.WINDOW * beams.MAX_BEAMS
    assert _peak_mb(lambda: beams.beam_figure(r)) < 8                      # every step's beams: about 60 MB


class _Position(int):
    """A position that counts how often it is compared."""
    seen = 0

    def _count(self, other, compare):
        _Position.seen += 1
        return compare(int(self), int(other))

    def __lt__(self, other):
        return self._count(other, int.__lt__)

    def __le__(self, other):
        return self._count(other, int.__le__)

    def __gt__(self, other):
        return self._count(other, int.__gt__)

    def __ge__(self, other):
        return self._count(other, int.__ge__)


def test_version_one_commit_counts_cost_n_log_n_not_iterations_times_commits():
    n = 4000
    commits = [{"type": "TokenCommitted", "step": 1, "position": _Position(p), "token": 1, "source": "jacobi"}
               for p in range(n - 1, -1, -1)]
    its = [{"type": "JacobiIteration", "step": 1, "start": s, "guess": [1, 2, 3]} for s in range(0, n, 5)]
    _Position.seen = 0
    counts = legacy.committed_counts(commits + its)
    assert [counts[len(commits) + i] for i in range(len(its))] == [3] * len(its)
    assert _Position.seen < 10 * (n + len(its)) * n.bit_length()     # a scan per iteration: 800 x 4000 x 2
