"""Stop traffic through every route Gradio offers, for the queue tests and benchmarks/bench_crowd.py.

Each loop counts its answers by route and HTTP status in ``counts``: ``call <status>`` for a raw
``POST /gradio_api/call/stop`` whose stream is never read (each one a new Gradio session, the load that
used to kill the queue), ``call+read`` / ``call+drop`` for one whose stream is read or dropped, ``run`` for
``POST /gradio_api/run/stop``, ``client`` for the Stop button's API through gradio_client (``/queue/join``).
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

from gradio_client import Client

_COUNTING = threading.Lock()


def post(url: str, path: str, body: dict, timeout: float = 30) -> tuple[int, bytes]:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def count(counts: dict, key: str) -> None:
    with _COUNTING:
        counts[key] = counts.get(key, 0) + 1


def stop_loop(url: str, until: threading.Event, counts: dict, calls: int) -> None:
    """The reported loop: raw ``POST /gradio_api/call/stop``, its stream never read; each call a new session."""
    for _ in range(calls):
        if until.is_set():
            return
        count(counts, f"call {post(url, 'gradio_api/call/stop', {'data': []})[0]}")


def stop_routes(url: str, until: threading.Event, counts: dict, calls: int) -> None:
    """Stop through the other routes Gradio offers, in turn."""
    for round_ in range(calls // 3):
        if until.is_set():
            return
        status, body = post(url, "gradio_api/call/stop", {"data": []})
        if status == 200:
            stream = urllib.request.urlopen(url + f"gradio_api/call/stop/{json.loads(body)['event_id']}", timeout=30)
            if round_ % 2:
                stream.read()                  # its stream read to the end
            stream.close()                     # or dropped at once
        count(counts, f"call+{'read' if round_ % 2 else 'drop'} {status}")
        count(counts, f"run {post(url, 'gradio_api/run/stop', {'data': [], 'session_hash': 'stopper'})[0]}")
        if round_ % 4 == 0:                    # the Stop button's api through gradio_client (/queue/join)
            try:
                Client(url, verbose=False).predict(api_name="/stop")
                count(counts, "client ok")
            except Exception as exc:  # noqa: BLE001 - counted; the assertions are on the runs
                count(counts, f"client {type(exc).__name__}")
