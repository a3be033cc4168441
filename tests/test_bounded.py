"""The one bounded store behind every cache of the web service (web/bounded.py): least recently used out first,
by entries and by bytes, and told about each entry it drops (so its file goes with it)."""

from __future__ import annotations

import os
import threading

from web.bounded import Bounded, remove_file


def test_entries_and_bytes_are_both_bounded_least_recently_used_first():
    dropped = []
    store = Bounded(max_items=3, max_bytes=10, sizeof=lambda v: v, on_drop=lambda k, v: dropped.append(k))
    for key, size in (("a", 2), ("b", 3), ("c", 4)):
        store.put(key, size)
    assert store.get("a") == 2                  # a used: b is now the least recent
    store.put("d", 1)                           # a fourth entry: b goes (a plain FIFO would drop a)
    assert dropped == ["b"] and len(store) == 3 and store.held_bytes == 7
    store.put("e", 6)                           # 13 bytes: c goes, the least recent left
    assert dropped == ["b", "c"] and store.held_bytes == 9 and store.get("a") == 2


def test_a_value_over_the_byte_budget_is_refused_or_held_alone():
    refused = Bounded(max_bytes=10, sizeof=len)
    refused.put("small", "xx")
    assert refused.put("huge", "x" * 11) is False
    assert refused.get("huge") is None and refused.get("small") == "xx"
    alone = Bounded(max_bytes=10, sizeof=len, oversized="alone")
    alone.put("small", "xx")
    assert alone.put("huge", "x" * 11) is True
    assert len(alone) == 1 and alone.get("huge") == "x" * 11 and alone.held_bytes == 11
    alone.put("next", "y")                      # the next document pushes the oversized one out
    assert alone.get("huge") is None and alone.get("next") == "y" and alone.held_bytes == 1


def test_a_replaced_value_is_dropped_and_a_resized_one_counted_again():
    dropped, sizes = [], {"v": 1}
    store = Bounded(max_bytes=10, sizeof=lambda v: sizes[v] if isinstance(v, str) else v,
                    on_drop=lambda k, v: dropped.append((k, v)))
    store.put("k", 4)
    store.put("k", 5)
    assert dropped == [("k", 4)] and store.held_bytes == 5
    store.put("other", "v")
    sizes["v"] = 6                              # grew in place
    store.resize("other")
    assert store.held_bytes == 6 and store.get("k") is None      # 11 bytes: the older entry went


def test_files_go_with_their_entries(tmp_path):
    paths = []
    store = Bounded(max_items=2, on_drop=lambda path, _: remove_file(path))
    for i in range(4):
        path = tmp_path / f"{i}.json"
        path.write_text("{}")
        paths.append(path)
        store.put(str(path), True)
    assert sorted(os.listdir(tmp_path)) == ["2.json", "3.json"]
    remove_file(paths[0])                       # deleting what is already gone is not an error


def test_unhashable_keys_from_a_client_are_simply_not_held():
    store = Bounded(max_items=2)
    assert store.get(["not", "a", "key"]) is None and store.pop({"x": 1}) is None


def test_concurrent_puts_keep_the_bounds():
    store = Bounded(max_items=50, max_bytes=500, sizeof=lambda v: v)

    def fill(worker: int) -> None:
        for i in range(2000):
            store.put((worker, i), 1 + i % 20)
    threads = [threading.Thread(target=fill, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(store) <= 50 and store.held_bytes <= 500


# --------------------------------------------------------------------------- the suffix histories (web/guards.py)
def _tokens(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def test_histories_keep_the_most_recently_used_sessions():
    """Bug caught: sessions dropped in arrival order (the one just used goes), or never dropped."""
    from web.guards import Histories
    held = Histories(sessions=2, max_tokens=100, max_nodes=10_000)
    held.add("a", [[1, 2, 3]])
    held.add("b", [[4, 5]])
    assert held.items("a") == [[1, 2, 3]]          # a used: b is now the least recent
    held.add("c", [[6]])
    assert "a" in held and "b" not in held and "c" in held and len(held) == 2
    assert held.items("c") == [[6]] and held.items("b") == []   # b starts again, empty; a (least recent) goes
    assert "a" not in held and "c" in held and len(held) == 2


def test_histories_count_their_nodes_again_as_they_grow():
    """The node bound holds over every session after each add. Bug caught: the size counted once when a history
    was made (empty) and never again, so the histories grow past ``max_nodes``."""
    from web.guards import Histories
    held = Histories(sessions=8, max_tokens=1000, max_nodes=150)
    for n, session in enumerate("abcd"):
        held.add(session, [_tokens(100 * n, 60)])   # about 60 nodes each: two or three fit
        assert 0 < held.nodes() <= 150
    sizes = {s: len(held.get(s).tree) for s in "abcd" if s in held}
    assert held.nodes() == sum(sizes.values())      # what it counts is what the trees hold
    assert "a" not in held and "d" in held          # the least recently used went first
    held.add("d", [_tokens(5000, 500)])             # one history over the whole budget alone: dropped too
    assert "d" not in held and held.nodes() <= 150


def test_histories_are_kept_apart_cleared_and_refused_to_shared_ids():
    from web.guards import Histories
    held = Histories(sessions=4, max_tokens=100, max_nodes=10_000, unshared=("shared",))
    assert held.get(None) is None and held.get("shared") is None and held.items("shared") is None
    held.add("shared", [[1, 2]])
    assert len(held) == 0                           # an id that names no single visitor keeps nothing
    held.add("a", [[1, 2], [3, 4]])
    held.add("b", [[9]])
    assert held.items("a") == [[1, 2], [3, 4]] and held.items("b") == [[9]]
    assert held.clear("a") == 2 and held.clear("a") == 0 and held.items("a") == [] and held.items("b") == [[9]]


def test_concurrent_requests_of_one_session_share_one_history():
    """Bug caught: get-or-create without its lock, two histories made for one session and one's outputs lost."""
    import time
    from decoding.drafting.suffix import SuffixHistory
    from web.guards import Histories

    def slow(max_tokens: int) -> SuffixHistory:     # a history that takes a moment to make: requests overlap
        time.sleep(0.02)
        return SuffixHistory(max_tokens=max_tokens)
    held = Histories(sessions=4, max_tokens=10_000, max_nodes=1_000_000, factory=slow)
    threads = [threading.Thread(target=held.add, args=("a", [[i, i + 1, i + 2]])) for i in range(0, 300, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(held.items("a")) == sorted([[i, i + 1, i + 2] for i in range(0, 300, 3)])
