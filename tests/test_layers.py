"""The architecture as the folders show it (docs/architecture.md), checked on every module's imports.

Floors, bottom to top: the vocabulary (decoding/*.py), the runtime (decoding/runtime/), drafting
(decoding/drafting/), strategies (decoding/strategies/), the harness (decoding/harness/) -- the library, all of
decoding/ -- then the commands (playground/: cli.py, train_*.py, training/), the web service (web/) and app.py.
The views (visualize/) stand beside them: they read only the vocabulary's plain types, and only the floors above
the library import them. An import goes down or stays on its floor, never up; no project import hides inside a
function; and there is no import cycle. decoding/ has no exception: it imports nothing from playground/, web/,
app.py or visualize/.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLOORS = {"vocabulary": 0, "runtime": 1, "drafting": 2, "strategies": 3, "harness": 4, "commands": 5,
          "web": 6, "app": 7}


def modules() -> dict[str, Path]:
    found = {"app": ROOT / "app.py"}
    for top in ("decoding", "playground", "web", "visualize"):
        for path in (ROOT / top).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name[: -len(".__init__")] if name.endswith(".__init__") else name] = path
    return found


def floor(name: str) -> str:
    parts = name.split(".")
    if parts[0] in ("web", "app", "visualize"):
        return parts[0]
    if parts[0] == "playground":
        return "commands"
    if len(parts) > 1 and parts[1] in ("runtime", "drafting", "strategies", "harness"):
        return parts[1]
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


def upward(deps_of: dict[str, list[tuple[str, bool]]]) -> list[str]:
    """Every import in ``deps_of`` that goes up the floors (or from the library, or the views, into the views)."""
    wrong = []
    for name, deps in deps_of.items():
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
    return wrong


def above_the_library(deps_of: dict[str, list[tuple[str, bool]]]) -> list[str]:
    """Every import by a decoding/ module of anything outside decoding/ (the commands, the web, the views)."""
    return [f"{name} imports {dep}" for name, deps in deps_of.items() if name.split(".")[0] == "decoding"
            for dep, _ in deps if dep.split(".")[0] != "decoding"]


def test_every_import_goes_down_the_floors():
    assert upward(graph()) == []


def test_the_library_imports_nothing_above_it():
    """No exception for the commands: decoding/ never imports playground/, web/, app.py or visualize/."""
    found = graph()
    assert any(name.startswith("playground.") for name in found)     # the commands are seen, so they are checked
    assert above_the_library(found) == []


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
    assert upward(deps) == ["decoding.params (vocabulary) imports decoding.runtime.models (runtime)"]


def test_an_import_from_the_library_up_to_the_commands_is_caught(tmp_path):
    """Negative control: a library module importing the command line, a training module or visualize.report (the
    old upward arrow of decoding/cli.py) fails both checks; the commands importing them does not."""
    names = ["decoding.harness.bench", "decoding.runtime.adapter", "playground.cli", "playground.training.lora",
             "visualize.report", "decoding.params"]
    known = {name: tmp_path / f"{name}.py" for name in names}
    known["decoding.harness.bench"].write_text("from visualize.report import html_report\nimport playground.cli\n")
    known["decoding.runtime.adapter"].write_text("from playground.training import lora\n")
    known["playground.cli"].write_text("from visualize.report import html_report\nfrom decoding.harness import bench\n")
    for name in ("playground.training.lora", "visualize.report", "decoding.params"):
        known[name].write_text("")
    deps = {name: imports(name, path, known) for name, path in known.items()}
    assert above_the_library(deps) == ["decoding.harness.bench imports visualize.report",
                                       "decoding.harness.bench imports playground.cli",
                                       "decoding.runtime.adapter imports playground.training.lora"]
    assert upward(deps) == ["decoding.harness.bench (harness) imports visualize.report (visualize)",
                            "decoding.harness.bench (harness) imports playground.cli (commands)",
                            "decoding.runtime.adapter (runtime) imports playground.training.lora (commands)"]
    assert floor("playground") == floor("playground.training.lora") == "commands"
    assert floor("decoding.__main__") == "vocabulary"


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
        if leaf not in ("__main__",) and name not in ("decoding", "playground", "web", "visualize"):
            names.setdefault(leaf, []).append(name)
    packages = {"runtime", "drafting", "strategies", "harness", "training"}
    assert {leaf: where for leaf, where in names.items() if len(where) > 1 and leaf not in packages} == {}
