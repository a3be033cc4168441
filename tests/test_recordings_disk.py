"""Recordings on disk: bounded in files and bytes, the example prompts' kept apart, on persistent storage when
a Space has it, and found again after a restart.

What would break it: a bound only on files (a few large recordings fill the disk), visitors' runs pushing the
examples' recordings off, a half-written file read back, or the persistent folder ignored.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from web import settings as service_settings
from web.recordings import Recording, Recordings


def _rec(key: str, size: int = 200) -> Recording:
    doc = {"results": [{"strategy": "greedy", "token_ids": list(range(size // 4))}]}
    return Recording(key, doc, json.dumps(doc), "Ran 1.", time.time(), "test CPU")


def _disk(folder) -> tuple[int, int]:
    files = list(folder.glob("*.json"))
    return len(files), sum(f.stat().st_size for f in files)


def test_five_hundred_races_stay_within_the_disk_bounds_and_the_examples_stay(tmp_path):
    store = Recordings(1 << 20, str(tmp_path), max_files=40, max_disk_bytes=20_000, max_pinned_files=8,
                       max_pinned_bytes=1 << 20)
    for i in range(3):
        store.put(_rec(f"example{i}"), pinned=True)
    for i in range(500):
        store.put(_rec(f"visitor{i:03d}", size=100 + (i % 7) * 150))
        files, size = _disk(tmp_path)
        assert files <= 40 and size <= 20_000, (i, files, size)
    assert len(list((tmp_path / "examples").glob("*.json"))) == 3
    restarted = Recordings(1 << 20, str(tmp_path))          # a new process on the same folder
    for i in range(3):
        got = restarted.get(f"example{i}")
        assert got is not None and got.doc["results"][0]["strategy"] == "greedy"
    assert restarted.get("visitor499") is not None and restarted.get("visitor000") is None
    assert not list(tmp_path.glob("*.tmp")) and not list((tmp_path / "examples").glob("*.tmp"))


def test_the_pinned_folder_has_its_own_bound(tmp_path):
    store = Recordings(1 << 20, str(tmp_path), max_pinned_files=2)
    for i in range(5):
        store.put(_rec(f"example{i}"), pinned=True)
    assert sorted(p.stem for p in (tmp_path / "examples").glob("*.json")) == ["example3", "example4"]


def test_recordings_go_to_persistent_storage_where_a_space_has_it(tmp_path, monkeypatch):
    data = tmp_path / "data"
    monkeypatch.setattr(service_settings, "PERSISTENT", data)
    assert not str(service_settings.recordings_dir()).startswith(str(data))      # no /data: the user's cache
    data.mkdir()
    folder = service_settings.recordings_dir()
    assert folder.startswith(str(data / "decoding-playground" / "recordings"))


def test_a_recordings_dir_given_at_start_gets_the_same_environment_subfolder(tmp_path, monkeypatch):
    """``--recordings-dir DIR`` keeps the per-environment subfolder: an upgrade (new code, new machine) writes
    to a new folder under DIR and never replays the old version's recordings."""
    monkeypatch.setattr(service_settings, "PERSISTENT", tmp_path / "no-data")
    default = Path(service_settings.recordings_dir())
    given = service_settings.recordings_folder(str(tmp_path / "mine"))
    assert Path(given).parent == tmp_path / "mine" and Path(given).name == default.name
    assert service_settings.recordings_folder(None) == str(default)
    assert service_settings.recordings_folder("none") is None
    monkeypatch.setattr(service_settings.torch, "__version__", "0.0-another")    # another environment
    assert service_settings.recordings_folder(str(tmp_path / "mine")) != given
