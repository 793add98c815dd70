# SPDX-License-Identifier: BSD-3-Clause
"""The lab scripts on the CPU: ci/gpu-lab.sh fails when a step fails, ci/gpu-sanitize.sh runs
the GPU suite's own bad-input cases and judges each run (a stand-in compute-sanitizer), and the
scripts hand their decisions to fa2patch.lab.labtools (tests/test_labtools.py tests those)."""

import json
import os
import subprocess
import sys

import pytest

from fa2patch.lab import labtools
from helpers import REPO

FAKE_PYTHON = """#!/bin/sh
# Stands in for python3 in the lab scripts: `-m fa2patch STEP ...` fails for the step named in
# $FAIL_STEP; fa2patch.lab.labtools (the scripts' logic) runs in the real interpreter, except its torch
# banner; the sanitizer's case list is $FAKE_CASES; everything else succeeds without doing anything.
# All say what they were asked.
if [ "$1" = "-m" ] && [ "$2" = "fa2patch" ]; then
    shift 2
    echo "fake fa2patch $* (CUDAHOSTCXX=${CUDAHOSTCXX-unset} CXX=${CXX-unset})"
    [ "$1" = "$FAIL_STEP" ] && exit 1
elif [ "$1" = "-m" ] && [ "$2" = "pytest" ]; then
    # A session: its summary names its files' family (the last one given before --junitxml).
    files=$(printf '%s\n' "$@" | grep '^tests/gpu/' | tr '\n' ' ')
    family=$(basename "$(printf '%s\n' "$@" | grep '^tests/gpu/' | head -1)" .py)
    ok=true; case "$files" in *"$FAIL_STEP"*) [ -n "$FAIL_STEP" ] && ok=false ;; esac
    printf '{"cases": 1, "ok": %s, "failed": [], "families": {"%s": {"cases": 1, "ok": %s, "failed": [],
      "worst": {}, "worst_case": {}, "results": []}}}' "$ok" "$family" "$ok" >"$FA2PATCH_GPU_SUMMARY"
    echo "fake pytest $files"
    [ "$ok" = true ] || exit 1
elif [ "$1" = "-m" ] && [ "$2" = "fa2patch.vllm.cmake" ]; then
    shift 2
    echo "fake vllm_cmake $*"
elif [ "$1" = "-m" ] && [ "$2" = "fa2patch.lab.labtools" ] && [ "$3" = "banner" ]; then
    echo "fake banner"  # the real one imports torch: seconds per run for one line
elif [ "$1" = "-m" ] && [ "$2" = "fa2patch.lab.labtools" ]; then
    exec "$REAL_PYTHON" "$@"
elif [ "$1" = "tests/gpu/sanitize_cases.py" ]; then
    printf '%s' "$FAKE_CASES"
fi
exit 0
"""

# Stands in for compute-sanitizer: the case's spec (the last argument) says how the run ends.
FAKE_SANITIZER = """#!/bin/sh
for last; do :; done
echo "fake $2 op_only=$FA2PATCH_OP_ONLY $last"
case "$last" in
*dirty*) echo "========= Invalid __global__ read"; echo "========= ERROR SUMMARY: 1 error"; exit 9 ;;
*internal*) echo "========= Internal Sanitizer Error: x"; exit 0 ;;
*) echo "========= ERROR SUMMARY: 0 errors"; exit 0 ;;
esac
"""


def fake_env(tmp_path, **extra) -> dict:
    """An environment whose python3 and compute-sanitizer are the stand-ins above."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("python3", FAKE_PYTHON), ("compute-sanitizer", FAKE_SANITIZER)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "OUT": str(tmp_path / "out"),
        "REAL_PYTHON": sys.executable,
        "FAIL_STEP": "",
        "FAKE_CASES": "",
        **extra,
    }


@pytest.mark.parametrize("fail_step, status", [(None, 0), ("smoke", 1), ("verify", 1)])
def test_gpu_lab_fails_when_a_step_fails(tmp_path, fail_step, status):
    env = fake_env(tmp_path, LAB_TESTS="0", FAIL_STEP=fail_step or "")
    proc = subprocess.run(["bash", str(REPO / "ci" / "gpu-lab.sh")], capture_output=True, text=True, env=env)
    assert "fake fa2patch smoke" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == status, proc.stdout + proc.stderr
    # The lock's archive (docs/DESIGN.md §3), carried in .lab/ or not.
    carried = REPO / ".lab" / "flash_attn-2.8.3.tar.gz"
    fetch = "fake fa2patch fetch --sdist .lab/flash_attn-2.8.3.tar.gz" if carried.is_file() else "fake fa2patch fetch ("
    assert fetch in proc.stdout


CASES = [
    'gqa|tests/gpu/sm70_cases.py|{"d": 64}\n',
    'window|tests/gpu/sm70_cases.py|{"dirty": 1, "d": 128}\n',
    'kvcache|tests/gpu/kvcache_cases.py|{"cache": [0, 15]}\n',
]


def test_gpu_sanitize_runs_every_case_under_both_tools_and_judges_each(tmp_path):
    env = fake_env(tmp_path, FAKE_CASES="".join(CASES), SANITIZE_JOBS="2")
    proc = subprocess.run(["bash", str(REPO / "ci" / "gpu-sanitize.sh")], capture_output=True, text=True, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the window case is dirty
    out = tmp_path / "out"
    summary = json.loads((out / "sanitize-summary.json").read_text())
    assert summary["clean"] is False
    assert summary["families"] == {f: {"runs": 2, "clean": f != "window"} for f in ("gqa", "window", "kvcache")}
    runs = {(r["tool"], r["family"]): r for r in summary["runs"]}
    assert runs["memcheck", "window"]["verdict"] == "dirty" and runs["memcheck", "window"]["rc"] == 9
    assert runs["racecheck", "kvcache"] == {
        "tool": "racecheck",
        "family": "kvcache",
        "harness": "kvcache_cases.py",
        "spec": {"cache": [0, 15]},
        "rc": 0,
        "verdict": "clean",
        "summary": " ERROR SUMMARY: 0 errors",
    }
    memcheck = (out / "sanitize-memcheck.log").read_text()
    racecheck = (out / "sanitize-racecheck.log").read_text()
    assert memcheck.count("fake memcheck op_only=0") == 3 and racecheck.count("fake racecheck op_only=1") == 3
    assert proc.stdout.splitlines()[-2:] == ["[sanitize] clean runs: 4", "[sanitize] runs: 6"]


def test_gpu_sanitize_families_switch_keeps_matching_families(tmp_path):
    env = fake_env(tmp_path, FAKE_CASES="".join(CASES), SANITIZE_FAMILIES="gqa|kvcache")
    proc = subprocess.run(["bash", str(REPO / "ci" / "gpu-sanitize.sh")], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "out" / "sanitize-summary.json").read_text())
    assert summary["clean"] is True and set(summary["families"]) == {"gqa", "kvcache"}
    env["SANITIZE_FAMILIES"] = "none"
    proc = subprocess.run(["bash", str(REPO / "ci" / "gpu-sanitize.sh")], capture_output=True, text=True, env=env)
    assert proc.returncode == 1  # nothing ran: not clean


def test_gpu_lab_sanitize_switch_merges_the_verdicts_into_the_gpu_summary(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "gpu-summary.json").write_text(json.dumps({"families": {"gqa": {"rel_l2": 1e-4}}}))
    env = fake_env(tmp_path, LAB_TESTS="0", LAB_SANITIZE="1", FAKE_CASES="".join(CASES))
    proc = subprocess.run(["bash", str(REPO / "ci" / "gpu-lab.sh")], capture_output=True, text=True, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the window case is dirty
    merged = json.loads((out / "gpu-summary.json").read_text())
    assert merged == {
        "families": {"gqa": {"rel_l2": 1e-4}},
        "sanitizer": {"clean": False, "families": {"gqa": "clean", "window": "dirty", "kvcache": "clean"}},
    }


def test_gpu_lab_vllm_cmake_switch_builds_through_vllms_cmake_and_verifies_the_installed_file(tmp_path):
    """LAB_VLLM_CMAKE=1: vLLM's CMake (fa2patch.vllm.cmake lab) instead of `fa2patch build`, then
    `verify --artifact` on what vLLM's install put in vllm/vllm_flash_attn/, then smoke as usual."""
    out = tmp_path / "out"
    env = fake_env(tmp_path, LAB_TESTS="0", LAB_VLLM_CMAKE="1")
    bin_dir = tmp_path / "bin"
    proc = subprocess.run(["bash", str(REPO / "ci" / "gpu-lab.sh")], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = (out / "build.log").read_text()
    assert (
        f"fake vllm_cmake lab --workspace work/lab --vllm-archive .lab/vllm-src-0.33.0.tar.gz --work work/vllm-cmake "
        f"--arch sm_90 --lab-build-dir build/sm_90 --python {bin_dir / 'python3'} --summary {out}/vllm-cmake.json"
    ) in log
    assert (
        "fake fa2patch verify --arch sm_90 --artifact work/vllm-cmake/install/vllm/vllm_flash_attn/"
        "_vllm_fa2_C.abi3.so --workspace work/lab"
    ) in proc.stdout
    assert "fake fa2patch build" not in proc.stdout + log and "fake fa2patch smoke --arch sm_90" in proc.stdout


def test_sanitizer_bad_inputs_are_the_suites_own_cases():
    sys.path.insert(0, str(REPO / "tests" / "gpu"))
    try:
        from test_sm70_numerics import BAD
    finally:
        sys.path.pop(0)
    out = subprocess.run(
        [sys.executable, str(REPO / "tests" / "gpu" / "sanitize_cases.py")], capture_output=True, text=True, check=True
    ).stdout
    rows = [line.split("|", 2) for line in out.splitlines()]
    bad = [(harness, json.loads(spec)) for family, harness, spec in rows if family == "bad_input"]
    suite = [(str(c.script.relative_to(REPO)), json.loads(json.dumps(c.spec))) for c in BAD if c.sanitize]
    assert bad == suite and len(bad) >= 5
    assert {h for h, _ in bad} == {"tests/gpu/sm70_cases.py", "tests/gpu/kvcache_cases.py"}
    families = {family for family, _, _ in rows}
    assert {"gqa", "head_dims", "window", "softcap_alibi", "split_kv", "kvcache", "bad_input"} <= families
    script = (REPO / "ci" / "gpu-sanitize.sh").read_text()
    assert "expect_error" not in script and "sanitize_cases.py" in script


def test_cases_with_a_reference_of_tens_of_gb_run_a_few_at_a_time():
    """The GPU suite's case runner sends heavy cases (slow, or a score matrix of 2**28 entries per
    head and more) to its small pool: in the lab's run of 2026-12-01 four Q=8000 long-prefill
    references at once (up to 43 GB each) left a concurrent session's case out of memory."""
    sys.path.insert(0, str(REPO / "tests" / "gpu"))
    try:
        from test_long_prefill_gpu import CASES
        from test_sm70_numerics import NUMERICS, Case
    finally:
        sys.path.pop(0)
    workload = [c for c in CASES if c.spec["seqlens"][0][0] == 8000]
    assert workload and all(c.heavy for c in workload)
    assert not any(c.heavy for c in NUMERICS if not c.slow)
    assert Case("f", "n", {"seqlens": [(1, 1), (16384, 16384)]}).heavy
    assert not Case("f", "n", {"seqlens": [(16384, 16383)]}).heavy


def test_gpu_lab_runs_one_pytest_session_per_group_and_merges_their_summaries(tmp_path):
    """tests/gpu as labtools' groups, all sessions at once, each with its log and JUnit; one summary; a
    failed session fails the run. The build runs with the lab image's host compilers unset."""
    out = tmp_path / "out"
    groups = labtools.session_groups(REPO / "tests/gpu")
    env = fake_env(tmp_path, CUDAHOSTCXX="/opt/gcc/bin/g++", CXX="/opt/gcc/bin/g++")
    proc = subprocess.run(["bash", "ci/gpu-lab.sh"], capture_output=True, text=True, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (
        "fake fa2patch build --arch sm_90 --cuda-compiler nvcc --workspace work/lab (CUDAHOSTCXX=unset CXX=unset)"
        in (out / "build.log").read_text()
    )
    for i, group in enumerate(groups):
        files = " ".join(str(f.relative_to(REPO)) for f in group)
        assert f"[lab] pytest session {i}: {files}" in proc.stdout
        assert f"fake pytest {files} " in (out / f"pytest-{i}.log").read_text()
    merged = json.loads((out / "gpu-summary.json").read_text())
    assert set(merged["families"]) == {g[0].stem for g in groups} and merged["cases"] == len(groups)
    env["FAIL_STEP"] = "test_routing_gpu"
    proc = subprocess.run(["bash", "ci/gpu-lab.sh"], capture_output=True, text=True, env=env, cwd=REPO)
    assert proc.returncode == 1 and "exit 1" in proc.stdout, proc.stdout + proc.stderr
    assert json.loads((out / "gpu-summary.json").read_text())["ok"] is False
