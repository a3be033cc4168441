"""A preset for the web-floor tests whose subject is the floor, not the model's text: a tiny random Llama (two
layers of width 64) on the bundled model's tokenizer and chat template, saved to a folder and named in an operator
presets file (``DECODING_PLAYGROUND_PRESETS``), the way an operator adds a model of their own.

Why: concurrency, Stop, the line, exports and histories are the same code whatever model runs, but the bundled
model's forward reads 540 MB of weights. On a 2-vCPU machine with the suite's two workers that is 50-120 ms a
forward (about 2.5 times more where memory is slow: an AMD EPYC Zen 3), and those tests ran thousands of them
(``tests/forward_clock.py`` counts them). This model's forward costs about a millisecond, and it still runs every
layer of the app: validation by preset name, ``load_model`` from a folder, the kernel choice, the line, the run
thread, traces and documents. Tests that are about the bundled model (its text, its head, the default example,
its recordings) keep it, and so do those that need a run to last on any machine without holding it (a Stop
mid-run). A test that needs a run to be going on while something else happens holds it instead
(``tests/holding.py``: a visitor leaving a shared run, the queue under a storm of Stops).

Its greedy depends on the prompt's last tokens (``scale`` sharpens its logits), so a mixed-up answer still shows
where the prompts are sent as raw text; inside the chat template's long system prompt two random layers barely see
a digit that differs (tests/test_suite_tools.py checks the first).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import pytest

TINY = "tiny-llama-test"
BUNDLED = "smollm2-135m-instruct"


def write_tiny_model(folder: Path) -> Path:
    """``folder`` holding the tiny model (safetensors) and the bundled model's tokenizer; ``folder``."""
    from decoding.runtime.models import load_model
    from tiny_models import tiny_causal
    tokenizer = load_model(BUNDLED).tokenizer
    tiny = tiny_causal("llama", seed=11, vocab=len(tokenizer), scale=8.0)
    for model_config in (tiny.model.config, tiny.model.generation_config):
        model_config.eos_token_id = tokenizer.eos_token_id
        model_config.bos_token_id = tokenizer.bos_token_id
        model_config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    tiny.model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def write_tiny_presets(folder: Path, model_dir: Path) -> Path:
    """``folder/models.yaml`` naming ``model_dir`` as the preset ``TINY`` (offline, chat)."""
    path = folder / "models.yaml"
    path.write_text(f"models:\n  {TINY}:\n    hub_id: {str(model_dir)!r}\n    network: false\n    chat: true\n"
                    f"    description: a tiny random Llama for the web-floor tests\n", encoding="utf-8")
    return path


@contextlib.contextmanager
def offered(presets_file: Path) -> Iterator[str]:
    """The app (and ``load_model``) offer ``TINY`` from ``presets_file`` within the block, and no longer after it;
    its name. conftest's ``tiny_model`` holds it for one test, a module's fixture for the module's own run."""
    from decoding.runtime.models import EXTRA_PRESETS
    with pytest.MonkeyPatch.context() as env:
        env.setenv(EXTRA_PRESETS, str(presets_file))
        yield TINY
