"""Every override of Gradio's internals is behind web/gradio_overrides.py, which names the Gradio it fits (issue 38).

The overrides (the Blocks' ``postprocess_data`` and cached-file sets, the queue's class, ``gr.api``'s validator,
pre-serialized plots) were written by reading one Gradio's source. On another Gradio they may silently do
nothing or break the page, so the first test here fails until someone reads them again and widens
``SUPPORTED``.
"""

from __future__ import annotations

import re
from pathlib import Path

import gradio as gr

from web import gradio_overrides, queue_guard

ROOT = Path(__file__).resolve().parent.parent


def test_the_installed_gradio_is_one_the_overrides_were_written_for():
    assert gradio_overrides.supported(), (
        f"gradio {gr.__version__} is installed; web/gradio_overrides.py was written for gradio "
        f"{gradio_overrides.GRADIO_VERSION} and supports >={gradio_overrides.SUPPORTED[0]}, "
        f"<{gradio_overrides.SUPPORTED[1]}: read each override's Gradio lines again, then widen SUPPORTED")


def test_the_supported_range():
    assert gradio_overrides.supported(gradio_overrides.GRADIO_VERSION)
    assert gradio_overrides.supported("6.31.2")
    for other in ("6.30.0", "6.32.0", "7.0.0", "5.49.1"):
        assert not gradio_overrides.supported(other), other


def test_the_space_runs_a_supported_gradio():
    front = (ROOT / "README.md").read_text(encoding="utf-8").split("---")[1]
    version = re.search(r"^sdk_version:\s*(\S+)", front, re.M).group(1)
    assert gradio_overrides.supported(version), version


def test_install_puts_every_override_on_a_blocks():
    with gradio_overrides.GuardedBlocks() as blocks:
        gr.File()
    gradio_overrides.install(blocks)
    assert isinstance(blocks._queue, queue_guard.GuardedQueue)
    assert isinstance(blocks.upload_file_set, gradio_overrides.SnapshotSet)
    assert all(isinstance(files, gradio_overrides.SnapshotSet) for files in blocks.temp_file_sets)


# what reaching into Gradio's internals looks like in this code base
INTERNALS = re.compile(r"postprocess_data|temp_file_sets|upload_file_set|__class__\s*=|\.validator\s*=|"
                       r"from gradio\.(?!themes)\w|import gradio\.\w|gr\.blocks\.|_queue\b")
DOORS = {"web/gradio_overrides.py", "web/queue_guard.py"}


def test_no_override_lives_outside_the_door():
    sources = [ROOT / "app.py", *sorted((ROOT / "web").glob("*.py"))]
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in sources
             if str(path.relative_to(ROOT)) not in DOORS
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if INTERNALS.search(line)]
    assert found == []
