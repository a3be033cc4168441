"""Share links (issue 40, item 1): race ids are random, checked strictly, saved in the recording file and found
again after a restart; the index of ids is bounded.

What would break it: an id derived from the request key (two stores would agree on it), an id not saved in the
file (a restart loses every link), a lookup that trusts the id (a path or a huge string reaching the store), or
an index that grows with every race.
"""

from __future__ import annotations

import json
import time

import pytest

from web.recordings import Recording, Recordings
from web.share import ID_LENGTH, check_id, is_id, new_id, share_html, share_views


def _rec(key: str, tokens: int = 8) -> Recording:
    doc = {"results": [{"strategy": "greedy", "token_ids": list(range(tokens))}]}
    return Recording(key, doc, json.dumps(doc), "Ran 1.", time.time(), "test CPU")


@pytest.mark.parametrize("bad", [None, 5, "", "short", "A" * (ID_LENGTH - 1), "A" * (ID_LENGTH + 1),
                                 "../../etc/passwd", "AAAAAAAAAAAAAAA/", "AAAAAAAAAAAAAAA.", "<script>x</script>",
                                 "AAAAAAAAAAAAAAA\n", "ÄAAAAAAAAAAAAAAA", "A" * 10_000, ["AAAAAAAAAAAAAAAA"]])
def test_a_malformed_id_is_refused_by_name_without_echoing_it(bad):
    with pytest.raises(ValueError) as err:
        check_id(bad)
    assert str(err.value).startswith("race_id must be 16 characters")
    assert "script" not in str(err.value) and "passwd" not in str(err.value)
    assert not is_id(bad)


def test_ids_are_random_and_well_formed():
    ids = {new_id() for _ in range(200)}
    assert len(ids) == 200 and all(check_id(i) == i for i in ids)


def test_a_stored_recording_gets_a_random_id_not_derived_from_its_key(tmp_path):
    one, two = Recordings(1 << 20), Recordings(1 << 20)
    a, b = _rec("samekey"), _rec("samekey")
    one.put(a)
    two.put(b)
    assert is_id(a.share) and is_id(b.share) and a.share != b.share      # same request, different ids
    assert "samekey" not in a.share
    assert one.by_share(a.share) is a and one.by_share(b.share) is None and two.by_share(b.share) is b


def test_a_recording_survives_a_restart_with_its_share_id(tmp_path):
    store = Recordings(1 << 20, str(tmp_path))
    rec, example = _rec("visitorkey"), _rec("examplekey")
    store.put(rec)
    store.put(example, pinned=True)
    first = (tmp_path / "visitorkey.json").read_text().splitlines()[0]
    assert json.loads(first)["share"] == rec.share                     # saved inside the recording file
    restarted = Recordings(1 << 20, str(tmp_path))                      # a new process on the same folder
    got = restarted.by_share(rec.share)
    assert got is not None and got.key == "visitorkey" and got.doc == rec.doc and got.share == rec.share
    pinned = restarted.by_share(example.share)
    assert pinned is not None and pinned.key == "examplekey"
    assert restarted.by_share(new_id()) is None                         # unknown: None, not an error
    assert restarted.get("visitorkey").share == rec.share               # found by key: the same id


def test_a_recording_written_before_share_ids_gets_one_kept_across_restarts(tmp_path):
    doc = {"results": []}
    meta = {"key": "oldkey", "message": "m", "recorded_at": 1.0, "device": "d"}
    (tmp_path / "oldkey.json").write_text(json.dumps(meta) + "\n" + json.dumps(doc))
    rec = Recordings(1 << 20, str(tmp_path)).get("oldkey")
    assert rec is not None and is_id(rec.share)
    assert Recordings(1 << 20, str(tmp_path)).by_share(rec.share).key == "oldkey"


def test_an_expired_recording_is_not_found_by_its_id(tmp_path):
    store = Recordings(1 << 20, str(tmp_path), max_files=3)
    recs = [_rec(f"k{i}") for i in range(6)]
    for i, rec in enumerate(recs):
        store.put(rec)
        time.sleep(0.01)
    restarted = Recordings(1 << 20, str(tmp_path))
    assert restarted.by_share(recs[0].share) is None                    # dropped from disk: expired
    assert restarted.by_share(recs[-1].share).key == "k5"


def test_the_id_index_is_bounded():
    store = Recordings(1 << 30, max_shares=10)
    recs = [_rec(f"k{i}") for i in range(50)]
    for rec in recs:
        store.put(rec)
    assert len(store._shares) == 10
    assert store.by_share(recs[0].share) is None and store.by_share(recs[-1].share) is recs[-1]


def test_unknown_ids_rescan_the_folder_at_most_once_per_interval(tmp_path, monkeypatch):
    store = Recordings(1 << 20, str(tmp_path), rescan_s=60)
    scans = []
    monkeypatch.setattr("web.recordings._meta", lambda path, limit=4096: scans.append(path) or None)
    store.put(_rec("k"))
    for _ in range(20):
        assert store.by_share(new_id()) is None
    assert len(scans) == 1                                              # one scan of the one file


def test_the_share_link_is_escaped_and_only_for_a_valid_id():
    rid = new_id()
    assert f"href='?race={rid}'" in share_html(rid)
    assert "href" not in share_html("<b>x</b>") and "<b>" not in share_html("<b>x</b>")
    assert share_views(None) == {"share": share_html(None), "race_id": ""}
    assert share_views(rid)["race_id"] == rid
