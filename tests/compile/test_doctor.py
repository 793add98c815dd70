# SPDX-License-Identifier: BSD-3-Clause
"""doctor: every tool against the lock's pins; a missing required one fails (exit 2), a missing
optional one only warns. build refuses the same pins."""

import json
import os
import subprocess
import sys

import pytest

from helpers import require_toolchain

NO_NVCC = {"FA2PATCH_NVCC": "/nonexistent/nvcc"}  # so that the clang route is the required one


def doctor(project, env=None):
    proc = subprocess.run(
        [sys.executable, "-m", "fa2patch", "doctor", "--json"],
        capture_output=True,
        text=True,
        env={**project.env, **NO_NVCC, **(env or {})},
    )
    return proc.returncode, json.loads(proc.stdout)


def items(doc):
    return {i["name"]: i for i in doc["items"]}


def test_a_missing_required_tool_fails(mini):
    rc, doc = doctor(mini, {"FA2PATCH_CLANG": "/nonexistent/clang++-22"})
    assert rc == 2 and doc["ok"] is False and "clang++-22" in doc["missing"]
    clang = items(doc)["clang++-22"]
    assert not clang["found"] and clang["required"] and clang["install"] == "apt-get install -y clang-22"


def test_missing_optional_tools_only_warn(mini):
    require_toolchain()
    rc, doc = doctor(mini, {"FA2PATCH_NO_CCACHE": "1"})
    assert rc == 0 and doc["ok"] is True and doc["missing"] == []
    assert not items(doc)["ccache"]["found"] and not items(doc)["ccache"]["required"]
    assert not items(doc)["nvcc"]["found"] and not items(doc)["nvcc"]["required"]
    text = subprocess.run(
        [sys.executable, "-m", "fa2patch", "doctor"],
        capture_output=True,
        text=True,
        env={**mini.env, **NO_NVCC, "FA2PATCH_NO_CCACHE": "1"},
    ).stdout
    assert "missing, optional" in text and "MISSING" not in text


def _pin(mini, old, new):
    lock = mini.root / "baseline.lock"
    text = lock.read_text()
    assert text.count(old) == 1
    lock.write_text(text.replace(old, new))


def test_a_changed_clang_pin_fails_doctor(mini):
    require_toolchain()
    _pin(mini, 'clang = "22"', 'clang = "23"')
    rc, doc = doctor(mini)
    assert rc == 2 and "clang++-23" in doc["missing"]
    assert items(doc)["clang++-23"]["install"] == "apt-get install -y clang-23"


@pytest.mark.parametrize(
    "old, new, name, detail",
    [
        (
            "nvidia-cuda-nvcc==13.0.88",
            "nvidia-cuda-nvcc==13.0.89",
            "nvidia-cuda-nvcc",
            "13.0.88 installed, pinned 13.0.89",
        ),
        ('torch = "2.10.0"', 'torch = "2.9.0"', "torch", "2.10.0+cu128 (CUDA 12.8), pinned 2.9.0"),
    ],
)
def test_a_changed_package_pin_fails_doctor_naming_both_versions(mini, old, new, name, detail):
    require_toolchain()
    _pin(mini, old, new)
    rc, doc = doctor(mini)
    assert rc == 2 and doc["missing"] == [name] and detail in items(doc)[name]["detail"]


def test_build_refuses_a_clang_other_than_the_pinned_one(real_workspace, real_project, tmp_path):
    require_toolchain()
    other = tmp_path / "proj"
    other.mkdir()
    for name in ("baseline.lock", "pyproject.toml"):
        (other / name).write_text((real_project.root / name).read_text())
    lock = other / "baseline.lock"
    lock.write_text(lock.read_text().replace('clang = "22"', 'clang = "23"'))
    proc = subprocess.run(
        [sys.executable, "-m", "fa2patch", "build", "--cuda-compiler", "clang", "--workspace", str(real_workspace)],
        capture_output=True,
        text=True,
        env={**os.environ, "FA2PATCH_ROOT": str(other)},
    )
    assert proc.returncode == 2 and "clang++-23: not found" in proc.stderr
    assert not (other / "build" / "sm_70" / "manifest.json").exists()
