"""A crowd at a talk, against a real server on loopback (issue 25): what each visitor waits for.

    python benchmarks/bench_crowd.py [--clients 16] [--distinct 8] [--stop-rounds 3] [--same-only] [--record-busy]
                                     [--json out.json]

1. ``same``: ``--clients`` visitors press Run on the default example with the page's default settings, all at
   once, before it was ever run (one computation, shared live), then again (a recorded run, replayed).
   Per visitor: seconds until the first streamed update that shows a token, and until the whole result.
2. ``distinct``: ``--distinct`` visitors press Run at once, each on their own example prompt (default settings):
   seconds until each sees their place in line (or tokens, for the first), and until their result.
3. ``stop``: ``--stop-rounds`` rounds of ``--clients`` visitors with distinct short runs while Stop is called
   through every route (``/gradio_api/call/stop`` in two loops, with its stream read or dropped, ``/run/stop``,
   the Stop button's API through gradio_client), half of the visitors pressing their own Stop; each visitor's
   answer is counted (result, own Stop's partial result, queue full, error, none), and a normal run afterwards
   must give greedy's tokens. The loops' thousands of new sessions are what used to stop Gradio's queue.

Medians and 90th percentiles are printed with the machine; the model is loaded first (untimed).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from gradio_client import Client  # noqa: E402

from decoding.harness.runner import encode_prompt  # noqa: E402
from decoding.params import GreedyParams  # noqa: E402
from decoding.runtime.kernel_choice import cpu_name  # noqa: E402
from decoding.runtime.models import default_target, load_model  # noqa: E402
from decoding.runtime.pair import ModelPair  # noqa: E402
from decoding.strategies.baselines import greedy  # noqa: E402

import app  # noqa: E402
from conftest import free_port  # noqa: E402
from stop_traffic import stop_loop, stop_routes  # noqa: E402
from web.page_client import page_run, page_submit, run_values  # noqa: E402
from web.page_names import RUN_VIEWS  # noqa: E402
from web.requests import DEFAULT_MAX_NEW  # noqa: E402
from web.settings import DEFAULT_STRATEGIES  # noqa: E402

POLL_S = 0.05
# app.main() with the quiet check of recordings off and an hour's time limit (--record-busy: on a busy machine the
# first press is timed busy, or runs past the 180 s limit, and is not recorded); the server is otherwise the same
RECORD_BUSY = ("import dataclasses, sys, app; from web.settings import Settings; "
               "from web.limits import DEFAULT_LIMITS; sys.argv[0] = 'app.py'; "
               "limits = dataclasses.replace(DEFAULT_LIMITS, time_limit_s=3600.0); "
               "app.Settings = lambda **kw: Settings(**{**kw, 'quiet_recordings': False, 'limits': limits}); "
               "app.main()")
# the raw HTTP stream carries every output, gr.State ones as null: RUN_VIEWS' positions (a client drops the State)
STATUS, COLUMNS = RUN_VIEWS.index("status"), RUN_VIEWS.index("columns")


def page_request(prompt: str, max_new: int = DEFAULT_MAX_NEW, strategies=None, seed: int = 0) -> dict:
    """What the page sends when a visitor only picks ``prompt`` and presses Run, by name (page_run's arguments)."""
    return dict(model=default_target(), assistant="prophet", strategies=list(strategies or DEFAULT_STRATEGIES),
                prompt=prompt, max_new_tokens=max_new, seed=seed, page_defaults=True)


def watch(url: str, request: dict, start: threading.Barrier, row: dict) -> None:
    """Press Run (all visitors at once, through Gradio's HTTP API: a thread that only reads its stream, as a
    browser tab would) and note when the first place in line, the first token and the result came."""
    host, port = url.split("//")[1].strip("/").split(":")
    body = json.dumps({"data": run_values(**request)}).encode()
    start.wait()
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(host, int(port), timeout=900)
    conn.request("POST", "/gradio_api/call/run", body=body, headers={"Content-Type": "application/json"})
    event_id = json.load(conn.getresponse())["event_id"]
    conn.request("GET", f"/gradio_api/call/run/{event_id}")
    stream, kind = conn.getresponse(), None
    for raw in stream:
        line = raw.decode("utf-8", "replace").rstrip("\n")
        if line.startswith("event: "):
            kind = line[7:]
            continue
        if not line.startswith("data: "):
            continue
        now = time.perf_counter() - t0
        if kind == "error":
            row["done_s"], row["error"] = now, line[6:200]
            break
        out = json.loads(line[6:]) if kind in ("generating", "complete") else None
        if not isinstance(out, list) or len(out) != len(RUN_VIEWS):
            continue
        status, columns = str(out[STATUS] or ""), json.dumps(out[COLUMNS])
        if "Waiting for the compute slot" in status:
            row.setdefault("place_s", now)
        if "data-source=" in columns:
            row.setdefault("token_s", now)
            row.setdefault("place_s", now)
        if kind == "complete":
            row["done_s"], row["status"] = now, status
            break
    conn.close()


def crowd(url: str, requests: list[dict]) -> list[dict]:
    rows = [{} for _ in requests]
    start = threading.Barrier(len(requests))
    threads = [threading.Thread(target=watch, args=(url, v, start, row)) for v, row in zip(requests, rows)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return rows


def stop_round(url: str, clients: int, calls: int, tokens: int, seed: int) -> dict:
    """``clients`` distinct runs at once while Stop is called through every route; half of the visitors press
    their own Stop once their run streams. Counts how each visitor was answered."""
    outcome: dict[str, int] = {}
    traffic: dict[str, int] = {}

    def visitor(i: int) -> None:
        client = Client(url, verbose=False)
        job = page_submit(client, **page_request(f"Tell me fact number {i} about the sea.", max_new=tokens,
                                                 strategies=["greedy"], seed=seed))
        if i % 2:
            while not job.done() and not any("tokens" in str(o.status) for o in job.outputs()):
                time.sleep(POLL_S)
            client.predict(api_name="/stop")
        try:
            status = str(job.result(timeout=900).status)
            kind = ("partial (own Stop)" if "cancelled" in json.dumps(_trace(job)) else "result") \
                if "strategies" in status else status[:60]
        except TimeoutError:
            kind = "no answer"
        except Exception as exc:  # noqa: BLE001 - named errors are outcomes too
            kind = "queue full" if "queue full" in str(exc).lower() else f"error: {str(exc)[:60]}"
        with lock:
            outcome[kind] = outcome.get(kind, 0) + 1
    lock, done = threading.Lock(), threading.Event()
    stoppers = [threading.Thread(target=loop, args=(url, done, traffic, calls), daemon=True)
                for loop in (stop_loop, stop_loop, stop_routes)]
    t0 = time.perf_counter()
    for t in stoppers:
        t.start()
    visitors = [threading.Thread(target=visitor, args=(i,)) for i in range(clients)]
    for t in visitors:
        t.start()
    for t in visitors:
        t.join()
    done.set()
    for t in stoppers:
        t.join()
    return {"outcomes": outcome, "stop_calls": traffic, "seconds": round(time.perf_counter() - t0, 1)}


def _trace(job) -> dict:
    return job.result().document()


def wait_healthy(url: str, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "healthz", timeout=5) as resp:
                if json.load(resp)["ok"]:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit("the server did not come up")


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))] if values else float("nan")


def summary(name: str, rows: list[dict], key: str) -> dict:
    got = [r[key] for r in rows if key in r]
    line = {"case": name, "measure": key, "n": len(rows), "with_value": len(got),
            "p50_s": round(statistics.median(got), 2) if got else None, "p90_s": round(pct(got, 0.9), 2),
            "max_s": round(max(got), 2) if got else None, "errors": sum("error" in r for r in rows),
            "replays": sum("Replay of a recorded run" in r.get("status", "") for r in rows)}
    print(f"{name:34s} {key:8s} n={line['n']:3d} p50 {line['p50_s']:6.2f} s  p90 {line['p90_s']:6.2f} s  "
          f"max {line['max_s']:6.2f} s  errors {line['errors']}  replays {line['replays']}")
    return line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--distinct", type=int, default=8)
    ap.add_argument("--stop-rounds", type=int, default=3)
    ap.add_argument("--stop-calls", type=int, default=2400, help="Stop calls per loop and round (three loops)")
    ap.add_argument("--stop-tokens", type=int, default=32)
    ap.add_argument("--skip-crowd", action="store_true", help="only the Stop rounds")
    ap.add_argument("--same-only", action="store_true",
                    help="of the crowd cases, only the same example's first press and its replay")
    ap.add_argument("--record-busy", action="store_true",
                    help="record the first press even when the machine is busy (a shared machine: else the quiet "
                         "check refuses to record it, and the 'replayed' case computes again)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    port = free_port()
    # the server in its own process, as on a Space: the visitors' clients here do not share its GIL
    launch = ["app.py"] if not args.record_busy else ["-c", RECORD_BUSY]
    server = subprocess.Popen([sys.executable, *launch, "--port", str(port), "--no-record-examples",
                               "--recordings-dir", "none"], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    wait_healthy(url)
    prompts = [p for group in app.example_prompts().values() for p in group]
    print(f"machine: {cpu_name()} ({os.cpu_count()} CPUs); default comparison {', '.join(DEFAULT_STRATEGIES)}, "
          f"{DEFAULT_MAX_NEW} tokens")
    lines = []
    try:
        page_run(Client(url, verbose=False), **page_request("Warm up.", max_new=4))   # untimed
        if not args.skip_crowd and not args.same_only:
            lines.append(summary("one visitor alone", rows := crowd(url, [page_request(prompts[-1])]), "token_s"))
            lines.append(summary("one visitor alone", rows, "done_s"))
        if not args.skip_crowd:
            same = [page_request(prompts[0])] * args.clients
            lines.append(summary("same example, first press (shared)", rows := crowd(url, same), "token_s"))
            lines.append(summary("same example, first press (shared)", rows, "done_s"))
            lines.append(summary("same example, recorded (replayed)", rows := crowd(url, same), "token_s"))
            lines.append(summary("same example, recorded (replayed)", rows, "done_s"))
        if not args.skip_crowd and not args.same_only:
            distinct = [page_request(p) for p in prompts[1:1 + args.distinct]]
            lines.append(summary("distinct prompts", rows := crowd(url, distinct), "place_s"))
            lines.append(summary("distinct prompts", rows, "done_s"))
        rounds = []
        for r in range(args.stop_rounds):
            rounds.append(stop_round(url, args.clients, args.stop_calls, args.stop_tokens, seed=100 + r))
            print(f"Stop round {r + 1}: {rounds[-1]}")
        after = page_run(Client(url, verbose=False), **page_request("Name a planet.", max_new=8,
                                                                    strategies=["greedy"]))
        tokens = after.document()["results"][0]["token_ids"]
        lm = load_model(default_target())
        ids = encode_prompt(lm.tokenizer, "Name a planet.", chat=True)
        exact = tokens == greedy(ids, ModelPair(lm), GreedyParams(), max_new_tokens=8).token_ids
        print(f"a run afterwards: {len(tokens)} tokens, greedy's: {exact}")
        with urllib.request.urlopen(url + "healthz", timeout=10) as resp:
            health = json.load(resp)
    finally:
        server.terminate()
        server.wait(30)
    print(f"health afterwards: {health}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"machine": cpu_name(), "cpus": os.cpu_count(), "clients": args.clients,
                       "distinct": args.distinct, "lines": lines, "stop_rounds": rounds, "after_exact": exact,
                       "health": health}, fh, indent=1)


if __name__ == "__main__":
    main()
