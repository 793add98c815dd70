# SPDX-License-Identifier: BSD-3-Clause
"""ci/check_imports.py: fa2patch's modules import with its base dependencies only (no torch, no GPU
library, no test extra); a package built here shows what it refuses and what it lets through."""

import subprocess
import sys
import tomllib

from helpers import REPO

SCRIPT = REPO / "ci" / "check_imports.py"
sys.path.insert(0, str(REPO / "ci"))
import check_imports  # noqa: E402

MODULES = {
    "__init__.py": "",
    "plain.py": "import json, pathlib\nimport tomlkit\nimport click\n",
    "lazy.py": "def f():\n    import torch\n    return torch\n",
    "top_torch.py": "import torch\n",
    "indirect.py": "from . import top_torch\n",
    "numpy_user.py": "import numpy as np\n",
    "gpu_probe.py": "import pynvml\n",
    "measure/__init__.py": "",
    "measure/reference.py": "import torch\n",  # in NEEDS_TORCH, with its reason
    "__main__.py": "raise SystemExit(3)\n",  # an entry point runs when imported: not imported
}


def run(root, package="pkg"):
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(root), "--package", package], capture_output=True, text=True
    )


def test_refuses_torch_gpu_libraries_and_extras_at_import_time(tmp_path):
    (tmp_path / "pkg" / "measure").mkdir(parents=True)
    for name, text in MODULES.items():
        (tmp_path / "pkg" / name).write_text(text)
    proc = run(tmp_path)
    assert proc.returncode == 1
    flagged = {line.split(":")[0] for line in proc.stdout.splitlines()}
    assert flagged == {"pkg.top_torch", "pkg.indirect", "pkg.numpy_user", "pkg.gpu_probe"}
    assert "import of 'torch' refused" in proc.stdout and "top_torch.py:1" in proc.stdout
    for name in ("top_torch", "indirect", "numpy_user", "gpu_probe"):
        (tmp_path / "pkg" / f"{name}.py").unlink()
    assert run(tmp_path).returncode == 0


def test_an_empty_package_proves_nothing(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    proc = run(tmp_path)
    assert proc.returncode == 1 and "no module found" in proc.stdout


def test_base_imports_cover_the_declared_dependencies_and_exceptions_say_why():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {d.split(">")[0].split("=")[0].split("<")[0].strip().lower() for d in declared}
    assert names <= set(check_imports.BASE_IMPORTS)
    assert all(len(reason) > 20 for reason in check_imports.NEEDS_TORCH.values())
    assert all(
        (REPO / "tools" / "fa2patch" / (m.replace(".", "/") + ".py")).is_file() for m in check_imports.NEEDS_TORCH
    )


def test_fa2patch_imports_without_torch():
    proc = run(REPO / "tools", "fa2patch")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_stages_import_only_downward(tmp_path):
    """A stage importing a later one is refused, by absolute or relative import and inside a function;
    its own and earlier stages are fine."""
    pkg = tmp_path / "pkg"
    for stage in ("common", "compile", "cli"):
        (pkg / stage).mkdir(parents=True)
        (pkg / stage / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "common" / "errors.py").write_text("X = 1\n")
    (pkg / "compile" / "ok.py").write_text("from pkg.common.errors import X\nfrom . import late\n")
    (pkg / "compile" / "late.py").write_text("def f():\n    from ..cli import main\n    return main\n")
    (pkg / "cli" / "main.py").write_text("from pkg.compile import ok\n")
    (pkg / "common" / "up.py").write_text("import pkg.compile.ok\n")
    found = check_imports.stage_violations(tmp_path, "pkg")
    assert set(found) == {"compile.late", "common.up"}
    assert "imports pkg.cli" in found["compile.late"] and "later stage 'cli'" in found["compile.late"]
    proc = run(tmp_path)
    assert proc.returncode == 1 and "pkg.common.up: stage 'common' imports pkg.compile" in proc.stdout
