"""What the operator chose when starting the app (``Settings``), and where its recorded runs are kept."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Any, Optional

import torch
import transformers

from decoding.runtime.kernel_choice import cpu_name
from decoding.runtime.models import (DEFAULT_MEMORY_BUDGET_GB, EXTRA_PRESETS, cache_root, default_target,
                                     load_model, load_presets)
from web.limits import DEFAULT_LIMITS, Limits

# the page's default comparison: the flagship (the prophet head's token trees) against greedy, prompt lookup, lookahead;
# on a CPU, ``chosen_strategies`` keeps those expected to pay on the machine (``Settings.strategies``)
DEFAULT_STRATEGIES = ("greedy", "prophet", "prompt_lookup", "lookahead")


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the operator chose when starting the app (``python app.py --allow-any-model --memory-budget-gb``).

    Passed to every request (``build_demo(settings)`` hands it to the handlers), never a module global
    changed at start: two apps in one process (the tests run several) keep their own."""
    allow_any_model: bool = False                             # any Hub id in the model pickers, not just presets
    memory_budget_gb: Optional[float] = DEFAULT_MEMORY_BUDGET_GB   # cached models beyond it are evicted (None: no cap)
    target: Optional[str] = None          # the page's default target (None: presets/models.yaml's default_target)
    target_note: str = ""                 # why that target (shown under the picker): the start's measured choice
    quiet_recordings: bool = False        # record a run only if timed on a quiet machine (app.main turns it on)
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES   # the page's default comparison (chosen_strategies)
    strategies_note: str = ""             # one line per default strategy left out here, and why (from the curve)
    ticked_note: str = ""                 # one line per default strategy ticked here, and how sure (its race)
    prophet_shape: tuple[tuple[str, Any], ...] = ()   # the prophet's step shape here, the fields the page's defaults
    prophet_note: str = ""                # change (harness/pays.choose_prophet_shape), and why
    compiled: bool = False                # the default target's forwards run compiled (web/startup.py); the page
    compiled_note: str = ""               # ticks ``fast`` for it, so greedy and every strategy race in that mode
    limits: Limits = DEFAULT_LIMITS       # every bound of a request and a store (web/limits.py)

    def load(self, name: str) -> Any:
        """Load a model (or take it from the cache) under this app's memory budget."""
        return load_model(name, memory_budget_gb=self.memory_budget_gb)

    def default_target(self) -> str:
        return self.target or default_target()


DEFAULT_SETTINGS = Settings()


def cuda_available() -> bool:
    return torch.cuda.is_available()


def recordings_folder(choice: Optional[str]) -> Optional[str]:
    """The folder ``--recordings-dir`` names: None for ``none`` (in memory only), else the environment's own
    folder (:func:`recordings_dir`) under the one given, or under the default root when none is given."""
    if choice == "none":
        return None
    return recordings_dir(choice or None)


def recordings_dir(root: Optional[str] = None) -> str:
    """Where recorded runs are kept across restarts: one folder per environment (the library's code and
    presets, torch and transformers versions, device and threads) under ``root`` (default:
    :func:`recordings_root`), so only the code and machine that measured a run replay it."""
    return str((Path(root) if root else recordings_root()) / environment_digest())


def environment_digest() -> str:
    """A short hash of what decides a measured run here: the library's code and presets (and the operator's own
    presets), torch and transformers, the device and its threads."""
    code = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted([*code.joinpath("decoding").rglob("*.py"), *code.joinpath("presets").rglob("*.*")]):
        digest.update(str(path.relative_to(code)).encode())
        digest.update(path.read_bytes())
    extra = os.environ.get(EXTRA_PRESETS, "").strip()
    if extra:                       # the operator's own presets and the adapters they merge decide results too
        for path in [Path(extra), *(Path(p.adapter) for p in load_presets().values() if p.adapter)]:
            digest.update(path.read_bytes() if path.is_file() else str(path).encode())
    device = torch.cuda.get_device_name(0) if cuda_available() else cpu_name()
    digest.update(f"{torch.__version__}|{transformers.__version__}|{device}|{torch.get_num_threads()}".encode())
    return digest.hexdigest()[:16]


PERSISTENT = Path("/data")     # a Hugging Face Space's persistent storage, when the Space has it


def recordings_root() -> Path:
    """The persistent storage's folder where there is one to write (it outlives a Space's restarts; replicas
    that mount the same folder share the recordings), else the user's cache."""
    if PERSISTENT.is_dir() and os.access(PERSISTENT, os.W_OK):
        return PERSISTENT / "decoding-playground" / "recordings"
    return cache_root().parent / "recordings"
