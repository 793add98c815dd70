# SPDX-License-Identifier: BSD-3-Clause
"""CLI behaviour: help, JSON, exit codes and error messages for bad input."""

import json
import os
import subprocess
import sys

import pytest

from helpers import REPO

COMMANDS = [
    "fetch",
    "replay",
    "export",
    "check",
    "doctor",
    "build",
    "verify",
    "smoke",
    "report",
    "bench",
    "tune",
    "package",
]


def fa2patch(*args, env=None, cwd=REPO):
    return subprocess.run(
        [sys.executable, "-m", "fa2patch", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command):
    proc = fa2patch(command, "--help")
    assert proc.returncode == 0 and "Usage: fa2patch " + command in proc.stdout
    assert "--json" in proc.stdout


def test_the_command_list_is_complete():
    from fa2patch.cli.main import cli

    assert sorted(cli.commands) == sorted(COMMANDS)


def test_top_level_help_documents_exit_codes():
    proc = fa2patch("--help")
    assert proc.returncode == 0
    for code in ("0 ok", "1 a check", "2 usage", "3 nothing to launch"):
        assert code in proc.stdout.replace("\n", " ").replace("  ", " ")


def _json_document(proc) -> dict:
    """stdout must be exactly one JSON object with a boolean "ok" that agrees with the exit code."""
    doc = json.loads(proc.stdout)  # raises on anything but one JSON document
    assert isinstance(doc, dict) and isinstance(doc["ok"], bool), proc.stdout
    assert doc["ok"] == (proc.returncode == 0), (proc.returncode, proc.stdout, proc.stderr)
    if not doc["ok"] and "error" in doc:
        assert doc["exit_code"] == proc.returncode and doc["error"] in proc.stderr
    return doc


# Each command once with --json in a small project: the ones that can succeed there do; the
# others fail (no build, no GPU) and must say so in JSON too.
JSON_ARGS = {"fetch": ["--sdist", "{archive}"], "replay": ["--sdist", "{archive}"]}


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_prints_one_json_object(mini, command):
    mini.run("replay", "--sdist", str(mini.archive))
    args = [a.format(archive=mini.archive) for a in JSON_ARGS.get(command, [])]
    proc = mini.run(command, *args, "--json", check_rc=None)
    doc = _json_document(proc)
    if command in ("fetch", "replay", "export", "check"):
        assert doc["ok"], proc.stderr


def test_usage_errors_are_json_too(mini):
    proc = mini.run("build", "--no-such-flag", "--json", check_rc=2)
    doc = _json_document(proc)
    assert "no-such-flag" in doc["error"]
    proc = mini.run("report", "--launch", "x", "--json", check_rc=2)
    assert "GLOB=THREADS" in _json_document(proc)["error"]


def test_unknown_option_is_a_usage_error():
    assert fa2patch("build", "--no-such-flag").returncode == 2


def test_outside_a_project_names_the_missing_lock(tmp_path):
    proc = fa2patch("check", cwd=tmp_path, env={"FA2PATCH_ROOT": ""})
    assert proc.returncode == 2 and "baseline.lock" in proc.stderr


def test_missing_lock_via_root(tmp_path):
    proc = fa2patch("check", env={"FA2PATCH_ROOT": str(tmp_path)})
    assert proc.returncode == 2 and str(tmp_path / "baseline.lock") in proc.stderr


def test_malformed_lock_names_file_and_field(mini):
    lock = mini.root / "baseline.lock"
    lock.write_text(lock.read_text().replace('sha256 = "', 'sha256 = "zz'))
    proc = mini.run("check", check_rc=1)
    assert str(lock) in proc.stderr and "[baseline] sha256" in proc.stderr


def test_unsupported_arch_names_build_description_expected_and_actual(real_workspace, real_project):
    proc = real_project.run("build", "--arch", "sm_50", check_rc=2)
    assert "fa2patch-build.toml" in proc.stderr and "sm_70" in proc.stderr and "sm_50" in proc.stderr


def test_missing_toolchain_fails_fast_with_install_command(real_workspace, real_project):
    env = {**real_project.env, "FA2PATCH_CLANG": "/nonexistent/clang++-22", "PATH": "/usr/bin:/bin", "CUDA_HOME": ""}
    proc = subprocess.run(
        [sys.executable, "-m", "fa2patch", "build", "--arch", "sm_70", "--cuda-compiler", "clang"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 2
    assert "clang++-22: not found" in proc.stderr and "apt-get install -y clang-22" in proc.stderr


def test_nvcc_that_cannot_target_sm70_is_named(real_workspace, real_project, tmp_path):
    fake = tmp_path / "nvcc"
    fake.write_text(
        "#!/bin/sh\ncase \"$1\" in --version) echo 'Cuda compilation tools, release 13.0, V13.0.88';;"
        " --list-gpu-arch) echo compute_75 compute_90;; esac\n"
    )
    fake.chmod(0o755)
    env = {**real_project.env, "FA2PATCH_NVCC": str(fake)}
    proc = subprocess.run(
        [sys.executable, "-m", "fa2patch", "build", "--arch", "sm_70", "--cuda-compiler", "nvcc"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 2 and "CUDA 13.0 cannot target sm_70" in proc.stderr


def test_the_nvcc_route_compiles_as_cxx20_like_the_clang_route(real_workspace, tmp_path, monkeypatch):
    """A CUDA 12.6 nvcc (a stand-in that answers --version and --list-gpu-arch): host and CUDA
    sources get -std=c++20, as on the clang route."""
    from fa2patch.compile import builder as build
    from fa2patch.compile.description import BuildDescription
    from helpers import locked_toolchain

    fake = tmp_path / "nvcc"
    fake.write_text(
        "#!/bin/sh\ncase \"$1\" in --version) echo 'Cuda compilation tools, release 12.6, V12.6.85';;"
        " --list-gpu-arch) echo compute_70 compute_75 compute_90;; esac\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("FA2PATCH_NVCC", str(fake))
    desc = BuildDescription.load(real_workspace)
    p = build.plan(desc, "sm_70", real_workspace, tmp_path / "b", "nvcc", locked_toolchain())
    assert p.compiler.kind == "nvcc" and p.compiler.version == "12.6"
    assert "-std=c++20" in p.cxx_flags and "-std=c++20" in p.cuda_flags
    assert "-gencode=arch=compute_70,code=sm_70" in p.cuda_flags


def test_build_without_workspace_is_an_environment_error(mini):
    proc = mini.run("build", check_rc=2)
    assert "workspace not found" in proc.stderr


def test_verify_without_build_is_an_environment_error(mini):
    proc = mini.run("verify", check_rc=2)
    assert "no build here" in proc.stderr


def test_smoke_exits_3_when_nothing_can_be_launched(mini):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: tests/gpu covers smoke there")
    proc = mini.run("smoke", check_rc=3)
    assert "nothing launched" in proc.stderr and "torch.cuda.is_available() is False" in proc.stderr


def test_an_extension_that_does_not_load_fails_report_and_verify(mini):
    """report needs build_info() for the launch configurations: it fails like bench does, instead
    of printing a report without occupancy; verify fails its load row."""
    import hashlib
    import shutil

    shutil.copytree(REPO / "schemas", mini.root / "schemas")
    shutil.copy(REPO / "budgets.toml", mini.root / "budgets.toml")
    build = mini.root / "build" / "sm_70"
    build.mkdir(parents=True)
    artifact = build / "_vllm_fa2_C.abi3.so"
    artifact.write_bytes(b"not a shared library")
    (build / "manifest.json").write_text(
        json.dumps(
            {
                "arch": "sm_70",
                "lab": False,
                "tensor_core_kernels": [],
                "ptxas_kernels": [],
                "artifact": {"file": artifact.name, "sha256": hashlib.sha256(artifact.read_bytes()).hexdigest()},
            }
        )
    )
    proc = mini.run("report", "--arch", "sm_70", check_rc=2)
    assert f"{artifact}: cannot load it" in proc.stderr
    proc = mini.run("verify", "--arch", "sm_70", "--json", check_rc=1)
    rows = {r["name"]: r for r in json.loads(proc.stdout)["rows"]}
    assert not rows["load"]["ok"] and "torch could not load it" in rows["load"]["detail"]
