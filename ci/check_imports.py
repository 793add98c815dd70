# SPDX-License-Identifier: BSD-3-Clause
"""The import checks: fa2patch's modules import with its base dependencies only, and its stages
import only downward.

Usage: python ci/check_imports.py [--root DIR] [--package NAME]   (default: tools/ and fa2patch)

Each module of the package is imported in one subprocess whose import system refuses every top-level
package that is neither in the standard library nor a declared dependency (pyproject.toml's
[project] dependencies: BASE_IMPORTS). So no torch, no GPU library (pynvml, triton), no test extra
(numpy) at import time: `fa2patch fetch`, `replay`, `check`, `package --vllm-src`, `report` and
`tune --estimate-only` run where only the base dependencies are installed (README, "V100 with
vLLM 0.33, from zero", step 1), and `fa2patch --help` runs without torch. A module that needs one of
them imports it inside the function that uses it. NEEDS_TORCH lists the exceptions with their reason.

The stage order (STAGES, lowest first; docs/DESIGN.md "Layout"): a module of a stage imports modules
of its own stage and of the stages before it, never of a later one, read from the sources' imports
(in functions too). A package without these stages (a test's) is checked for the first rule only.
Exit 1 and one line per module that fails.
"""

import argparse
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

# Import names of pyproject.toml's [project] dependencies and of what they import in turn.
BASE_IMPORTS = {
    "click": "click",
    "gitpython": "git",
    "gitdb": "gitdb",  # gitpython's dependency
    "smmap": "smmap",  # gitdb's dependency
    "tomlkit": "tomlkit",
}
# Modules whose purpose is torch, with the reason; and entry points, which run when imported.
NEEDS_TORCH = {
    "measure.reference": "the FP32 attention reference that smoke, bench and tests/gpu run on the GPU",
    "compile.torch_query": "a script run inside the interpreter whose torch it reports (build --python, doctor --vllm)",
}
ENTRY_POINTS = {"__main__"}
# fa2patch's stages, lowest first: each imports only its own stage and those before it.
STAGES = ("common", "series", "compile", "vllm", "model", "peers", "measure", "cli", "lab")

CHILD = r"""
import importlib, json, pkgutil, sys, traceback

package, allowed, skip = sys.argv[1], set(sys.argv[2].split(",")), set(sys.argv[3].split(","))
allowed |= set(sys.stdlib_module_names) | {package}


class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] not in allowed:
            raise ImportError(f"import of {name!r} refused: not the standard library or a base dependency")
        return None


sys.meta_path.insert(0, Refuse())
root = importlib.import_module(package)
failures, imported = {}, []
for info in pkgutil.walk_packages(root.__path__, package + "."):
    name = info.name.removeprefix(package + ".")
    if name in skip or name.rpartition(".")[2] in skip or info.ispkg:
        continue
    try:
        importlib.import_module(info.name)
        imported.append(name)
    except BaseException as exc:  # noqa: BLE001 - any failure to import is the finding
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
        where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
        failures[name] = f"{type(exc).__name__}: {exc} ({where})"
print(json.dumps({"imported": imported, "failures": failures}))
"""


def failures(root: Path, package: str, skip: set[str]) -> dict[str, str]:
    """Per module of ``package`` (under ``root``) that fails to import, why."""
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, package, ",".join(BASE_IMPORTS.values()), ",".join(skip)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    if proc.returncode != 0:
        return {package: (proc.stderr.strip().splitlines() or ["?"])[-1]}
    result = json.loads(proc.stdout)
    if not result["imported"] and not result["failures"]:
        return {package: "no module found to import"}
    return result["failures"]


def module_imports(path: Path, package: str, dotted: str) -> set[str]:
    """The package's modules (dotted, without the package) that the source at ``path`` imports,
    absolute or relative, at any depth of the code."""
    here = dotted.split(".")[:-1]  # the module's own subpackage
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1] if node.level > 1 else here
                target = ".".join([*base, *([node.module] if node.module else [])])
            elif node.module and (node.module == package or node.module.startswith(package + ".")):
                target = node.module.removeprefix(package).lstrip(".")
            else:
                continue
            found |= {f"{target}.{a.name}".lstrip(".") for a in node.names} | {target}
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix(package + ".") for a in node.names if a.name.startswith(package + ".")}
    return {f for f in found if f}


def stage_violations(root: Path, package: str) -> dict[str, str]:
    """Per module that imports a later stage (STAGES), which import."""
    top = root / package
    out = {}
    for path in sorted(top.rglob("*.py")):
        dotted = ".".join(path.relative_to(top).with_suffix("").parts)
        stage = dotted.split(".")[0]
        if stage not in STAGES:
            continue
        for target in sorted(module_imports(path, package, dotted)):
            other = target.split(".")[0]
            if other in STAGES and STAGES.index(other) > STAGES.index(stage):
                order = " < ".join(STAGES)
                out[dotted] = f"stage {stage!r} imports {package}.{target} of the later stage {other!r} ({order})"
                break
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1] / "tools")
    ap.add_argument("--package", default="fa2patch")
    args = ap.parse_args(argv)
    found = failures(args.root.resolve(), args.package, set(NEEDS_TORCH) | ENTRY_POINTS)
    found.update(stage_violations(args.root.resolve(), args.package))
    for module, why in sorted(found.items()):
        print(f"{args.package}.{module}: {why}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
