"""Import that stops early (issue 25): the streaming reader (visualize/jsonstream.py) reads what json.loads
reads, enforces every cap while it reads, and a refused upload gives its memory back; the string caps of
visualize/checks.py hold (issue 28, mutant 5)."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import visualize.jsonstream as js
from visualize.checks import MAX_DOC_TEXT, MAX_TEXT
from visualize.traces import FORMAT, MAX_EVENTS, export_trace, import_trace, import_trace_file

ROOT = Path(__file__).resolve().parents[1]


def _same(a, b) -> bool:
    """Equal, NaN included, and of the same types all the way down (1 is not 1.0, -0.0 is not 0.0)."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _read(data: bytes, **limits):
    return js.read_json(io.BytesIO(data), js.Limits(**{"max_bytes": 1 << 30, "max_depth": 64, **limits}))[0]


def _agrees(data: bytes) -> None:
    """read_json gives what json.loads gives, or fails where it fails, at any chunk size."""
    try:
        want = json.loads(data)
    except (ValueError, RecursionError):
        want = ValueError
    default = js.CHUNK
    try:
        for chunk in (1, 5, default):          # tokens cut at every place by the chunk boundaries
            js.CHUNK = chunk
            try:
                got = _read(data)
            except ValueError:
                got = ValueError
            assert (want is ValueError) == (got is ValueError), (data[:80], chunk)
            assert want is ValueError or _same(want, got), (data[:80], chunk)
    finally:
        js.CHUNK = default


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=3), inner, max_size=4),
                    max_leaves=30)


@settings(max_examples=120, deadline=None)
@given(value=JSON, indent=st.sampled_from([None, 1]), ascii=st.booleans(),
       encoding=st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-32-le"]))
def test_reads_what_json_loads_reads(value, indent, ascii, encoding):
    _agrees(json.dumps(value, indent=indent, ensure_ascii=ascii).encode(encoding, "surrogatepass"))


@settings(max_examples=120, deadline=None)
@given(data=st.binary(max_size=40) | st.text(alphabet='[]{}",:01.eE-+nulNaIfiy\\ud8 ', max_size=30).map(str.encode))
def test_fails_where_json_loads_fails(data):
    _agrees(data)


@pytest.mark.parametrize("data", [
    b'[NaN, -Infinity, Infinity, 1e400, -0, -0.0, 1E5, 0.5e-3]', b'["\\ud800", "\\udc00x", "\\ud83d\\ude00"]',
    b'{"a": 1, "a": [2]}', b'[' + b'9' * 4301 + b']', b'[' + b','.join(b'%d' % i for i in range(5000)) + b']',
    b'[' + b'1.5,' * 3000 + b'2]', b'["' + b'x' * 70_000 + b'"]', b'[[' + b'], ['.join([b'1'] * 3000) + b']]',
    b'\xef\xbb\xbf[1]', b'[1,]', b'[1 2]', b'{"a" 1}', b'', b'[]x', b'"\x01"', b'[01]', b'[1.]', b'["\xff"]'])
def test_edge_cases_read_as_json_loads_reads_them(data):
    _agrees(data)


def _depth(v) -> int:
    if not isinstance(v, (dict, list)):
        return 0
    return 1 + max((_depth(x) for x in (v.values() if isinstance(v, dict) else v)), default=0)


@settings(max_examples=150, deadline=None)
@given(value=st.recursive(st.integers() | st.text(alphabet='[]{}"\\a'),   # brackets in strings do not nest
                          lambda inner: st.lists(inner, max_size=4)
                          | st.dictionaries(st.text('[]"a', max_size=2), inner, max_size=3), max_leaves=50),
       limit=st.integers(1, 6))
def test_depth_is_refused_exactly_past_the_limit(value, limit):
    data = json.dumps(value).encode()
    try:
        _read(data, max_depth=limit)
    except js.Refused as exc:
        assert exc.kind == "depth" and _depth(value) > limit
    else:
        assert _depth(value) <= limit


@pytest.mark.parametrize("data,limits,kind,path", [
    (b'{"a": [1, 2, 3, 4]}', {"max_entries": 3}, "entries", "a[3]"),
    (b'{"a": {"b": 1, "c": 2}}', {"max_entries": 1}, "entries", "a.c"),
    (b'[[], [[]], {}]', {"max_containers": 4}, "containers", ""),
    (b'[[], [[]], {}]', {"max_containers": 4, "max_string": 100}, "containers", ""),       # walked, not scanned
    (b'{"k": ["abc", "' + b'x' * 40 + b'"]}', {"max_string": 20}, "string", "k[1]"),
    (b'[[[1]], [[[2]]]]', {"max_depth": 3}, "depth", "[1][0]"),
    (b'[' + b'1, ' * 400 + b'1]', {"max_bytes": 1000}, "bytes", ""),
])
def test_each_cap_is_refused_by_name_where_it_is_crossed(data, limits, kind, path):
    with pytest.raises(js.Refused) as err:
        _read(data, **limits)
    assert err.value.kind == kind and err.value.path == path


def test_roles_count_over_the_document_and_keep_the_first_items():
    limits = {"roles": {("", ""): "doc", ("doc", "xs"): "xs"}, "rules": {"xs": js.Rule(5, keep=2)}}
    doc, counts = js.read_json(io.BytesIO(b'{"xs": [{"a": 1}, [2], 3, 4]}'), js.Limits(max_bytes=1 << 20, max_depth=8, **limits))
    assert doc == {"xs": [{"a": 1}, [2]]} and counts == {"xs": 4}
    with pytest.raises(js.Refused) as err:
        js.read_json(io.BytesIO(b'{"xs": [1, 2, 3], "ys": 0, "xs": [4, 5, 6]}'), js.Limits(max_bytes=1 << 20, max_depth=8, **limits))
    assert err.value.kind == "xs" and err.value.path == "xs[2]"      # the sixth item: the third of the second list


def _read_peak_mb(data: bytes) -> float:
    """Peak memory Python allocated while reading ``data`` (refused or not; regex state included), in MB."""
    import tracemalloc
    tracemalloc.start()
    try:
        _read(data)
    except js.Refused:
        pass
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20


def test_a_long_run_of_numbers_is_read_without_per_number_matcher_state():
    numbers = b"[" + b",".join(b"%d" % (i * 7919 % 65_536) for i in range(65_536)) + b"]"
    assert _read_peak_mb(numbers) < 10          # the list itself: about 3 MB (one regex over it: 39 MB more)


def test_a_list_over_the_entries_cap_is_refused_while_it_is_read():
    data = b"[" + b"0," * 3_000_000 + b"0]"
    with pytest.raises(js.Refused, match="more than 200000 entries"):
        _read(data)
    assert _read_peak_mb(data) < 12     # read to its end first: 3 million items, 24 MB more


# --------------------------------------------------------------------------- the trace import
def _doc(**result) -> dict:
    r = {"strategy": "greedy", "label": "Greedy", "token_ids": [5], "pieces": ["a"], "vocab": {"5": "a"},
         "events": [{"type": "TokenCommitted", "step": 1, "position": 0, "token": 5, "source": "greedy"}]}
    return {"format": FORMAT, "version": 2, "prompt": "p", "results": [{**r, **result}]}


def _both(tmp_path, text: str):
    """import_trace and import_trace_file on the same text: the same document or the same message."""
    path = tmp_path / "t.json"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    out = []
    for load in (import_trace, import_trace_file):
        try:
            out.append(load(text if load is import_trace else path))
        except ValueError as exc:
            out.append(f"refused: {exc}")
    assert out[0] == out[1]
    return out[0]


@pytest.mark.parametrize("text,message", [
    (json.dumps(_doc(label="x" * 129)), "results[0].label must be a string of at most 128 characters"),
    (json.dumps(_doc(pieces=["y" * (MAX_TEXT + 1)])), f"results[0].pieces[0] must be a string of at most {MAX_TEXT}"),
    (json.dumps(_doc(vocab={"5": "z" * (MAX_TEXT + 1)})), f"results[0].vocab.5 must be a string of at most {MAX_TEXT}"),
    (json.dumps(_doc(text="t" * (MAX_DOC_TEXT + 1))), f"results[0].text must be a string of at most {MAX_DOC_TEXT}"),
    (json.dumps({**_doc(), "prompt": "p" * (MAX_DOC_TEXT + 1)}), f"prompt must be a string of at most {MAX_DOC_TEXT}"),
])
def test_over_long_strings_are_refused_by_name(tmp_path, text, message):
    assert _both(tmp_path, text).startswith(f"refused: {message}")


@pytest.mark.parametrize("text,message", [
    (json.dumps(_doc()).replace('"greedy"}', '"greedy", "prob": Infinity}'), "events[0].prob must be a finite number"),
    (json.dumps(_doc(pieces=["\ud800"])), "results[0].pieces[0] contains a lone surrogate"),
    (json.dumps(_doc(token_ids=[1])).replace('"prompt": "p"', '"prompt": "' + "7" * 0 + '", "max_new_tokens": '
                                              + "9" * 4301), "not valid JSON: Exceeds the limit (4300 digits)"),
    (json.dumps({**_doc(), "environment": {"x": [[[[[[[[[[[1]]]]]]]]]]]}}), "nested deeper than 12 levels"),
    (json.dumps({**_doc(), "results": [_doc()["results"][0]] * 17}), "trace has 17 results; the limit is 16"),
    ('{"format": "%s", "version": 2, "results": [%s]}' % (FORMAT, ", ".join(["{}"] * 2000)),
     "trace has more than 1024 results; the limit is 16"),
    (json.dumps({**_doc(), "environment": {"x": list(range(200_001))}}),
     "trace JSON has more than 200000 entries in one list or object (at environment.x[200000])"),
    (json.dumps({**_doc(), "environment": {str(k): [[]] * 199_999 for k in range(6)}}),
     "trace JSON has more than 1000000 lists and objects in all"),
])
def test_values_json_accepts_are_checked_and_caps_are_named(tmp_path, text, message):
    assert message in _both(tmp_path, text)


def test_duplicate_keys_keep_the_last_value_as_json_does(tmp_path):
    good = json.dumps(_doc())
    text = good[:-1] + ', "results": ' + json.dumps(_doc(label="second")["results"]) + "}"
    assert _both(tmp_path, text)["results"][0]["label"] == "second"
    assert _both(tmp_path, good) == import_trace(export_trace(json.loads(good)))


# --------------------------------------------------------------------------- memory, measured in a subprocess
REFUSE = r"""
import json, sys
sys.modules["torch"] = None
from visualize.traces import import_trace_file

def rss(key="VmRSS"):
    with open("/proc/self/status") as fh:
        return next(int(l.split()[1]) for l in fh if l.startswith(key)) / 1024

path, kind = sys.argv[1], sys.argv[2]
with open(path, "w") as fh:
    fh.write('{"format": "decoding-playground-trace", "version": 2, "results": [')
    if kind == "events":
        fh.write('{"strategy": "x", "token_ids": [1], "events": [' + ",".join(["{}"] * 6_500_000) + "]}")
    elif kind == "string":
        fh.write('{"strategy": "x", "token_ids": [1], "label": "' + "x" * 19_500_000 + '", "events": []}')
    fh.write("]}")
with open("/proc/self/clear_refs", "w") as fh:
    fh.write("5")
before = rss()
try:
    import_trace_file(path)
except ValueError as exc:
    message = str(exc)
print(json.dumps({"mb": __import__("os").path.getsize(path) / 2**20, "message": message,
                  "peak": rss("VmHWM") - before, "after": rss() - before}))
"""


@pytest.mark.parametrize("kind,message", [
    ("events", f"trace has more than {MAX_EVENTS} events; the limit is {MAX_EVENTS}"),
    ("string", "trace JSON has more than 12582914 characters in one string (at results[0].label)")])
def test_a_19_mb_upload_over_a_cap_is_refused_before_it_is_all_read_and_gives_its_memory_back(tmp_path, kind,
                                                                                                 message):
    proc = subprocess.run([sys.executable, "-c", REFUSE, str(tmp_path / "big.json"), kind], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    assert got["mb"] > 18 and got["message"] == message
    assert got["peak"] < 100, got          # json.loads took +440 MB for the empty events and kept it
    assert got["after"] < 20, got          # handed back (malloc_trim after a refusal)
