"""The app's start and its quiet recordings, measured through the real app in a subprocess (issue 47).

    python benchmarks/bench_start.py [--fresh [--reconvert]] [--busy-start] [--loops 2] [--json out.json]

Three claims, on whatever CPU this runs on (``python app.py --port P --no-record-examples --recordings-dir none``
is started here, its log saved to a file whose path is printed; it is always killed, with its process group):

1. **First page**: seconds from starting the process until ``GET /`` answers 200 with the page; then at once one
   ``/race`` (greedy and prophet, 32 new tokens) and its seconds, whether the start's background work (the version
   timing and the compile, ``web/startup.py``) was done when it answered and whether greedy ran the compiled
   forward (``params.fast`` in its document: the run's status line, which says "Ran eagerly: ..." while the
   compiled forward is not ready, is the page's only; ``/race`` answers the CLI's document, which has no message);
   then the seconds until the start's background work is done (its log line ``[app] start-up done in N s``,
   ``web.startup.DONE_LINE``).
2. **Recorded when quiet**: with the start done and nothing else running, 10 distinct prompts of 4 to ~420 words
   (from ``presets/bench_unseen.yaml``: one cut to its first 4 words, 8 whole ones spread over their lengths, and
   one of >= 400 words joined from the longest ones; never the training templates) through ``/race``, and how
   many were recorded. ``/race``'s answer says neither whether the run was recorded nor why not, so each prompt
   is asked again at once with the identical call: a recorded run is replayed (the same document, its timings
   included, in well under a second), one that was not is computed again (other timings); why it was not is the
   app's log line for it (``web.compute.NOT_RECORDED``).
3. **Busy not recorded**: ``--loops`` (2) pure-Python ``while True`` loops, at this benchmark's own priority (run
   it at priority 0), while one new prompt goes through ``/race``: it must not be recorded; the loops are then
   stopped. With ``--busy-start`` instead: the loops start before the app, so its start and its background work
   (the quiet baseline's probe included) run busy; then a new prompt while busy (must not be recorded), the loops
   stopped, ``--settle`` seconds, then 3 new prompts quiet and how many of them were recorded (a baseline taken
   busy must not be kept: ``web/quiet.py``). Claims 2 and 3 as above are not run with ``--busy-start``.
4. **The default race in the app's own mode** (``--race-repeats N``, default 3; 0 skips it; after claim 2, quiet):
   the strategies the page ticks by default (the start's last ``default comparison here:`` log line) on the page's
   default example at its default length, N times with distinct seeds (each computed, none a replay): per
   strategy the median speed-up over greedy in the same run, and whether every run equalled greedy's tokens.

``--fresh``: every cache the start reads is empty: ``XDG_CACHE_HOME`` and ``DECODING_CACHE_DIR`` point into a new
temporary folder and ``TORCHINDUCTOR_CACHE_DIR`` is unset, so the version choice (``routes.json``), the CPU kernel
tables (``kernels.json`` beside the converted model, ``kernels/``), inductor's graphs and the attention kernels'
build (``DECODING_CACHE_DIR/inductor``) are cold; ``HF_HOME`` keeps pointing at the usual Hub cache. The converted
bundled models (dequantized GGUF, ~40 s each to convert) are kept: their files are copied, the weights linked,
``kernels.json`` left out; ``--reconvert`` leaves them out too (the start then converts the default model inside
its background time). Without ``--fresh`` the app uses this machine's caches as they are (a later start).

Prints a Markdown table naming the CPU (``kernel_choice.cpu_label``) and writes a JSON (``--json``, default
``benchmarks/results/start-<time>.json``; the app's log beside it, ``.log``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UNSEEN = ROOT / "presets" / "bench_unseen.yaml"
DONE_LINE = "start-up done in"           # web.startup.DONE_LINE (tests/test_benchmark_scripts.py checks they agree)
TICKED_LINE = "default comparison here:"  # web.startup.TICKED_LINE (likewise)
NOT_RECORDED = "[app] run not recorded:"  # web.compute.NOT_RECORDED (likewise): the app logs why a run was not
PAGE_MARK = b"Decoding Playground"       # in the page's HTML
STRATEGIES = ["greedy", "prophet"]
MAX_NEW = 32
QUIET_PROMPTS, LONG_WORDS = 10, (400, 420)
BUSY_LOOP = "while True:\n    pass\n"
POLL_S = 0.25


class BenchError(RuntimeError):
    """A wait that ran out, or the app that died: the message says which and where its log is."""


# --------------------------------------------------------------------------- prompts

def words(text: str) -> int:
    return len(text.split())


def prompt_plan(path: Path = UNSEEN) -> dict[str, list[str]]:
    """Distinct prompts for every run: ``first`` (1), ``quiet`` (10: 4 words, 8 spread over the lengths, one of
    400-420 words joined from the longest prompts), ``busy`` (1), ``after`` (3: quiet again after --busy-start)."""
    import yaml
    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    texts = list(dict.fromkeys(t.strip() for items in data.values() for item in items or ()
                               for t in [item.get("prompt") if isinstance(item, dict) else item]
                               if isinstance(t, str) and t.strip()))
    by_length = sorted(texts, key=words)
    longest, joined = [], 0
    for text in reversed(by_length):             # the longest prompts, joined until >= 400 words
        longest.append(text)
        joined += words(text)
        if joined >= LONG_WORDS[0]:
            break
    if joined < LONG_WORDS[0]:
        raise BenchError(f"{path} holds only {joined} words: not enough for a {LONG_WORDS[0]}-word prompt")
    long = " ".join(" ".join(longest).split()[:LONG_WORDS[1]])
    rest = [t for t in by_length if t not in longest]
    short = " ".join(rest.pop(0).split()[:4])                 # the shortest prompt's first 4 words
    spread = [rest[round(i * (len(rest) - 1) / 7)] for i in range(8)]
    left = [t for t in rest if t not in spread]
    if len(left) < 5:
        raise BenchError(f"{path}: too few prompts for distinct runs")
    plan = {"quiet": [short, *spread, long], "first": [left[len(left) // 2]],
            "busy": [left[0]], "after": [left[-1], left[-2], left[1]]}
    every = [t for group in plan.values() for t in group]
    assert len(set(every)) == len(every)
    return plan


# --------------------------------------------------------------------------- the machine

def cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of every core from /proc/stat; None where it cannot be read."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = [int(x) for x in fh.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def busy_share(seconds: float = 2.0) -> float | None:
    """The share of all the cores' time that was busy over ``seconds`` (every process, this one included)."""
    before = cpu_times()
    time.sleep(seconds)
    after = cpu_times()
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


class Loops:
    """``n`` pure-Python busy loops, each its own process at this process's priority; ``stop`` ends them."""

    def __init__(self, n: int) -> None:
        self.procs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP], stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(n)]
        self.niceness = [os.getpriority(os.PRIO_PROCESS, p.pid) for p in self.procs]
        print(f"started {n} busy loops (pids {', '.join(str(p.pid) for p in self.procs)}, nice "
              f"{', '.join(map(str, self.niceness))})", flush=True)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        if self.procs:
            print("stopped the busy loops", flush=True)
        self.procs = []


# --------------------------------------------------------------------------- caches

def user_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def fresh_env(env: dict, folder: Path, reconvert: bool) -> dict:
    """``env`` with every cache of the start in ``folder`` (empty), the converted models kept unless
    ``reconvert``; notes what was kept in ``env['_kept']`` (removed before use)."""
    hub = os.environ.get("HF_HOME") or str(user_cache() / "huggingface")
    env = {k: v for k, v in env.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env.update(XDG_CACHE_HOME=str(folder / "xdg"), DECODING_CACHE_DIR=str(folder / "cache"), HF_HOME=hub)
    kept = []
    old_models = user_cache() / "decoding-playground" / "models"
    new_models = folder / "xdg" / "decoding-playground" / "models"
    new_models.mkdir(parents=True)
    if not reconvert and old_models.is_dir():
        for model in sorted(p for p in old_models.iterdir() if p.is_dir() and (p / "config.json").is_file()):
            (new_models / model.name).mkdir()
            for f in model.iterdir():
                if not f.is_file() or f.name == "kernels.json":       # the kernel table stays cold
                    continue
                if f.suffix == ".safetensors":
                    (new_models / model.name / f.name).symlink_to(f.resolve())   # read only, never written
                else:
                    shutil.copy2(f, new_models / model.name / f.name)
            kept.append(model.name)
    env["_kept"] = kept
    return env


# --------------------------------------------------------------------------- the app

class Server:
    """``python app.py`` on a free port in its own process group, its output in ``log``."""

    def __init__(self, env: dict, log: Path, extra: list[str]) -> None:
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log = log
        self.args = [sys.executable, "app.py", "--port", str(self.port), "--no-record-examples",
                     "--recordings-dir", "none", *extra]
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.t0 = 0.0

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        out = open(self.log, "w", encoding="utf-8")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(self.args, cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        print(f"started {' '.join(self.args[1:])} (pid {self.proc.pid}); its log: {self.log}", flush=True)

    def since(self) -> float:
        return time.monotonic() - self.t0

    def text(self) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def app_lines(self) -> list[str]:
        return [line[6:] for line in self.text().splitlines() if line.startswith("[app] ")]

    def done_s(self) -> float | None:
        """The start's background work as the app counted it (its DONE_LINE), None until it logged it."""
        for line in self.app_lines():
            m = re.match(re.escape(DONE_LINE) + r" (\d+) s", line)
            if m:
                return float(m.group(1))
        return None

    def alive(self, what: str) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = "\n".join(self.text().splitlines()[-30:])
            raise BenchError(f"the app exited with {self.proc.returncode} while {what}; its log ({self.log}) "
                             f"ends:\n{tail}")

    def wait(self, check, timeout: float, what: str):
        """Poll ``check()`` until it gives something truthy; BenchError past ``timeout`` seconds or if the app dies."""
        deadline = time.monotonic() + timeout
        while True:
            self.alive(f"waiting for {what}")
            got = check()
            if got:
                return got
            if time.monotonic() > deadline:
                raise BenchError(f"{what}: not within {timeout:.0f} s (the app's log: {self.log})")
            time.sleep(POLL_S)

    def page(self) -> bool:
        try:
            with urllib.request.urlopen(self.url, timeout=5) as resp:
                return resp.status == 200 and PAGE_MARK in resp.read()
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


# --------------------------------------------------------------------------- /race

def call_race(client, timeout: float, what: str, **values) -> dict:
    """One /race with ``values``, waited for at most ``timeout`` seconds (then cancelled: BenchError naming
    ``what``)."""
    job = client.submit(api_name="/race", **values)
    try:
        return job.result(timeout=timeout)
    except TimeoutError:
        job.cancel()
        raise BenchError(f"{what} gave no answer within {timeout:.0f} s") from None


def race(client, prompt: str, timeout: float) -> tuple[dict, float]:
    """One /race of greedy and prophet, ``MAX_NEW`` tokens: (its document, seconds)."""
    t0 = time.monotonic()
    doc = call_race(client, timeout, f"/race ({words(prompt)}-word prompt)", prompt=prompt, strategies=STRATEGIES,
                    max_new_tokens=MAX_NEW)
    return doc, time.monotonic() - t0


def fingerprint(doc: dict) -> list:
    return [(r.get("strategy"), r.get("wall_s"), r.get("token_ids")) for r in doc.get("results") or ()]


def not_recorded_reason(lines: list[str]) -> str:
    """Why the app did not record a run: the first ``NOT_RECORDED`` line of its log among ``lines`` (those it
    wrote during the run), "" where there is none."""
    found = [line.split(NOT_RECORDED, 1)[1].strip() for line in lines if NOT_RECORDED in line]
    return found[0] if found else ""


def run_row(client, prompt: str, timeout: float, check: bool = True, server: "Server | None" = None) -> dict:
    """One prompt through /race, then (``check``) the identical call again: a replay (the same document, timings
    included) says the first was recorded; a run computed again says it was not, and why: ``/race``'s answer does
    not say, the app's log does (``server``: read from it)."""
    seen = len(server.text().splitlines()) if server is not None else 0
    try:
        doc, seconds = race(client, prompt, timeout)
    except BenchError:
        raise
    except Exception as exc:  # noqa: BLE001 - a refused or failed run is a row of its own
        return {"words": words(prompt), "prompt_tokens": 0, "seconds": float("nan"), "fast": False,
                "errors": {"race": str(exc)[:300]}, "recorded": False, "message": "the call failed",
                "prompt": prompt[:80]}
    rows = {r["strategy"]: r for r in doc.get("results") or ()}
    greedy = rows.get("greedy") or {}
    row = {"words": words(prompt), "prompt_tokens": len(doc.get("prompt_ids") or ()), "seconds": round(seconds, 2),
           "target": (doc.get("environment") or {}).get("target", {}).get("name"),
           "fast": bool((greedy.get("params") or {}).get("fast")),
           "errors": {k: r["error"] for k, r in rows.items() if r.get("error")},
           "greedy_tok_s": greedy.get("tokens_per_s"),
           "prophet_speedup": (rows.get("prophet") or {}).get("speedup"), "prompt": prompt[:80]}
    if check and not row["errors"]:          # a run with an error is never recorded (web/documents.complete)
        again, again_s = race(client, prompt, timeout)
        row["recorded"] = fingerprint(again) == fingerprint(doc)
        row["check_seconds"] = round(again_s, 2)
        why = not_recorded_reason(server.text().splitlines()[seen:]) if server is not None else ""
        row["message"] = ("replayed by the identical call" if row["recorded"] else
                          f"computed again by the identical call: not recorded ({why or 'the log gives no reason'})")
    elif check:
        row["recorded"], row["message"] = False, "a strategy failed: not recorded"
    return row


def ticked(lines: list[str]) -> list[str]:
    """The strategies the page ticks by default: the last ``TICKED_LINE`` the start logged (it logs one each
    time it chooses them); [] before it chose."""
    found = [line[len(TICKED_LINE):] for line in lines if line.startswith(TICKED_LINE)]
    return [name.strip() for name in found[-1].split(",") if name.strip()] if found else []


def default_races(client, prompt: str, strategies: list[str], repeats: int, timeout: float) -> dict:
    """Claim 4: the page's default comparison of ``prompt`` (its default example) through /race, ``repeats`` times
    with seeds 1..repeats (distinct requests: each is computed). Per strategy the median speed-up over greedy in
    the same run, and whether every run gave greedy's tokens."""
    from decoding.harness.pays import SHAPE_FIELDS      # the prophet's fields its step shape sets
    runs = []
    for seed in range(1, repeats + 1):
        doc = call_race(client, timeout, "the default race", prompt=prompt, strategies=strategies, seed=seed)
        rows = {r["strategy"]: r for r in doc.get("results") or ()}
        greedy = rows.get("greedy") or {}
        runs.append({"seed": seed, "greedy_tok_s": greedy.get("tokens_per_s"),
                     "fast": bool((greedy.get("params") or {}).get("fast")),
                     # the prophet's step shape the page runs here (the start's choice from the curve)
                     "prophet_shape": {k: ((rows.get("prophet") or {}).get("params") or {}).get(k)
                                       for k in SHAPE_FIELDS} if "prophet" in rows else None,
                     "speedup": {k: greedy["wall_s"] / r["wall_s"] for k, r in rows.items()
                                 if k != "greedy" and not r.get("error") and r.get("wall_s")},
                     "equal": {k: r.get("token_ids") == greedy.get("token_ids") for k, r in rows.items()
                               if k != "greedy"},
                     "errors": {k: r["error"] for k, r in rows.items() if r.get("error")}})
        print(f"default race {seed}/{repeats}: " + ", ".join(f"{k} {v:.2f}x" for k, v in runs[-1]["speedup"].items())
              + f" (greedy {runs[-1]['greedy_tok_s'] or 0:.1f} tok/s)", flush=True)
    names = [s for s in strategies if s != "greedy"]
    return {"strategies": strategies, "prompt": prompt, "runs": runs,
            "median": {k: statistics.median([r["speedup"][k] for r in runs if k in r["speedup"]] or [float("nan")])
                       for k in names},
            "equal_every_run": {k: all(r["equal"].get(k, False) for r in runs) for k in names},
            "greedy_tok_s_median": statistics.median([r["greedy_tok_s"] or 0.0 for r in runs])}


def show_runs(title: str, rows: list[dict]) -> None:
    print(f"\n{title}\n")
    print("| # | words | prompt tokens | recorded | /race s | check s | compiled | message |")
    print("|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(rows, 1):
        print(f"| {i} | {r['words']} | {r['prompt_tokens']} | {'yes' if r.get('recorded') else 'no'} | "
              f"{r['seconds']:.1f} | {r.get('check_seconds', float('nan')):.1f} | {'yes' if r['fast'] else 'no'} | "
              f"{r.get('message', '')}{' ERRORS: ' + json.dumps(r['errors']) if r['errors'] else ''} |")
    print(f"\nrecorded: {sum(bool(r.get('recorded')) for r in rows)}/{len(rows)}", flush=True)


# --------------------------------------------------------------------------- the benchmark

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fresh", action="store_true", help="every cache of the start empty (a new temporary folder)")
    ap.add_argument("--reconvert", action="store_true",
                    help="with --fresh, the converted bundled models are not kept either (converted in the start)")
    ap.add_argument("--busy-start", action="store_true",
                    help="start the busy loops before the app; then one busy run and 3 quiet ones (not claims 2, 3)")
    ap.add_argument("--loops", type=int, default=2, help="busy loops (default 2)")
    ap.add_argument("--settle", type=float, default=10.0, help="seconds after the loops stop (--busy-start)")
    ap.add_argument("--page-timeout", type=float, default=600.0)
    ap.add_argument("--start-timeout", type=float, default=3600.0, help="for the start's background work")
    ap.add_argument("--run-timeout", type=float, default=900.0, help="for each /race call")
    ap.add_argument("--race-repeats", type=int, default=3,
                    help="claim 4: runs of the page's default comparison (0: none; not with --busy-start)")
    ap.add_argument("--app-arg", action="append", default=[], help="more arguments for app.py (repeatable)")
    ap.add_argument("--keep-cache", action="store_true", help="keep --fresh's temporary folder")
    ap.add_argument("--json", type=Path, default=None,
                    help="default benchmarks/results/start-<time>.json (the app's log beside it, .log)")
    args = ap.parse_args()
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from common import DEFAULT_PROMPT, write_json              # noqa: E402  (benchmarks/; imports torch)
    from decoding.runtime.kernel_choice import cpu_label       # noqa: E402
    from gradio_client import Client                           # noqa: E402

    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.json or ROOT / "benchmarks" / "results" / f"start-{stamp}.json"
    log = out.with_suffix(".log")
    plan = prompt_plan()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADIO_SERVER_")}
    env.update(HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False", PYTHONUNBUFFERED="1")
    folder, kept = None, None
    if args.fresh:
        folder = Path(tempfile.mkdtemp(prefix="bench-start-"))
        env = fresh_env(env, folder, args.reconvert)
        kept = env.pop("_kept")
        print(f"fresh caches in {folder} (converted models kept: {', '.join(kept) or 'none'})", flush=True)
    cpu = cpu_label()
    doc: dict = {"cpu": cpu, "cpus": os.cpu_count(), "niceness": os.getpriority(os.PRIO_PROCESS, 0),
                 "fresh": args.fresh, "converted_models_kept": kept, "busy_start": args.busy_start,
                 "loops": args.loops, "strategies": STRATEGIES, "max_new_tokens": MAX_NEW, "log": str(log)}
    print(f"machine: {cpu}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, this process's nice "
          f"{doc['niceness']}", flush=True)
    server = Server(env, log, args.app_arg)
    loops = Loops(args.loops) if args.busy_start else None
    try:
        if loops is not None:
            time.sleep(1.0)
        # ------------------------------------------------------------------ 1. first page
        server.start()
        page_s = server.wait(lambda: server.page() and server.since(), args.page_timeout, "the page (GET / 200)")
        print(f"first page after {page_s:.1f} s", flush=True)
        client = Client(server.url, verbose=False, download_files=False, analytics_enabled=False,
                        httpx_kwargs={"timeout": 120})
        first = run_row(client, plan["first"][0], args.run_timeout, check=False)
        first["answered_s"] = round(server.since(), 2)
        first["start_done_then"] = server.done_s() is not None
        print(f"first /race answered {first['answered_s']:.1f} s after the start ({first['seconds']:.1f} s for the "
              f"call); compiled forward used: {first['fast']}; start's background work done then: "
              f"{first['start_done_then']}", flush=True)
        server.wait(lambda: server.done_s() is not None, args.start_timeout,
                    f"the start's background work (its log line '[app] {DONE_LINE} N s')")
        done_s = server.since()
        print(f"start's background work done after {done_s:.1f} s (the app counts {server.done_s():.0f} s)",
              flush=True)
        doc["claim1"] = {"page_s": round(page_s, 2), "first_race": first, "background_done_s": round(done_s, 2),
                         "background_done_app_s": server.done_s(), "app_log": server.app_lines()}
        if args.busy_start:
            # ---------------------------------------------------------- busy start, then quiet again
            busy = run_row(client, plan["busy"][0], args.run_timeout, server=server)
            loops.stop()
            time.sleep(args.settle)
            share = busy_share()
            after = [run_row(client, p, args.run_timeout, server=server) for p in plan["after"]]
            doc["busy_start_runs"] = {"busy": busy, "quiet_busy_share": share, "after": after}
        else:
            # ---------------------------------------------------------- 2. recorded when quiet
            share = busy_share()
            print(f"\nbefore the quiet runs: {share if share is None else f'{share:.0%}'} of the cores busy "
                  f"(load average {os.getloadavg()[0]:.1f})" + (
                      "; NOT quiet: the runs are expected to be refused" if share and share > 0.15 else ""),
                  flush=True)
            quiet = []
            for i, p in enumerate(plan["quiet"], 1):
                quiet.append(run_row(client, p, args.run_timeout, server=server))
                r = quiet[-1]
                print(f"quiet {i}/{len(plan['quiet'])}: {r['words']} words, recorded {r.get('recorded')}, "
                      f"{r['seconds']:.1f} s", flush=True)
            doc["claim2"] = {"busy_share_before": share, "runs": quiet}
            # ---------------------------------------------------------- 4. the default race, quiet
            if args.race_repeats > 0:
                strategies = ticked(server.app_lines())
                if not strategies:
                    raise BenchError(f"the start logged no '{TICKED_LINE}' line (the app's log: {log})")
                doc["claim4"] = default_races(client, DEFAULT_PROMPT, strategies, args.race_repeats, args.run_timeout)
            # ---------------------------------------------------------- 3. busy, not recorded
            loops = Loops(args.loops)
            time.sleep(1.0)
            busy = run_row(client, plan["busy"][0], args.run_timeout, server=server)
            loops.stop()
            doc["claim3"] = {"busy": busy}
    finally:
        if loops is not None:
            loops.stop()
        server.stop()
        if folder is not None and not args.keep_cache:
            shutil.rmtree(folder, ignore_errors=True)
    report(doc, page_s, first, done_s)
    write_json(out, doc)
    print(f"the app's log: {log}")


def report(doc: dict, page_s: float, first: dict, done_s: float) -> None:
    print(f"\n## Start and quiet recordings on {doc['cpu']} ({doc['cpus']} CPUs)\n")
    caches = ("empty (--fresh" + (", converted models kept" if doc["converted_models_kept"] else "") + ")"
              if doc["fresh"] else "this machine's")
    print(f"caches: {caches}; busy loops during the start: {'yes' if doc['busy_start'] else 'no'}\n")
    print("| measure | value |\n|---|---|")
    print(f"| first page (GET / 200) | {page_s:.1f} s |")
    print(f"| first /race answered | {first['answered_s']:.1f} s ({first['seconds']:.1f} s for the call; "
          f"compiled forward: {'yes' if first['fast'] else 'no'}; background work done then: "
          f"{'yes' if first['start_done_then'] else 'no'}) |")
    print(f"| background work done (version timing, compile) | {done_s:.1f} s |")
    if "claim2" in doc:
        show_runs("Recorded when quiet (10 distinct prompts)", doc["claim2"]["runs"])
        show_runs(f"Busy ({doc['loops']} loops): must not be recorded", [doc["claim3"]["busy"]])
    if "claim4" in doc:
        c4 = doc["claim4"]
        print(f"\nThe default race (ticked: {', '.join(c4['strategies'])}; the default example, "
              f"{len(c4['runs'])} runs, greedy {c4['greedy_tok_s_median']:.1f} tok/s median)\n")
        if not c4["median"]:
            print("nothing besides greedy is ticked by default here (the start's 'not ticked' lines say why)")
        else:
            print("| strategy | median speed-up over greedy | every run greedy's tokens |\n|---|---|---|")
        for name, value in c4["median"].items():
            print(f"| {name} | {value:.2f}x | {'yes' if c4['equal_every_run'][name] else 'NO'} |")
    if "busy_start_runs" in doc:
        show_runs(f"Busy start: a run with {doc['loops']} loops still going (must not be recorded)",
                  [doc["busy_start_runs"]["busy"]])
        show_runs("Then quiet again (3 new prompts)", doc["busy_start_runs"]["after"])


if __name__ == "__main__":
    try:
        main()
    except BenchError as exc:
        raise SystemExit(f"bench_start: {exc}") from None
