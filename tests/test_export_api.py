"""Exports of a race (issue 40, item 2) through ``/export_race`` and ``gradio_client``, against a real server.

What would break it: frames that do not follow the race (a wrong clock, tokens drawn before they were committed,
the last tokens missing), an MP4 whose length is not the animation's (a frame-rate or duration slip), a bad
value accepted or refused without its name, an export computed beside a run instead of in the compute line.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from PIL import Image

from visualize import animation
from web.page_client import page_run

PROMPT = "Export test: name three rivers of Europe."


@pytest.fixture(scope="module")
def race(client, tiny_presets_file):
    """A real race (three strategies, 16 tokens) run by the page's /run: (race id, doc). Of the tiny preset
    (tests/tiny_preset.py): an export draws any model's race, and the recording is looked up by its id alone."""
    from tiny_preset import offered
    with offered(tiny_presets_file) as tiny:
        out = page_run(client, model=tiny, strategies=["greedy", "prompt_lookup", "lookahead"], prompt=PROMPT,
                       max_new_tokens=16, seed=0, page_defaults=True)
    assert len(out.race_id) == 16, (out.share, out.race_id)
    return out.race_id, out.document()


def _cells(frame: Image.Image, n: int) -> list[int]:
    return [animation.count_cells(frame, box) for box in animation.column_boxes(n)]


def test_the_gif_grows_with_the_race_frame_by_frame(client, race, app_state):
    race_id, doc = race
    started = app_state.line.counts()["started"]
    path = client.predict(race_id=race_id, format="gif", mode="steps", api_name="/export_race")
    assert app_state.line.counts()["started"] == started + 1          # it waited in the compute line
    results = doc["results"]
    schedule = animation.plan(doc, "steps")
    expected = [[animation.committed_at(r, clock, "steps") for r in results] for clock, _ in schedule]
    with Image.open(path) as gif:
        assert gif.format == "GIF" and gif.n_frames == len(schedule) >= 3
        seen = []
        for i in range(gif.n_frames):
            gif.seek(i)
            seen.append(_cells(gif, len(results)))
    assert seen[0] == [0] * len(results)                              # before the first forward: nothing
    assert seen[1] == expected[1] and min(seen[1]) >= 1               # the first committed token of each
    assert seen[-1] == [len(r["token_ids"]) for r in results]         # the last: every token, each column
    assert seen == expected                                           # and every frame in between
    again = client.predict(race_id=race_id, format="gif", mode="steps", api_name="/export_race")
    assert app_state.line.counts()["started"] == started + 1          # made once: the same file again
    with open(path, "rb") as a, open(again, "rb") as b:
        assert a.read() == b.read()


def test_the_mp4_decodes_back_with_the_animations_length(client, race):
    import imageio_ffmpeg
    race_id, doc = race
    path = client.predict(race_id=race_id, format="mp4", mode="time", api_name="/export_race")
    total_ms = sum(d for _, d in animation.plan(doc, "time"))
    reader = imageio_ffmpeg.read_frames(path)
    meta = next(reader)
    frames = [bytes(f) for f in reader]
    assert meta["size"] == animation.SIZE and meta["fps"] == 10
    assert len(frames) == round(total_ms / 100)                       # every 100 ms of the animation, a frame
    assert abs(meta["duration"] - total_ms / 1000) <= 0.1, (meta["duration"], total_ms)
    width = animation.SIZE[0]
    body = slice(animation.COLUMNS_TOP * width * 3, None)
    changed = sum(a != b for a, b in zip(frames[0][body], frames[-1][body]))
    assert changed > 5000                                             # the columns filled up


def test_an_export_is_served_from_its_bounded_folder_never_copied_to_gradios(served, race, tmp_path):
    """The file is served from the app's export folder (the last 16 exports, 96 MB), so no copy of it sits in
    Gradio's temporary folder outside that bound (issue 48 item 10)."""
    from gradio_client import Client
    demo, url = served
    race_id, _ = race
    mine = Client(url, verbose=False, download_files=str(tmp_path))   # the client's own copy goes here
    got = mine.predict(race_id=race_id, format="gif", mode="time", api_name="/export_race")
    made = demo.playground.exports.get((race_id, "gif", "time"))
    assert made is not None and os.path.dirname(made) == demo.playground.exports.directory
    with open(made, "rb") as fh:
        data = fh.read()
    with open(got, "rb") as fh:
        assert fh.read() == data                                        # served, whole
    copies = [p for p in Path(demo.GRADIO_CACHE).rglob("*")
              if p.is_file() and p.stat().st_size == len(data) and p.read_bytes() == data]
    assert copies == []


@pytest.mark.parametrize("kwargs,message", [
    (dict(format="png"), "format must be 'gif' or 'mp4', got 'png'"),
    (dict(format=None), "format must be 'gif' or 'mp4'"),
    (dict(mode="fast"), "mode must be one of 'time', 'steps'"),
    (dict(race_id="../../etc/passwd"), "race_id must be 16 characters"),
    (dict(race_id="x" * 5000), "race_id must be 16 characters"),
    (dict(race_id="AAAAAAAAAAAAAAAA"), "race_id: no race with this id is held here"),
])
def test_a_bad_value_is_refused_by_name(client, race, kwargs, message, app_state):
    call = dict(race_id=race[0], format="gif", mode="time")
    call.update(kwargs)
    started = app_state.line.counts()["started"]
    with pytest.raises(Exception) as err:
        client.predict(**call, api_name="/export_race")
    assert message in str(err.value)
    assert app_state.line.counts()["started"] == started              # refused before any work


def test_a_run_drafting_from_the_visitors_own_history_gets_no_share_link(app_url, tiny_model):
    """A private run (suffix decoding from this session's earlier outputs) is never recorded, so it has no link:
    its drafts would show the visitor's earlier outputs to whoever the link reached. On the tiny preset
    (tests/tiny_preset.py): what is recorded is the floor's choice, whatever the model."""
    from gradio_client import Client
    me = Client(app_url, verbose=False)
    values = dict(model=tiny_model, strategies=["suffix"], prompt="Share test: list the months, separated by commas.",
                  max_new_tokens=12, seed=0, page_defaults=True)
    first = page_run(me, **values)
    assert len(first.race_id) == 16 and "share-link" in first.share
    second = page_run(me, **values)                                    # drafts from the first one's output
    assert second.race_id == "" and "No share link" in second.share and "share-link" not in second.share
