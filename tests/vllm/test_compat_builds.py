# SPDX-License-Identifier: BSD-3-Clause
"""The compatibility builds (CI's test half, so that the README's first command builds once): the
series built against the torch of every supported vLLM release other than the primary one
(packaging/vllm-releases.toml), each from its own venv (ci/install-torch.sh), and verified there.
A release whose torch on the package index carries sm_70 (vLLM 0.16.0, torch 2.9.1+cu128) gets a
real build that `package` turns into its wheel, for that release only; one whose torch does not
(vLLM 0.33.0, torch 2.14.0+cu130) gets a check-only build (C++20, schemas, import, kernels,
hygiene) that `package` refuses."""

import json
import zipfile

import pytest

from fa2patch.common.project import Project
from fa2patch.vllm import releases
from helpers import REPO, project_copy, require_toolchain

MATRIX = releases.load(Project(REPO))
OTHERS = [r for r in MATRIX.releases if r.version != MATRIX.primary.version]
# Each release's torch environment: ci/torch-<version>.txt installed by ci/install-torch.sh.
VENVS = {"2.9.1": REPO / ".venv-torch291", "2.14.0": REPO / ".venv-torch214"}


@pytest.fixture(scope="module")
def compat_project(tmp_path_factory):
    require_toolchain()
    project = project_copy(tmp_path_factory, "compat")
    project.run("replay")
    return project


def test_every_other_release_has_its_torch_environment():
    assert {r.torch for r in OTHERS} == set(VENVS)


@pytest.mark.toolchain
@pytest.mark.parametrize("release", OTHERS, ids=[r.version for r in OTHERS])
def test_the_series_builds_and_verifies_against_each_releases_torch(compat_project, release, tmp_path):
    python = VENVS[release.torch] / "bin" / "python"
    if not python.exists():
        pytest.fail(f"{python}: no torch {release.torch} (bash ci/install-torch.sh ci/torch-*.txt installs it)")
    check_only = release.torch_cuda.split(".")[0] != "12"  # the clang route builds with CUDA 12.8
    args = ["build", "--arch", "sm_70", "--python", str(python), "--json"]
    build = compat_project.run(*args, *(["--allow-torch-without-sm70"] if check_only else []))
    manifest = json.loads(build.stdout)["manifest"]
    assert manifest["torch"]["version"].split("+")[0] == release.torch and manifest["torch"]["python"] == str(python)
    verify = json.loads(compat_project.run("verify", "--arch", "sm_70", "--json").stdout)
    assert verify["ok"] and all(r["ok"] for r in verify["rows"]), [r for r in verify["rows"] if not r["ok"]]
    package = compat_project.run("package", "--arch", "sm_70", "--out", str(tmp_path), check_rc=None)
    if check_only:
        assert manifest["check_only"], manifest
        assert package.returncode == 1 and "a check-only build is not packaged" in package.stderr, package.stderr
        return
    assert not manifest.get("check_only") and package.returncode == 0, package.stderr
    # Its math-library headers came from that environment's wheels, at torch's pins.
    libs = {lib["dist"]: lib for lib in manifest["torch"]["cuda_libraries"]}
    assert {"nvidia-cublas-cu12", "nvidia-cusparse-cu12"} <= set(libs)
    assert all(lib["installed"] == lib["pin"] and str(VENVS[release.torch]) in lib["include"] for lib in libs.values())
    (wheel,) = tmp_path.glob("fa2patch_vllm-*+torch*.whl")
    assert f"+torch{release.torch}." in wheel.name, wheel.name
    with zipfile.ZipFile(wheel) as zf:
        assert json.loads(zf.read("fa2patch_vllm/build.json"))["vllm"] == [release.version]
