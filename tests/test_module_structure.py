# SPDX-License-Identifier: BSD-3-Clause
"""The shape of tools/fa2patch: stage folders small enough to take in at a glance, short modules, a
shallow import graph without cycles, the model below the GPU commands, and no module reaching into
another's private names. Computed from the sources' imports (absolute and relative, in functions
too); ci/check_imports.py enforces the stage order itself."""

import ast
import sys
from functools import lru_cache

from helpers import REPO

sys.path.insert(0, str(REPO / "ci"))
import check_imports

PACKAGE = REPO / "tools" / "fa2patch"
MAX_LINES = 450
MAX_LAYERS = 8
MAX_MODULES_PER_STAGE = 15
# The V100 model and report: they must load without the modules that build, verify or run the
# extension on a GPU (report reads the extension through compile/extension.py only).
MODEL_STAGES = ("model", "peers")
GPU_SIDE = (
    "measure.bench",
    "measure.smoke",
    "compile.verify",
    "compile.builder",
    "measure.tune",
    "measure.tune_worker",
)


def dotted(path) -> str:
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts)


MODULES = sorted(dotted(p) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py")


def imports(module: str) -> list[tuple[str, list[str]]]:
    """(imported module, names) per import of fa2patch in ``module``: names are those imported from
    a module, or none for a module imported as such."""
    here = module.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse((PACKAGE / (module.replace(".", "/") + ".py")).read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = ".".join([*here[: len(here) - node.level + 1], *([node.module] if node.module else [])])
        elif node.module == "fa2patch" or (node.module or "").startswith("fa2patch."):
            base = node.module.removeprefix("fa2patch").lstrip(".")
        else:
            continue
        for a in node.names:
            sub = f"{base}.{a.name}".lstrip(".")
            out.append((sub, []) if sub in MODULES else (base, [a.name]))
    return out


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


def test_the_graph_helpers_on_the_package():
    assert GRAPH["__main__"] == ["cli.main"] and depth("common.errors") == 1
    assert "common.errors" in GRAPH["cli.main"] and "cli.common" in GRAPH["cli.main"]


def test_every_module_lives_in_a_stage_folder_small_enough_to_read_at_a_glance():
    top = {m for m in MODULES if "." not in m}
    assert top == {"__main__"}
    stages = {m.split(".")[0] for m in MODULES} - top
    assert stages == set(check_imports.STAGES)
    sizes = {s: sum(m.startswith(s + ".") for m in MODULES) for s in stages}
    assert {s: n for s, n in sizes.items() if n > MAX_MODULES_PER_STAGE} == {}
    undocumented = [
        s for s in stages if len(ast.get_docstring(ast.parse((PACKAGE / s / "__init__.py").read_text())) or "") < 80
    ]
    assert undocumented == []


def test_no_module_is_longer_than_the_limit():
    long = {
        m: n
        for m in MODULES
        if (n := len((PACKAGE / (m.replace(".", "/") + ".py")).read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_the_import_graph_is_shallow_and_acyclic():
    deepest = max(MODULES, key=depth)
    assert depth(deepest) <= MAX_LAYERS, deepest


def test_the_model_imports_nothing_that_builds_verifies_or_runs_on_a_gpu():
    leaks = {m: sorted(reach(m) & set(GPU_SIDE)) for m in MODULES if m.split(".")[0] in MODEL_STAGES}
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
