"""The architecture as the folders show it (docs/architecture.md), checked on every module's imports.

Floors, bottom to top: the vocabulary (decoding/*.py), the runtime (decoding/runtime/), drafting
(decoding/drafting/), strategies (decoding/strategies/), the harness (decoding/harness/), the commands
(decoding/cli.py, decoding/train_*.py, decoding/training/), the web service (web/) and app.py. The views
(visualize/) stand beside them: they read only the vocabulary's plain types. An import goes down or stays on
its floor, never up; no project import hides inside a function; and there is no import cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLOORS = {"vocabulary": 0, "runtime": 1, "drafting": 2, "strategies": 3, "harness": 4, "commands": 5,
          "web": 6, "app": 7}


def modules() -> dict[str, Path]:
    found = {"app": ROOT / "app.py"}
    for top in ("decoding", "web", "visualize"):
        for path in (ROOT / top).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name[: -len(".__init__")] if name.endswith(".__init__") else name] = path
    return found


def floor(name: str) -> str:
    parts = name.split(".")
    if parts[0] in ("web", "app", "visualize"):
        return parts[0]
    if len(parts) == 1:
        return "vocabulary"
    if parts[1] in ("runtime", "drafting", "strategies", "harness"):
        return parts[1]
    if parts[1] in ("cli", "__main__", "training") or parts[1].startswith("train_"):
        return "commands"
    return "vocabulary"


def imports(name: str, path: Path, known: dict) -> list[tuple[str, bool]]:
    """(imported project module, whether the import sits inside a function) for each import of ``name``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    inner = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             for n in ast.walk(f)}
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.append((target, id(node) in inner))
    return found


def graph() -> dict[str, list[tuple[str, bool]]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_every_import_goes_down_the_floors():
    wrong = []
    for name, deps in graph().items():
        mine = floor(name)
        for dep, _ in deps:
            theirs = floor(dep)
            if mine == "visualize":
                ok = theirs == "visualize" or dep in ("decoding.events", "decoding.treeshape")
            elif theirs == "visualize":
                ok = FLOORS[mine] >= FLOORS["commands"]          # the library never imports views
            else:
                ok = FLOORS[theirs] <= FLOORS[mine]
            if not ok:
                wrong.append(f"{name} ({mine}) imports {dep} ({theirs})")
    assert wrong == []


def test_no_project_import_hides_in_a_function():
    hidden = [f"{name} imports {dep} inside a function" for name, deps in graph().items() for dep, inner in deps
              if inner]
    assert hidden == []


def test_no_import_cycle():
    edges = {name: {dep for dep, _ in deps} for name, deps in graph().items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in edges.get(node, ()):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = 2
    for node in edges:
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_the_checks_catch_what_they_look_for(tmp_path):
    """Negative controls: an upward import, a hidden import and a cycle are each found."""
    known = {"decoding.params": tmp_path / "params.py", "decoding.runtime.models": tmp_path / "models.py"}
    known["decoding.params"].write_text("def f():\n    from decoding.runtime.models import load_model\n")
    known["decoding.runtime.models"].write_text("from decoding.params import check_number\n")
    deps = {name: imports(name, path, known) for name, path in known.items()}
    assert deps["decoding.params"] == [("decoding.runtime.models", True)]
    assert deps["decoding.runtime.models"] == [("decoding.params", False)]
    assert FLOORS[floor("decoding.runtime.models")] > FLOORS[floor("decoding.params")]


def test_no_cache_is_keyed_by_an_object_id():
    offenders = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "id" and name != "app":
                offenders.append(f"{name}:{node.lineno}")
    assert offenders == []


def test_no_module_name_repeats_across_folders():
    names: dict[str, list[str]] = {}
    for name in modules():
        leaf = name.rpartition(".")[2]
        if leaf not in ("__main__",) and name not in ("decoding", "web", "visualize"):
            names.setdefault(leaf, []).append(name)
    packages = {"runtime", "drafting", "strategies", "harness", "training"}
    assert {leaf: where for leaf, where in names.items() if len(where) > 1 and leaf not in packages} == {}
