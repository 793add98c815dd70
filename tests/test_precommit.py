# SPDX-License-Identifier: BSD-3-Clause
"""The pre-commit hooks (.pre-commit-config.yaml: ruff check, ruff format, mypy, the SPDX check and the
forbidden-import check) pass on every tracked file: CI runs them here, through the README's test
command, with the pinned tools ci/install.sh puts in .venv/."""

import os
import subprocess

import pytest

from helpers import REPO

TOOLS = ("ruff", "mypy", "pre-commit")


def test_pre_commit_hooks_pass_on_every_tracked_file(tmp_path):
    venv = REPO / ".venv" / "bin"
    missing = [t for t in TOOLS if not (venv / t).is_file()]
    if missing:
        if os.environ.get("FA2PATCH_REQUIRE_TOOLCHAIN") == "1":
            pytest.fail(f"{missing} required in .venv/ but missing (ci/install.sh installs them)")
        pytest.skip(f"{missing} missing in .venv/ (ci/install.sh installs them)")
    inside = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=REPO, capture_output=True, text=True)
    if inside.stdout.strip() != "true":
        pytest.skip("not a git checkout: pre-commit checks the files git tracks")
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit"), "PRE_COMMIT_COLOR": "never"}
    proc = subprocess.run(
        [venv / "pre-commit", "run", "--all-files"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout[-20000:] + proc.stderr[-2000:]
