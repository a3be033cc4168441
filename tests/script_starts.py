"""Start many scripts' ``--help`` from one interpreter that has already imported the heavy third-party libraries.

``python benchmarks/X.py --help`` in a fresh interpreter costs 6-14 s on a 2-core machine, nearly all of it
importing torch, transformers and gradio again. Here one interpreter (started as a person starts a script: no
PYTHONPATH, its working folder a temporary one, the Hub offline) imports those libraries once, checks that
none of the project's own modules came with them, and then, for each script, forks a child that runs the script
as ``__main__`` exactly as ``python script.py --help`` would: ``sys.argv`` set, ``sys.path[0]`` the script's
own folder, stdout and stderr to files. Each child is a copy of the preloaded interpreter, so whatever one
script imports or puts on ``sys.path`` is gone for the next; what a script needs from the project it must still
find by itself.

    run_scripts([path, ...], workdir)  ->  {"scripts": {path: {"rc", "stdout", "stderr", "seconds"}},
                                             "project_modules": [...], "preload_seconds", "python_threads", ...}

Run as a program (by ``run_scripts``): ``python tests/script_starts.py OUT.json SCRIPT...``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Third-party modules only (what the scripts' imports spend their time on); never a project module.
PRELOAD = ("numpy", "yaml", "torch", "transformers", "transformers.models.llama.modeling_llama",
           "transformers.models.gpt2.modeling_gpt2", "transformers.generation.streamers", "gradio", "gradio_client",
           "plotly.graph_objects", "plotly.subplots", "PIL.Image", "httpx")
TIMEOUT_S = 120.0        # one script's --help; a hung child is killed and reported
TAIL = 20_000            # characters kept of each stream


def run_scripts(scripts: list[Path], workdir: Path, preload: tuple[str, ...] = PRELOAD,
                timeout_s: float = 900.0) -> dict:
    """Run each script's ``--help`` (in order) in a child of one preloaded interpreter; the runner's report."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}     # as a person runs it: no test paths
    env.update(HF_HUB_OFFLINE="1", SCRIPT_STARTS_PRELOAD=",".join(preload))
    out = Path(workdir) / "script_starts.json"
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), str(out), *map(str, scripts)],
                          cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"the script runner failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text(encoding="utf-8"))


def _module_files(module: object) -> list[str]:
    """The file and package folders a loaded module came from (its own dict only: no lazy-module hooks)."""
    own = getattr(module, "__dict__", None) or {}
    files = [own["__file__"]] if isinstance(own.get("__file__"), str) else []
    try:
        files += [p for p in list(own.get("__path__") or ()) if isinstance(p, str)]
    except TypeError:                                             # a namespace object that is not a path list
        pass
    return files


def project_modules() -> list[str]:
    """Loaded modules whose file lies in the repository (the venv, even when linked inside it, does not)."""
    found, main = set(), sys.modules.get("__main__")
    for name, module in list(sys.modules.items()):
        for p in _module_files(module) if module is not main else ():      # this runner (and its __mp_main__)
            real = Path(p).resolve()
            if real.is_relative_to(ROOT) and not real.is_relative_to(ROOT / ".venv"):
                found.add(name)
    return sorted(found)


def _exit_code(code: object) -> int:
    """What the interpreter would exit with for ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _child(script: str, out_file: str, err_file: str) -> None:
    """In the forked child: become ``python script --help`` with its streams in files; never returns."""
    code = 70
    try:
        import runpy
        import traceback
        write = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, out_file, write), (2, err_file, write)):
            os.dup2(os.open(path, flags, 0o600), fd)
        sys.argv = [script, "--help"]
        sys.path.insert(0, str(Path(script).resolve().parent))    # what ``python script`` puts first
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as e:
            code = _exit_code(e.code)
        except BaseException:                                     # noqa: BLE001 - reported as the interpreter would
            traceback.print_exc()
            code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:                                     # noqa: BLE001 - a closed stream: nothing to flush
                pass
        os._exit(code)


def _wait(pid: int, deadline: float) -> tuple[int, bool]:
    """(return code as subprocess reports it, timed out?) of a child, killed at ``deadline``."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), False
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status), True
        time.sleep(0.005)


def _tail(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")[-TAIL:] if path.exists() else ""


def _run_one(index: int, script: str, folder: Path) -> dict:
    out_file, err_file = folder / f"{index}.out", folder / f"{index}.err"
    sys.stdout.flush()
    sys.stderr.flush()
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(script, str(out_file), str(err_file))
    rc, timed_out = _wait(pid, t0 + TIMEOUT_S)
    err = _tail(err_file) + (f"\n[killed after {TIMEOUT_S:.0f} s]" if timed_out else "")
    return {"rc": rc, "stdout": _tail(out_file), "stderr": err, "seconds": round(time.monotonic() - t0, 3)}


def main(argv: list[str]) -> int:
    out, scripts = Path(argv[0]), argv[1:]
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        del sys.path[0]                       # this file's folder (tests/): neither the preload nor a script sees it
    t0 = time.monotonic()
    import importlib
    for name in filter(None, os.environ.get("SCRIPT_STARTS_PRELOAD", "").split(",")):
        importlib.import_module(name)
    doc = {"project_modules": project_modules(), "preload_seconds": round(time.monotonic() - t0, 3),
           "python_threads": threading.active_count(),            # fork copies only the forking thread
           "os_threads": len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else None,
           "scripts": {}}
    if not doc["project_modules"]:            # a child would see them already imported: run nothing
        folder = out.parent / "script_starts_streams"
        folder.mkdir(exist_ok=True)
        for i, script in enumerate(scripts):
            doc["scripts"][script] = _run_one(i, script, folder)
    out.write_text(json.dumps(doc), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
