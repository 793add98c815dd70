# SPDX-License-Identifier: BSD-3-Clause
"""The C++/CUDA files the patch series adds follow the repository's .clang-format (issue 18): each
is checked with clang-format --dry-run --Werror (Debian's clang-format-<clang pin>, which
ci/install.sh installs) in the replayed workspace. FA2's own files are not checked."""

import os
import shutil
import subprocess

import pytest

from helpers import REPO, locked_toolchain

SUFFIXES = (".h", ".cuh", ".cu", ".cpp")


def clang_format() -> str:
    name = f"clang-format-{locked_toolchain().clang}"
    exe = shutil.which(name)
    if exe is None:
        if os.environ.get("FA2PATCH_REQUIRE_TOOLCHAIN") == "1":
            pytest.fail(f"{name} required but missing (ci/install.sh installs it)")
        pytest.skip(f"{name} missing (ci/install.sh installs it)")
    return exe


def added_sources(workspace) -> list[str]:
    """The C++/CUDA files that the series adds: added between the pristine import and HEAD."""

    def git(*a):
        return subprocess.run(["git", *a], cwd=workspace, capture_output=True, text=True, check=True).stdout

    pristine = git("rev-list", "--max-parents=0", "HEAD").strip()
    rows = [line.split("\t") for line in git("diff", "--name-status", pristine, "HEAD").splitlines()]
    return sorted(path for status, path in rows if status == "A" and path.endswith(SUFFIXES))


def run_check(exe, workspace, files):
    return subprocess.run(
        [exe, "--dry-run", "--Werror", f"--style=file:{REPO / '.clang-format'}", *files],
        cwd=workspace,
        capture_output=True,
        text=True,
    )


def test_added_sources_are_clang_formatted(real_workspace):
    exe = clang_format()
    files = added_sources(real_workspace)
    assert any(f.endswith(".cu") for f in files) and any(f.endswith(".cpp") for f in files), files
    proc = run_check(exe, real_workspace, files)
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_the_check_finds_a_misformatted_file(real_workspace, tmp_path):
    """The same command fails on an added file whose indentation was changed: the check has teeth."""
    exe = clang_format()
    source = real_workspace / next(f for f in added_sources(real_workspace) if f.endswith("sm70_api.cpp"))
    bad = tmp_path / source.name
    bad.write_text(source.read_text().replace("\n    ", "\n  ", 3))
    proc = run_check(exe, tmp_path, [bad.name])
    assert proc.returncode != 0 and "code should be clang-formatted" in proc.stderr, proc.stderr
