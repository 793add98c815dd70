"""The lab scripts on the CPU: ci/gpu-lab.sh fails when a step fails, and ci/gpu-sanitize.sh runs
the GPU suite's own bad-input cases."""

import json
import os
import subprocess
import sys

import pytest

from helpers import REPO

FAKE_PYTHON = """#!/bin/sh
# Stands in for python3 in ci/gpu-lab.sh: `-m fa2patch STEP ...` fails for the step named in
# $FAIL_STEP; everything else succeeds without doing anything. Both say what they were asked.
if [ "$1" = "-m" ] && [ "$2" = "fa2patch" ]; then
    shift 2
    echo "fake fa2patch $*"
    [ "$1" = "$FAIL_STEP" ] && exit 1
elif [ "$1" = "-m" ] && [ "$2" = "fa2patch.vllm_cmake" ]; then
    shift 2
    echo "fake vllm_cmake $*"
fi
exit 0
"""


@pytest.mark.parametrize("fail_step, status", [(None, 0), ("smoke", 1), ("verify", 1)])
def test_gpu_lab_fails_when_a_step_fails(tmp_path, fail_step, status):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(FAKE_PYTHON)
    (bin_dir / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(tmp_path / "out"),
           "LAB_TESTS": "0", "FAIL_STEP": fail_step or ""}
    proc = subprocess.run(["bash", str(REPO / "ci" / "gpu-lab.sh")], capture_output=True, text=True, env=env)
    assert "fake fa2patch smoke" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == status, proc.stdout + proc.stderr


def test_gpu_lab_vllm_cmake_switch_builds_through_vllms_cmake_and_verifies_the_installed_file(tmp_path):
    """LAB_VLLM_CMAKE=1: vLLM's CMake (fa2patch.vllm_cmake lab) instead of `fa2patch build`, then
    `verify --artifact` on what vLLM's install put in vllm/vllm_flash_attn/, then smoke as usual."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(FAKE_PYTHON)
    (bin_dir / "python3").chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(out), "LAB_TESTS": "0",
           "LAB_VLLM_CMAKE": "1", "FAIL_STEP": ""}
    proc = subprocess.run(["bash", str(REPO / "ci" / "gpu-lab.sh")], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = (out / "build.log").read_text()
    assert (f"fake vllm_cmake lab --workspace work/lab --vllm-archive .lab/vllm-src.tar.gz --work work/vllm-cmake "
            f"--arch sm_90 --lab-build-dir build/sm_90 --python {bin_dir / 'python3'} --summary {out}/vllm-cmake.json"
            ) in log
    assert ("fake fa2patch verify --arch sm_90 --artifact work/vllm-cmake/install/vllm/vllm_flash_attn/"
            "_vllm_fa2_C.abi3.so --workspace work/lab") in proc.stdout
    assert "fake fa2patch build" not in proc.stdout + log and "fake fa2patch smoke --arch sm_90" in proc.stdout


def test_sanitizer_bad_inputs_are_the_suites_own_cases():
    sys.path.insert(0, str(REPO / "tests" / "gpu"))
    try:
        from test_sm70_numerics import BAD
    finally:
        sys.path.pop(0)
    out = subprocess.run([sys.executable, str(REPO / "tests" / "gpu" / "sanitize_cases.py")], capture_output=True,
                         text=True, check=True).stdout
    rows = [line.split("|", 2) for line in out.splitlines()]
    bad = [(harness, json.loads(spec)) for family, harness, spec in rows if family == "bad_input"]
    suite = [(str(c.script.relative_to(REPO)), json.loads(json.dumps(c.spec))) for c in BAD if c.sanitize]
    assert bad == suite and len(bad) >= 5
    assert {h for h, _ in bad} == {"tests/gpu/sm70_cases.py", "tests/gpu/kvcache_cases.py"}
    families = {family for family, _, _ in rows}
    assert {"gqa", "head_dims", "window", "softcap_alibi", "split_kv", "kvcache", "bad_input"} <= families
    script = (REPO / "ci" / "gpu-sanitize.sh").read_text()
    assert "expect_error" not in script and "sanitize_cases.py" in script
