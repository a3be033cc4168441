"""Shared fixtures: the app launched on a free loopback port, a headless Chromium page on it, one torch thread;
and what running in parallel needs (``make test`` runs ``pytest -n 2``): tests marked ``alone`` run with the
other workers held between tests, each worker on its share of the CPU threads."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Iterator

import pytest

CHROMIUM = "/usr/bin/chromium"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_local(demo, attempts: int = 3, pause_s: float = 2.0) -> str:
    """Start ``demo`` on a free loopback port; its URL.

    Gradio's start-up check gives the new server a single HEAD request with a 3 s timeout and raises
    "localhost is not accessible" when it times out, which a machine still busy with an earlier test's
    server can cause (a full run once failed so, and the test passed alone): try again on a fresh port, after
    ``pause_s``.
    So too when another process (a parallel test worker) took the port between ``free_port`` and the launch."""
    for attempt in range(attempts):
        port = free_port()
        try:
            demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
            return f"http://127.0.0.1:{port}/"
        except (ValueError, OSError) as e:
            # OSError: the port was taken between free_port() and the launch (parallel workers pick ports too)
            retry = "localhost is not accessible" in str(e) or "Cannot find empty port" in str(e)
            if not retry or attempt == attempts - 1:
                raise
            demo.close()
            time.sleep(pause_s)
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def served():
    """One app for the session: (its page, its URL); ``demo.playground`` is the app object that owns its stores."""
    import app
    demo = app.build_demo()
    url = launch_local(demo)
    yield demo, url
    demo.close()


@pytest.fixture(scope="session")
def app_url(served):
    return served[1]


@pytest.fixture(scope="session")
def app_state(served):
    """The served app's stores (``web/app_object.PlaygroundApp``): its line, board, recordings, jobs, histories."""
    return served[0].playground


@pytest.fixture(scope="session")
def client(app_url):
    from gradio_client import Client
    return Client(app_url, verbose=False)


@contextlib.contextmanager
def chromium_page(url: str, **page_options) -> Iterator:
    """A page of Debian's headless Chromium (never a downloaded browser) on ``url``, once the app has drawn
    its strategy picker."""
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.fail("Debian chromium is required for the browser tests (make test installs it)")
    from playwright.sync_api import TimeoutError as PlaywrightTimeout, sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run", "--disable-quic"])
        pg = browser.new_page(viewport={"width": 1400, "height": 1000}, **page_options)
        pg.goto(url)
        pg.wait_for_selector("text=Decoding Playground", timeout=60_000)
        # the title draws before the rest of the page: wait for the strategy picker too
        pg.get_by_label("Greedy", exact=True).wait_for(timeout=60_000)
        try:
            yield pg
        except PlaywrightTimeout as exc:
            raise AssertionError(f"{exc}\nwhat the page showed then:\n{_page_state(pg)}") from exc
        finally:
            browser.close()


# what a timed-out browser test reports besides the timeout: the status line, Gradio's error toasts and every
# element the page holds with an id (ours: #status, #columns, #batch-view, ...), a few hundred characters each
PAGE_STATE_JS = """() => {
  const cut = s => (s || '').replace(/\\s+/g, ' ').trim().slice(0, 400);
  const out = [...document.querySelectorAll('.toast-body, .error')].map(e => 'toast/error: ' + cut(e.innerText));
  for (const e of document.querySelectorAll('[id]')) {
    if (/^(status|columns|batch|share|sweep|export|import)/.test(e.id)) out.push('#' + e.id + ': ' + cut(e.innerText));
  }
  return out.join('\\n');
}"""


def _page_state(page) -> str:
    try:
        return page.evaluate(PAGE_STATE_JS)
    except Exception as exc:                     # noqa: BLE001 - the page itself may be gone
        return f"(the page could not be read: {exc})"


@pytest.fixture(scope="session")
def tiny_presets_file(tmp_path_factory) -> Path:
    """An operator presets file naming tests/tiny_preset.py's tiny model (built once per worker)."""
    from tiny_preset import write_tiny_model, write_tiny_presets
    root = tmp_path_factory.mktemp("tiny-preset")
    return write_tiny_presets(root, write_tiny_model(root / "model"))


@pytest.fixture
def tiny_model(tiny_presets_file) -> Iterator[str]:
    """The name of tests/tiny_preset.py's preset, offered by the app (and ``load_model``) for this test: for the
    web-floor tests whose subject is not the bundled model's text."""
    from tiny_preset import offered
    with offered(tiny_presets_file) as name:
        yield name


@pytest.fixture
def prefill_once():
    """Thousands of runs from one prompt answer every forward they repeat from memory, the prefill first: keyed
    on the model, the KV cache's bytes and the inputs (``tiny_models.memo_forwards``), so they draw exactly the
    tokens the real forwards give and a cache bug still shows."""
    from tiny_models import memo_forwards
    with memo_forwards():
        yield


@pytest.fixture
def copying_example(monkeypatch):
    """Prompt lookup's verdict model pinned where the curves of the verdict tests were built around it: 1.10 tokens
    per forward over 1 + 1.68 positions, which pays on a flat curve and not on a steep one. The margin's and the
    width's logic is under test there, not the count; the shipped count (``pays.PROMPT_LOOKUP``: 3.35 tokens on the
    default example's summary) pays on nearly every curve."""
    from decoding.harness import pays
    monkeypatch.setattr(pays, "PROMPT_LOOKUP", pays.Expectation(tokens=1.10, positions=2.7, source="test"))


@pytest.fixture
def one_thread():
    """Tiny models run thousands of times: thread start-up would dominate on a shared 2-core machine.
    A module that wants it for every test says ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    from decoding.runtime import omp_pool
    with omp_pool.threads(1):
        yield


@pytest.fixture
def own_kernel():
    """The project's C++ kernels (``runtime/attention_kernels``), built and loaded; the test skips, with the build's
    reason, on a machine where they do not build."""
    from decoding.runtime import attention_kernels
    reason = attention_kernels.load_default()
    if reason is not None:
        pytest.skip(f"the project's kernel does not build here: {reason}")
    return attention_kernels


# --------------------------------------------------------------------------- parallel workers (pytest-xdist)
# `make test` runs two workers with `--dist loadfile`: a file's tests stay together, in their order, in one
# worker, so module fixtures (a Chromium page, a served app) are built once. Without -n nothing below applies.

WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


def pytest_configure(config):
    """Each worker gets its share of the CPU threads: two workers with torch's default (all cores each)
    oversubscribe the cores, and OpenMP threads then spin waiting for each other."""
    if WORKERS > 1:
        threads = str(max(1, (os.cpu_count() or 1) // WORKERS))
        os.environ["OMP_NUM_THREADS"] = threads           # and the subprocesses the tests start (app.py, CLI)
        import torch
        torch.set_num_threads(int(threads))


@pytest.fixture(scope="session", autouse=True)
def curve_once_per_run(tmp_path_factory):
    """A real-sized model's forward-cost curve is timed once per run (the workers of ``-n`` share it through a
    folder of the run's) and handed to the next load of the same model, weights, kernels and mode
    (tests/curve_memo.py says why). A session fixture, not pytest_configure: xdist's controller process runs no
    test and imports no torch."""
    from curve_memo import curve_memo
    from decoding.runtime import forward_cost
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")      # the same in every worker of one run
    shared = tmp_path_factory.getbasetemp().parent / f"curves-{run}" if run else None
    timed = forward_cost.calibrate
    forward_cost.calibrate = curve_memo(timed, {}, shared=shared)
    yield
    forward_cost.calibrate = timed


_SHARE: dict = {}


def _share_fds(config) -> tuple[int, int]:
    """This worker's descriptors of the run's two lock files (beside the workers' temp folders, which
    pytest removes with old runs)."""
    if not _SHARE:
        folder = config._tmp_path_factory.getbasetemp().parent
        _SHARE["fds"] = tuple(os.open(folder / name, os.O_CREAT | os.O_RDWR, 0o600)
                              for name in ("decoding-playground-gate.lock", "decoding-playground-share.lock"))
    return _SHARE["fds"]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test marked ``alone`` asserts on seconds (or on load it makes itself): under pytest-xdist it waits
    for the other workers to finish the test they are in (module fixtures included) and keeps them from
    starting another until it is done. A readers-writer lock on two files: every other test holds the
    share lock shared; an ``alone`` test holds it exclusive. The gate lock lets a waiting ``alone`` test in
    ahead of the other workers' next tests (flock alone lets shared holders starve it)."""
    if WORKERS == 1:
        return (yield)
    import fcntl
    gate, share = _share_fds(item.config)
    mode = fcntl.LOCK_EX if item.get_closest_marker("alone") else fcntl.LOCK_SH
    fcntl.flock(gate, mode)
    fcntl.flock(share, mode)
    if mode == fcntl.LOCK_SH:
        fcntl.flock(gate, fcntl.LOCK_UN)
    try:
        return (yield)
    finally:
        fcntl.flock(share, fcntl.LOCK_UN)
        fcntl.flock(gate, fcntl.LOCK_UN)


# The files that take longest, run first: with --dist loadfile a worker takes a whole file, and a long file started
# last leaves the other worker idle at the end. Ranked for the slowest CPU the suite meets (an AMD EPYC Zen 3):
# seconds under `make test` on the 2-vCPU Xeon plus 1.5 x the seconds the file spends in the bundled models'
# forwards (tests/forward_clock.py; those run ~2.5x slower where memory is slow), with the files that compile or
# convert a model on an empty cache first. The other files keep their order after these.
SLOW_FILES = ("test_compiled.py", "test_browser.py", "test_prophet.py", "test_self_speculative.py", "test_models.py",
              "test_load.py", "test_crowd.py", "test_model_state.py", "test_bf16_weights.py", "test_app.py",
              "test_benchmark_scripts.py", "test_model_race.py", "test_cli.py",
              "test_queue_survives.py", "test_browser_issue49.py", "test_batch.py", "test_browser_model_race.py",
              "test_lookahead.py", "test_browser_hf.py", "test_universal.py", "test_suffix.py", "test_security.py",
              "test_hosting.py")


# What the kernel libraries compute differently by instruction set (bits by width or key length, which kernel
# or version wins): `make test` runs these files a second time under AVX2_CAPS, so a developer on an AVX-512
# or AMX machine sees what an AVX2-only CPU (an AMD EPYC Zen 3) does. `pytest -m kernels` selects them.
KERNEL_FILES = ("test_bf16_weights.py", "test_fp16_weights.py", "test_int8_weights.py", "test_w8a8_weights.py",
                "test_compute_floor.py",
                "test_gqa_attention.py",
                "test_kernels.py",
                "test_kernel_choice.py", "test_routes.py")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in KERNEL_FILES:
            item.add_marker(pytest.mark.kernels)
    if WORKERS > 1:                   # one process keeps the plain order
        rank = {name: i for i, name in enumerate(SLOW_FILES)}
        items.sort(key=lambda item: rank.get(item.path.name, len(rank)))     # stable: a file's order is kept
