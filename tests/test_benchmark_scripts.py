"""Every benchmark script starts from a fresh interpreter (``python benchmarks/X.py --help``).

The benchmarks are run by hand or by make targets, never by the suite, so a script whose imports broke
(after a module moved, or with its path set up after the project's imports) would only be found by the
next person measuring; this runs each one's argument parsing in its own process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for p in (ROOT / "benchmarks").glob("*.py")
                 if p.name != "common.py" and "__main__" in p.read_text(encoding="utf-8"))


def test_there_are_scripts_to_check():
    assert len(SCRIPTS) >= 10


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_the_script_starts(script, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}   # as a person runs it: no test paths
    env["HF_HUB_OFFLINE"] = "1"
    proc = subprocess.run([sys.executable, str(script), "--help"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage" in proc.stdout.lower()
