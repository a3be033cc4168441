"""The Jacobi view (visualize/iterations.py) and the upgrade of version-1 traces (visualize/legacy.py)."""

from __future__ import annotations

import copy
import re
import subprocess
import sys

import pytest

from visualize.iterations import (FOCUS_ROWS, MAX_CELLS, STEP_POSITIONS, WINDOW, frame, has_iterations,
                              jacobi_heatmap, jacobi_view, rows)
from visualize.legacy import upgrade


def it(step, block, iteration, start, guess, converged, committed=-1, probs=()):
    e = {"type": "JacobiIteration", "step": step, "block": block, "iteration": iteration, "start": start,
         "guess": list(guess), "converged": converged, "probs": list(probs)}
    if committed >= 0:
        e["committed"] = committed
    return e


def commit(step, position, token):
    return {"type": "TokenCommitted", "step": step, "position": position, "token": token, "source": "jacobi"}


def result(variant, events, token_ids, vocab=None, pieces=None):
    return {"strategy": "jacobi", "params": {"variant": variant}, "token_ids": token_ids, "events": events,
            "vocab": vocab or {}, "pieces": pieces or []}


def cells(html_text: str) -> dict[int, list[str]]:
    """position -> the states of its cells, top to bottom."""
    found: dict[int, list[str]] = {}
    for state, pos in re.findall(r"<td data-state='(\w+)' data-pos='(\d+)'", html_text):
        found.setdefault(int(pos), []).append(state)
    return found


def labels(html_text: str) -> list[str]:
    return re.findall(r"<tr class='dp-jc-row[^']*' data-step='\d+'><th class='dp-jc-label'>([^<]*)</th>", html_text)


# --------------------------------------------------------------------------- cells and labels

# Final output 10 11 12 13 14. One block of 4 after the prefill token: iteration 1 gets position 1
# (always) and position 3 (out of order: "early"), iteration 2 everything; iteration 3 confirms.
BLOCK = [it(2, 1, 1, 1, [11, 99, 13, 98], 1, 0), it(3, 1, 2, 1, [11, 12, 13, 14], 2, 0),
         it(4, 1, 3, 1, [11, 12, 13, 14], 4, 0), it(5, 1, 4, 1, [11, 12, 13, 14], 4, 4)]
FINAL = [10, 11, 12, 13, 14]


def test_early_correct_guesses_are_marked_before_their_prefix_is_verified():
    view = cells(jacobi_view(result("hybrid", BLOCK, FINAL)))
    assert view[1] == ["verified", "verified", "verified", "committed"]
    assert view[2] == ["wrong", "verified", "verified", "committed"]
    assert view[3] == ["early", "early", "verified", "committed"]     # right at iteration 1, proven at 3
    assert view[4] == ["wrong", "early", "verified", "committed"]
    assert 0 not in view                                                 # the prefill token has no row


def test_positions_after_the_output_are_past_not_wrong():
    # the paper's fixed-length jacobi decoded 4 positions, the output ended at position 2 (EOS)
    events = [it(2, 1, 1, 1, [11, 2, 7, 7], 1, 0), it(3, 1, 2, 1, [11, 2, 8, 8], 4, 4)]
    view = cells(jacobi_view(result("jacobi", events, [10, 11, 2])))
    assert view[2] == ["early", "committed"] and view[3] == ["past", "past"] and view[4] == ["past", "past"]


def test_labels_follow_the_variant():
    assert labels(jacobi_view(result("hybrid", BLOCK, FINAL))) == [f"block 1 · iteration {k}" for k in (1, 2, 3, 4)]
    assert labels(jacobi_view(result("gs_jacobi", BLOCK, FINAL)))[0] == "block 1 · iteration 1"
    assert labels(jacobi_view(result("jacobi", BLOCK, FINAL))) == [f"iteration {k}" for k in (1, 2, 3, 4)]
    # a sliding window: every row says where the window was, not "block 1"
    sliding = [it(2, 1, 1, 1, [11, 99, 98], 1, 0), it(3, 1, 2, 1, [11, 12, 99], 2, 1),
               it(4, 1, 3, 2, [12, 13, 14], 2, 3)]
    assert labels(jacobi_view(result("sliding", sliding, FINAL))) == [
        "iteration 1 · window 1–3", "iteration 2 · window 1–3", "iteration 3 · window 2–4"]
    # the whole-output block restarted by max_iterations: two blocks, so the block is named
    restarted = [it(2, 1, 1, 1, [11, 9], 1, 1), it(3, 2, 1, 2, [12, 13], 1, 0)]
    assert labels(jacobi_view(result("jacobi", restarted, FINAL)))[1] == "block 2 · iteration 1"


def test_every_text_is_escaped():
    evil = "<script>alert(1)</script>"
    res = result("<b>sliding</b>", BLOCK, FINAL, vocab={"99": evil, "11": "'\"&"}, pieces=[evil] * 5)
    page = jacobi_view(res)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "<b>" not in page
    fig = jacobi_heatmap(res)
    texts = [t for grid in (fig.data[0].text, fig.data[0].customdata) for row in grid for t in row]
    assert not any("<script" in str(t) for t in texts) and any("&lt;script" in str(t) for t in texts)


def test_heatmap_has_token_text_in_cells_and_unique_rows():
    res = result("hybrid", BLOCK, FINAL, vocab={"13": "Mon"}, pieces=["a", "b", "c", "Mon", "e"])
    fig = jacobi_heatmap(res)
    trace = fig.data[0]
    assert trace.type == "heatmap" and trace.texttemplate == "%{text}"
    assert list(trace.x) == [0, 1, 2, 3, 4] and len(set(trace.y)) == len(trace.y) == 4
    assert trace.text[2][3] == "Mon"                       # iteration 3, position 3
    assert "Jacobi: guesses per iteration" in fig.layout.title.text


# --------------------------------------------------------------------------- large outputs and replay

def sliding_run(n: int, width: int = 8) -> dict:
    """A sliding window over n positions committing one token per forward."""
    events = [it(k + 1, 1, k, k, [100 + p for p in range(k, min(n, k + width))], 1, 1) for k in range(1, n)]
    return result("sliding", events, [100 + p for p in range(n)])


def whole_output_run(n: int) -> dict:
    """The paper's jacobi on n positions: iteration k fixes position k."""
    events = [it(k + 1, 1, k, 1, [100 + p if p <= k else 7 for p in range(1, n)], k, n - 1 if k == n - 1 else 0)
              for k in range(1, n)]
    return result("jacobi", events, [100 + p for p in range(n)])


@pytest.mark.parametrize("n", [64, 512])
def test_long_sliding_run_scrolls_with_every_position(n):
    res = sliding_run(n)
    page = jacobi_view(res)
    assert len(re.findall(r"<th data-pos=", page)) == n                 # every position has a column
    assert len(labels(page)) == n - 1 and "dp-jc-scroll" in page
    assert len(page) < 1_000 * n                                        # sparse rows: no n x n grid
    assert sum(s.count("committed") for s in cells(page).values()) == n - 1


def test_very_wide_run_focuses_instead_of_drawing_everything():
    res = whole_output_run(512)
    assert sum(len(r.tokens) for r in rows(res)) > MAX_CELLS
    page = jacobi_view(res)
    assert len(re.findall(r"<th data-pos=", page)) == WINDOW and "Showing positions 0–" in page
    assert len(labels(page)) == FOCUS_ROWS


def test_replay_step_focuses_on_that_steps_window():
    res = sliding_run(512)
    fr = frame(res, step=301)
    assert fr.current is not None and fr.current.step == 301
    assert fr.lo <= fr.current.start and fr.current.end <= fr.hi and fr.hi - fr.lo == WINDOW
    assert all(r.step <= 301 for r in fr.rows) and len(fr.rows) == FOCUS_ROWS
    page = jacobi_view(res, step=301)
    assert page.count("dp-jc-row dp-jc-current") == 1
    fig = jacobi_heatmap(res, step=301)
    assert len(fig.data[0].x) == STEP_POSITIONS and fr.current.start in list(fig.data[0].x)


def test_has_iterations():
    assert has_iterations(result("hybrid", BLOCK, FINAL))
    assert not has_iterations({"events": [commit(1, 0, 5)]})


# --------------------------------------------------------------------------- version-1 traces

def v1_doc() -> dict:
    old_sliding = [commit(1, 0, 10), it(2, 1, 1, 1, [11, 9], 1), commit(2, 1, 11),
                   it(3, 1, 2, 2, [12, 13], 2), commit(3, 2, 12), commit(3, 3, 13)]
    results = [{"strategy": "greedy", "params": {}, "token_ids": [10, 11, 12, 13], "events": []}]
    for variant in ("gs_jacobi", "jacobi", "hybrid", None):
        params = {"block_size": 2} if variant is None else {"block_size": 2, "variant": variant, "init": "pad"}
        results.append({"strategy": "jacobi", "params": params, "token_ids": [10, 11, 12, 13],
                        "events": copy.deepcopy(old_sliding)})
    return {"format": "decoding-playground-trace", "version": 1, "results": results}


def test_upgrade_renames_v1_variants_and_sets_version_2():
    doc = v1_doc()
    before = copy.deepcopy(doc)
    new = upgrade(doc)
    assert doc == before                                              # the input is not mutated
    assert new["version"] == 2 and new["results"][0] == doc["results"][0]
    got = [(r["params"]["variant"], r["upgraded_from"]["variant"]) for r in new["results"][1:]]
    assert got == [("sliding", "gs_jacobi"), ("gs_jacobi", "jacobi"), ("gs_jacobi_eos_exit", "hybrid"),
                   ("sliding", "gs_jacobi")]                          # no variant: the v1 default
    assert new["results"][4]["params"]["init"] == "repeat"           # ... with the v1 default init
    its = [e for e in new["results"][1]["events"] if e["type"] == "JacobiIteration"]
    assert [e["committed"] for e in its] == [1, 2]                    # from the same forward's commits
    assert upgrade(new) is new                                        # version 2 passes through


@pytest.mark.parametrize("bad", [{"version": 3}, {"version": True}, {"version": "1"}, {}, []])
def test_upgrade_refuses_what_it_cannot_read(bad):
    with pytest.raises(ValueError, match="version|object"):
        upgrade(bad)


def test_v1_sliding_trace_draws_with_window_labels_and_commits():
    res = upgrade(v1_doc())["results"][1]
    page = jacobi_view(res)
    assert labels(page) == ["iteration 1 · window 1–2", "iteration 2 · window 2–3"]
    assert cells(page)[1] == ["committed"] and cells(page)[3] == ["committed"]
    raw = v1_doc()["results"][1]                     # not upgraded: committed is derived the same way
    assert cells(jacobi_view(raw)) == cells(page)


def test_visualize_modules_do_not_import_torch():
    code = ("import sys, visualize.iterations, visualize.legacy\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)
