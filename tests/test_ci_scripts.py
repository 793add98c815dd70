"""The lab scripts on the CPU: ci/gpu-lab.sh fails when a step fails, and ci/gpu-sanitize.sh runs
the GPU suite's own bad-input cases."""

import json
import os
import subprocess
import sys

import pytest

from helpers import REPO

FAKE_PYTHON = """#!/bin/sh
# Stands in for python3 in ci/gpu-lab.sh: `-m fa2patch STEP` fails for the step named in
# $FAIL_STEP; everything else succeeds without doing anything.
if [ "$1" = "-m" ] && [ "$2" = "fa2patch" ]; then
    echo "fake fa2patch $3"
    [ "$3" = "$FAIL_STEP" ] && exit 1
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
