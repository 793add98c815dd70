"""The real baseline and this repository's patch series: replay, round trip, build, verify."""

import json
import shutil
import subprocess
import sys
from pathlib import Path
import tomllib

import pytest

from helpers import REPO, require_toolchain


def test_replay_is_deterministic_and_matches_the_lock(real_project, real_workspace, tmp_path):
    lock = tomllib.loads((REPO / "baseline.lock").read_text())
    again = tmp_path / "again"
    real_project.run("replay", "--workspace", str(again))
    first = real_project.git("log", "--format=%H %s")
    assert real_project.git("log", "--format=%H %s", cwd=again) == first
    assert len(first.splitlines()) == 1 + len(lock["patches"])
    check = json.loads(real_project.run("check", "--json").stdout)
    assert check["ok"] and all(f["ok"] for f in check["findings"])
    assert {"workspace", "toolchain pins", "archive"} <= {f["item"] for f in check["findings"]}


def test_replay_then_export_is_a_byte_identical_round_trip(real_project, real_workspace):
    before = {p.name: p.read_bytes() for p in (real_project.root / "patches").iterdir()}
    lock_before = (real_project.root / "baseline.lock").read_bytes()
    real_project.run("export")
    assert {p.name: p.read_bytes() for p in (real_project.root / "patches").iterdir()} == before
    assert (real_project.root / "baseline.lock").read_bytes() == lock_before
    assert before == {p.name: p.read_bytes() for p in (REPO / "patches").iterdir()}


@pytest.fixture(scope="module")
def built_sm70(real_project, real_workspace):
    """The sm_70 build; with --json its stdout is one JSON object (ninja and the compiler write to
    stderr)."""
    require_toolchain()
    proc = real_project.run("build", "--arch", "sm_70", "--json")
    result = json.loads(proc.stdout)
    assert result["ok"] and result["manifest"]["arch"] == "sm_70"
    return real_project.root / "build" / "sm_70"


def test_sm70_build_writes_extension_and_manifest(built_sm70, real_project):
    manifest = json.loads((built_sm70 / "manifest.json").read_text())
    lock = tomllib.loads((REPO / "baseline.lock").read_text())
    artifact = built_sm70 / manifest["artifact"]["file"]
    assert artifact.name == "_vllm_fa2_C.abi3.so" and artifact.is_file()
    import hashlib
    assert manifest["artifact"]["sha256"] == hashlib.sha256(artifact.read_bytes()).hexdigest()
    assert manifest["source_tree_digest"] == lock["patches"][-1]["tree_digest"]
    assert manifest["source_matches_lock"] is True
    assert manifest["arch"] == "sm_70" and manifest["compiler"]["kind"] in ("clang", "nvcc")
    assert manifest["torch"]["version"].startswith(lock["toolchain"]["torch"])
    if manifest["compiler"]["kind"] == "clang":
        assert manifest["ptxas_version"].startswith("12.8")
        assert "-D__CUDACC_VER_MAJOR__=12" in manifest["commands"]["cuda"]


def test_verify_passes_and_matches_both_schemas(built_sm70, real_project):
    proc = real_project.run("verify", "--arch", "sm_70", "--json")
    result = json.loads(proc.stdout)
    rows = {r["name"]: r for r in result["rows"]}
    assert result["ok"] and rows["varlen_fwd"]["ok"] and rows["fwd_kvcache"]["ok"] and rows["build_info"]["ok"]


def test_verify_and_report_find_the_same_launch_for_every_kernel(built_sm70, real_project):
    """Both match build_info()'s kernels to the binary's with the same globs: every kernel verify
    checked with a launch has an occupancy in the report, computed with the same shared memory."""
    rows = json.loads(real_project.run("verify", "--arch", "sm_70", "--json").stdout)["rows"]
    shared = {r["name"]: r["numbers"]["shared"] for r in rows if r["kind"] == "kernel"}
    report = json.loads(real_project.run("report", "--arch", "sm_70", "--json").stdout)
    assert report["ok"] and {k["kernel"] for k in report["kernels"]} == set(shared)
    for k in report["kernels"]:
        assert k["occupancy"] is not None, k["kernel"]
        assert k["occupancy"]["shared_bytes"] == shared[k["kernel"]], k["kernel"]


def test_verify_fails_on_a_schema_that_differs(built_sm70, real_project):
    schemas = real_project.root / "schemas" / "vllm_fa2_ops.toml"
    original = schemas.read_text()
    try:
        schemas.write_text(original.replace("int num_splits, Tensor? gen", "int num_split, Tensor? gen"))
        proc = real_project.run("verify", "--arch", "sm_70", check_rc=1)
        assert "varlen_fwd" in proc.stdout and "FAIL" in proc.stdout and "num_split," in proc.stdout
        schemas.write_text(original + 'missing_op = "missing_op(Tensor x) -> Tensor"\n')
        proc = real_project.run("verify", "--arch", "sm_70", check_rc=1)
        assert "_vllm_fa2_C::missing_op is missing" in proc.stdout
    finally:
        schemas.write_text(original)


def test_verify_detects_a_tampered_artifact(built_sm70, real_project, tmp_path):
    artifact = built_sm70 / "_vllm_fa2_C.abi3.so"
    saved = tmp_path / "saved.so"
    shutil.copy(artifact, saved)
    try:
        with open(artifact, "r+b") as f:
            f.seek(-1, 2)
            last = f.read(1)
            f.seek(-1, 2)
            f.write(bytes([last[0] ^ 1]))
        proc = real_project.run("verify", "--arch", "sm_70", check_rc=1)
        assert "_vllm_fa2_C.abi3.so" in proc.stderr and "sha256 mismatch" in proc.stderr
    finally:
        shutil.copy(saved, artifact)


def test_ops_without_sm70_kernels_raise_instead_of_crashing(built_sm70):
    """The library loads on a GPU-less machine; build_info says what it has (routes exactly
    when SM70 kernels are built); a call with CPU tensors raises and the process survives."""
    code = r"""
import json, sys, torch
torch.ops.load_library(sys.argv[1])
info = json.loads(torch.ops._vllm_fa2_C.build_info())
q = torch.zeros(4, 2, 64, dtype=torch.float16)
cu = torch.tensor([0, 4], dtype=torch.int32)
try:
    torch.ops._vllm_fa2_C.varlen_fwd(q, q, q, None, cu, cu, None, None, None, None, 4, 4, 0.0, 0.125,
                                     False, True, -1, -1, 0.0, False, 0, None)
    raised = None
except Exception as exc:
    raised = type(exc).__name__
print(json.dumps({"info": info, "raised": raised}))
"""
    out = subprocess.run([sys.executable, "-c", code, str(built_sm70 / "_vllm_fa2_C.abi3.so")],
                         capture_output=True, text=True, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["info"]["library"] == "_vllm_fa2_C"
    assert result["info"]["sm70_kernels"] == bool(result["info"]["routes"])
    assert result["raised"] is not None


def test_artifact_names_no_folder_of_this_machine(built_sm70, real_project):
    """Header paths reach the binary through __FILE__: neither the project, the workspace nor the
    Python environment (torch's headers) may appear in it, or the bytes depend on the machine."""
    data = (built_sm70 / "_vllm_fa2_C.abi3.so").read_bytes()
    import torch

    folders = {str(real_project.root), sys.prefix, str(Path(torch.__file__).parents[1])}
    assert [f for f in folders if f.encode() in data] == []


def test_build_is_reproducible_from_another_project_folder(built_sm70, real_project, tmp_path):
    """The same locked series built in another folder gives a byte-identical extension."""
    other = tmp_path / "elsewhere"
    shutil.copytree(real_project.root, other, ignore=shutil.ignore_patterns("work", "build"))
    env = {**real_project.env, "FA2PATCH_ROOT": str(other)}
    for args in (["replay"], ["build", "--arch", "sm_70"]):
        subprocess.run([sys.executable, "-m", "fa2patch", *args], env=env, check=True,
                       capture_output=True)
    mine = json.loads((built_sm70 / "manifest.json").read_text())["artifact"]["sha256"]
    theirs = json.loads((other / "build" / "sm_70" / "manifest.json").read_text())["artifact"]["sha256"]
    assert theirs == mine
