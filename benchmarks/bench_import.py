"""Importing a trace at the upload cap (issue 39): checking it, drawing it, and the wait for the first views.

    python benchmarks/bench_import.py [--repeats 3] [--server] [--json benchmarks/results/import-<cpu>.json]

Two traces, written compactly (as ``json.dumps`` with ``separators=(",", ":")``):

- ``at the cap``: ``most_events()`` of ``tests/view_limits_cases.py``: 200,000 events (the cap) over 16 results
  (the cap), 12,500 tokens and one time per event each; 18.7 MB, under the 20 MB upload cap
  (``Limits.upload_bytes``);
- ``2 MB``: the same shape with the first tenth of each result's events, times and tokens.

Per trace, medians of ``--repeats`` runs after a warm-up, in this process:

- ``check``: ``visualize.traces.import_trace_file`` with the app's cap (read in chunks, every field checked);
- ``draw``: ``web.compute.draw_views`` on the checked document (every view, figures serialized as sent);
- ``first views`` and ``all views``: the page's import handler (``web.handlers.import_views``: the compute line,
  check, draw, the trace store, the outputs) from the call to its first update that holds the views, and to its
  last (the token columns come last). A checkout without the streamed handler (before issue 39's fix) runs
  ``import_file``: its first views are all of them.

With ``--server``, a real server in its own process (``python app.py``, no preload, no recordings; its start is
not timed) and a client doing what the page does over HTTP: the upload (``POST /gradio_api/upload``), then the
import through its API, streamed: seconds from the start of the upload to the first streamed views and to the
whole page. The browser's own drawing of them is not included. With ``--browser`` too, the page itself in
Debian's headless Chromium (``/usr/bin/chromium``, through Playwright): the file chosen in the Trace tab's upload,
then seconds until the status line says the trace was imported (the first views are in the page) and until every
token column is in it.

Run it on a quiet machine: it times one CPU core's work (the draw holds the GIL).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.common import median, write_json  # noqa: E402
from decoding.runtime.kernel_choice import cpu_label  # noqa: E402
from view_limits_cases import most_events  # noqa: E402
from visualize.traces import import_trace_file  # noqa: E402
from web import handlers  # noqa: E402
from web.compute import draw_views  # noqa: E402
from web.app_object import PlaygroundApp  # noqa: E402
from web.limits import DEFAULT_LIMITS  # noqa: E402

STREAMED = hasattr(handlers, "import_views")


def traces(folder: Path) -> dict[str, Path]:
    """The two traces, written compactly into ``folder``: name -> path."""
    doc = most_events()
    small = dict(doc, results=[dict(r, events=r["events"][:1250], times_ms=r["times_ms"][:1250],
                                    token_ids=r["token_ids"][:1250]) for r in doc["results"]])
    paths = {}
    for name, d in (("at the cap", doc), ("2 MB", small)):
        path = folder / f"{name.replace(' ', '-')}.json"
        path.write_text(json.dumps(d, separators=(",", ":")))
        paths[name] = path
    return paths


def handler_s(path: Path) -> tuple[float, float]:
    """(seconds to the first update with views, seconds to the last) through the page's import handler (async
    since issue 48's one watched-computation primitive; a plain generator before)."""
    app = PlaygroundApp()
    t0 = time.perf_counter()
    stamps: list[float] = []

    def seen(update: dict) -> None:
        if not stamps and "timeline" in update:
            stamps.append(time.perf_counter() - t0)

    async def drain(updates) -> None:
        async for update in updates:
            seen(update)
    updates = handlers.import_views(app, str(path)) if STREAMED else iter([handlers.import_file(app, str(path))])
    if inspect.isasyncgen(updates):
        asyncio.run(drain(updates))
    else:
        for update in updates:
            seen(update)
    return (stamps or [None])[0], time.perf_counter() - t0


def in_process(path: Path, repeats: int) -> dict:
    times: dict[str, list[float]] = {"check_s": [], "draw_s": [], "first_views_s": [], "all_views_s": []}
    for r in range(repeats + 1):                    # the first round warms up (plotly's validators, imports)
        t0 = time.perf_counter()
        doc = import_trace_file(path, max_bytes=DEFAULT_LIMITS.upload_bytes)
        t1 = time.perf_counter()
        draw_views(doc)
        t2 = time.perf_counter()
        del doc
        first, last = handler_s(path)
        if r:
            for key, value in zip(times, (t1 - t0, t2 - t1, first, last)):
                times[key].append(value)
    return {key: median(values) for key, values in times.items()} | {"runs": times}


# --------------------------------------------------------------------------- a real server
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int) -> subprocess.Popen:
    server = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--no-preload", "--no-record-examples",
                               "--no-compile", "--recordings-dir", "none"], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    import httpx
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/", timeout=5).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        if server.poll() is not None:
            raise SystemExit("the server exited before it answered")
        time.sleep(1)
    server.terminate()
    raise SystemExit("the server did not answer within 10 minutes")


def served_s(url: str, data: bytes) -> dict:
    """One import as the page does it, over HTTP: the upload, then the import's stream."""
    import httpx
    with httpx.Client(base_url=url, timeout=600) as client:
        t0 = time.perf_counter()
        uploaded = client.post("/gradio_api/upload", files=[("files", ("trace.json", data, "application/json"))])
        t_up = time.perf_counter() - t0
        call = client.post("/gradio_api/call/import_trace",
                           json={"data": [{"path": uploaded.json()[0], "meta": {"_type": "gradio.FileData"}}]})
        kind, first, last = None, None, None
        with client.stream("GET", f"/gradio_api/call/import_trace/{call.json()['event_id']}") as stream:
            for line in stream.iter_lines():
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: "):
                    now = time.perf_counter() - t0
                    if kind == "error":
                        raise SystemExit(f"the import failed: {line[:300]}")
                    if first is None and "Imported a trace" in line:
                        first = now
                    if kind == "complete":
                        last = now
                        break
    return {"upload_s": t_up, "first_views_s": first, "all_views_s": last}


CHROMIUM = "/usr/bin/chromium"
WATCH = """n => { window.dpImport = {first: null, columns: null};
  new MutationObserver(() => {
    const now = performance.now(), status = document.querySelector('#status');
    if (dpImport.first === null && status && /Imported a trace/.test(status.innerText)) dpImport.first = now;
    if (dpImport.columns === null && document.querySelectorAll('#columns .dp-col').length >= n) dpImport.columns = now;
  }).observe(document.body, {subtree: true, childList: true, characterData: true});
  return performance.now(); }"""


def in_browser(browser, url: str, path: Path, columns: int) -> dict:
    """One import in a fresh page: the file chosen in the Trace tab, then the page watched (its own clock)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(url)
        page.wait_for_selector("text=Decoding Playground", timeout=60_000)
        page.get_by_label("Greedy", exact=True).wait_for(timeout=60_000)
        page.get_by_role("tab", name="Trace", exact=True).click()
        t0 = page.evaluate(WATCH, columns)
        page.locator("#trace-upload input[type=file]").set_input_files(str(path))
        page.wait_for_function("window.dpImport.first !== null && window.dpImport.columns !== null",
                               timeout=300_000, polling=50)
        marks = page.evaluate("window.dpImport")
        return {"first_views_s": (marks["first"] - t0) / 1e3, "all_views_s": (marks["columns"] - t0) / 1e3}
    finally:
        page.close()


def over_http(paths: dict[str, Path], repeats: int, browser: bool) -> dict:
    port = free_port()
    server = start_server(port)
    url = f"http://127.0.0.1:{port}"
    try:
        out: dict = {}
        for name, path in paths.items():
            data = path.read_bytes()
            runs = [served_s(url, data) for _ in range(repeats + 1)][1:]
            out[name] = {k: median([r[k] for r in runs]) for k in runs[0]} | {"runs": runs}
        if browser:
            from playwright.sync_api import sync_playwright
            with sync_playwright() as p:
                chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
                    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"])
                for name, path in paths.items():
                    n = len(json.loads(path.read_bytes())["results"])
                    runs = [in_browser(chromium, url, path, n) for _ in range(repeats + 1)][1:]
                    out[name]["browser"] = {k: median([r[k] for r in runs]) for k in runs[0]} | {"runs": runs}
                chromium.close()
        return out
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--server", action="store_true", help="also time the import through a real server over HTTP")
    ap.add_argument("--browser", action="store_true", help="with --server: also in headless Chromium (Playwright)")
    ap.add_argument("--json", default=None, help="write the results here, e.g. benchmarks/results/import-<cpu>.json")
    args = ap.parse_args()
    cpu = cpu_label()
    print(f"machine: {cpu} ({os.cpu_count()} CPUs); upload cap {DEFAULT_LIMITS.upload_bytes / 2**20:g} MB; "
          f"{'streamed' if STREAMED else 'one-shot'} import handler")
    with tempfile.TemporaryDirectory() as folder:
        paths = traces(Path(folder))
        results: dict = {"cpu": cpu, "cpus": os.cpu_count(), "streamed": STREAMED, "repeats": args.repeats,
                         "traces": {}}
        for name, path in paths.items():
            size = path.stat().st_size
            row = in_process(path, args.repeats)
            results["traces"][name] = {"bytes": size, **row}
            print(f"{name:10s} {size / 2**20:5.1f} MB  check {row['check_s']:.2f} s  draw {row['draw_s']:.2f} s  "
                  f"handler: first views {row['first_views_s']:.2f} s, all views {row['all_views_s']:.2f} s")
        if args.server:
            for name, row in over_http(paths, args.repeats, args.browser).items():
                results["traces"][name]["server"] = row
                print(f"{name:10s} over HTTP: upload {row['upload_s']:.2f} s, first views "
                      f"{row['first_views_s']:.2f} s, all views {row['all_views_s']:.2f} s (from the upload's start)")
                if "browser" in row:
                    b = row["browser"]
                    print(f"{name:10s} in Chromium: first views {b['first_views_s']:.2f} s, every token column "
                          f"{b['all_views_s']:.2f} s (from choosing the file)")
    write_json(args.json, results)


if __name__ == "__main__":
    main()
