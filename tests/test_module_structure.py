# SPDX-License-Identifier: BSD-3-Clause
"""The shape of tools/fa2patch (issue 18): short modules, a shallow import graph without cycles, the
model below the GPU commands, and no module reaching into another's private names. Computed from
the sources' relative imports (`from . import x`, `from .x import y`, in functions too)."""

import ast
from functools import lru_cache

from helpers import REPO

PACKAGE = REPO / "tools" / "fa2patch"
MAX_LINES = 450
MAX_LAYERS = 8
# The V100 model and report: they must load without the modules that build, verify or run the
# extension on a GPU (report reads the extension through extension.py only).
MODEL = (
    "report",
    "report_text",
    "sass_mix",
    "exact_route",
    "gqa_route",
    "calibration",
    "v100model",
    "phases",
    "peer",
    "user_anchors",
    "shapes",
    "extension",
)
GPU_SIDE = ("bench", "smoke", "verify", "build", "tune", "tune_worker")


def imports(name: str) -> list[tuple[str, list[str]]]:
    """(module, names) of each relative import of ``name``: names are those imported from a module,
    or the modules themselves for `from . import a, b`."""
    out = []
    for node in ast.walk(ast.parse((PACKAGE / f"{name}.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [a.name for a in node.names]
            out += [(node.module, names)] if node.module else [(n, []) for n in names]
    return out


MODULES = sorted(p.stem for p in PACKAGE.glob("*.py"))
GRAPH = {m: sorted({mod for mod, _ in imports(m) if mod in MODULES and mod != m}) for m in MODULES}


@lru_cache(None)
def depth(module: str, seen: tuple = ()) -> int:
    """Modules on the longest import chain from ``module`` (1: it imports none of the package)."""
    assert module not in seen, f"import cycle: {' -> '.join((*seen, module))}"
    return 1 + max((depth(d, (*seen, module)) for d in GRAPH[module]), default=0)


def reach(module: str) -> set[str]:
    out, todo = set(), [module]
    while todo:
        for d in GRAPH[todo.pop()]:
            if d not in out:
                out.add(d)
                todo.append(d)
    return out


def test_the_graph_helpers_on_the_package_root():
    assert "__main__" in MODULES and GRAPH["__main__"] == ["cli"] and depth("errors") == 1


def test_no_module_is_longer_than_the_limit():
    long = {m: n for m in MODULES if (n := len((PACKAGE / f"{m}.py").read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_the_import_graph_is_shallow_and_acyclic():
    deepest = max(MODULES, key=depth)
    assert depth(deepest) <= MAX_LAYERS, deepest


def test_the_model_imports_nothing_that_builds_verifies_or_runs_on_a_gpu():
    leaks = {m: sorted(reach(m) & set(GPU_SIDE)) for m in MODULES if m in MODEL}
    assert {m: v for m, v in leaks.items() if v} == {}


def test_no_module_imports_another_modules_private_names():
    private = [
        (m, mod, n)
        for m in MODULES
        for mod, names in imports(m)
        for n in names
        if n.startswith("_") and n != "__version__"
    ]
    assert private == []
