"""The package's import rules, read from the source with ``ast``:

- no import cycles between gradpress's modules (imports that run when a module is
  imported, or when one of its functions runs; ``TYPE_CHECKING`` imports excluded);
- the roles (scheduler, server, worker) never import each other;
- kernels never import codecs: ``gradpress.kernels`` sits below ``gradpress.compressors``;
- networking never imports a role;
- the planner's model (``gradpress.planner``) never imports torch, and the byteps.torch API
  modules (``gradpress.torch``) reach the gradient pipeline only through its surface: no
  route, planner or codec strategy lives in or is reached into from them;
- a job's scheduler, as the launcher starts it, loads neither Numba nor torch;
- no module is over 300 lines.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gradpress"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def imports_of(name: str) -> set[str]:
    """The gradpress modules ``name`` imports (a ``from pkg import sub`` counts as ``pkg.sub``)."""
    path = MODULES[name]
    tree = ast.parse(path.read_text())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if _type_checking_only(node, parents):
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            for a in node.names:
                found.add(f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: imports_of(name) for name in MODULES}


def test_the_graph_sees_the_package():
    assert "gradpress.worker.comm" in GRAPH["gradpress.worker.client"]
    assert "gradpress.net.transport" in GRAPH["gradpress.net.node"]  # `from . import transport`


def test_no_import_cycles():
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [name])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("low,high", [
    ("gradpress.kernels", "gradpress.compressors"),
    ("gradpress.net", "gradpress.scheduler"),
    ("gradpress.net", "gradpress.server"),
    ("gradpress.net", "gradpress.worker"),
    ("gradpress.compressors", "gradpress.server"),
    ("gradpress.compressors", "gradpress.worker"),
])
def test_lower_layers_never_import_higher_ones(low, high):
    bad = [(m, i) for m, deps in GRAPH.items() if m.startswith(low + ".") or m == low
           for i in deps if i.startswith(high + ".") or i == high]
    assert not bad, f"{low} must not import {high}: " + ", ".join(f"{m} imports {i}" for m, i in bad)


ROLES = ("gradpress.scheduler", "gradpress.server", "gradpress.worker")


@pytest.mark.parametrize("role", ROLES)
def test_roles_never_import_each_other(role):
    others = [r for r in ROLES if r != role]
    bad = [(m, i) for m, deps in GRAPH.items() if m.startswith(role)
           for i in deps if any(i.startswith(o) for o in others)]
    assert not bad, ", ".join(f"{m} imports {i}" for m, i in bad)


def test_the_planners_model_is_free_of_torch():
    users = [m for m in MODULES if m.startswith("gradpress.planner")
             and any(isinstance(n, (ast.Import, ast.ImportFrom)) and "torch" in ast.unparse(n).split()[1].split(".")
                     for n in ast.walk(ast.parse(MODULES[m].read_text())))]
    assert not users, f"gradpress.planner imports torch in {users}"


# what the byteps.torch API may use of the pipeline: its surface, and the planner's tuning
PIPELINE_SURFACE = {"gradpress.pipeline", "gradpress.pipeline.pipeline", "gradpress.pipeline.table",
                    "gradpress.pipeline.async_params", "gradpress.pipeline.planning",
                    "gradpress.pipeline.planning.tuning"}


def test_the_byteps_api_reaches_the_pipeline_only_through_its_surface():
    bad = [(m, i) for m, deps in GRAPH.items() if m.startswith("gradpress.torch")
           for i in deps if (i.startswith("gradpress.pipeline") and i not in PIPELINE_SURFACE)
           or i.startswith("gradpress.planner")]
    assert not bad, ", ".join(f"{m} imports {i}" for m, i in bad)


@pytest.mark.integ  # starts a process
def test_the_scheduler_as_launched_loads_neither_numba_nor_torch():
    # the launcher checked a job file's [compression] with the codecs, which load Numba: 0.3 s of
    # a core in every scheduler process, where no job file was given
    code = ("import sys; from gradpress import launcher, scheduler; "
            "print(sorted(m for m in ('numba', 'torch') if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "[]", (run.stdout, run.stderr[-2000:])


def test_no_module_is_over_300_lines():
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > 300}
    assert not long, f"modules over 300 lines: {long}"
