"""Shared fixtures: the app launched on a free loopback port, a headless Chromium page on it, one torch thread."""

from __future__ import annotations

import contextlib
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


def launch_local(demo, attempts: int = 3) -> str:
    """Start ``demo`` on a free loopback port; its URL.

    Gradio's start-up check gives the new server a single HEAD request with a 3 s timeout and raises
    "localhost is not accessible" when it times out, which a machine still busy with an earlier test's
    server can cause (a full run once failed so, and the test passed alone): try again on a fresh port."""
    for attempt in range(attempts):
        port = free_port()
        try:
            demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
            return f"http://127.0.0.1:{port}/"
        except ValueError as e:
            if "localhost is not accessible" not in str(e) or attempt == attempts - 1:
                raise
            demo.close()
            time.sleep(2)
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
    """The served app's stores (``web/playground.PlaygroundApp``): its line, board, recordings, jobs, histories."""
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
    from playwright.sync_api import sync_playwright
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
        finally:
            browser.close()


@pytest.fixture
def one_thread():
    """Tiny models run thousands of times: thread start-up would dominate on a shared 2-core machine.
    A module that wants it for every test says ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
