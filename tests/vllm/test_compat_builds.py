# SPDX-License-Identifier: BSD-3-Clause
"""The compatibility builds (README "The two commands": CI's test half, so that the first command
builds once): the series built and verified against the torch of each supported vLLM release other
than the one the first command packages. Today that is torch 2.14.0, vLLM 0.33's pin, from the
package index (.venv-torch214/, ci/install-torch214.sh): its index build has no sm_70 kernels, so
the build is check-only (C++20, schemas, import, kernels, hygiene) and `package` must refuse it."""

import json

import pytest

from helpers import REPO, project_copy, require_toolchain

TORCH214 = REPO / ".venv-torch214" / "bin" / "python"


@pytest.fixture(scope="module")
def compat_project(tmp_path_factory):
    require_toolchain()
    if not TORCH214.exists():
        pytest.fail(f"{TORCH214}: no torch 2.14.0 (bash ci/install-torch214.sh installs it)")
    project = project_copy(tmp_path_factory, "compat")
    project.run("replay")
    return project


@pytest.mark.toolchain
def test_the_series_builds_and_verifies_against_torch_2_14_and_package_refuses_it(compat_project):
    build = compat_project.run(
        "build", "--arch", "sm_70", "--python", str(TORCH214), "--allow-torch-without-sm70", "--json"
    )
    manifest = json.loads(build.stdout)["manifest"]
    assert manifest["torch"]["version"].startswith("2.14.0") and manifest["torch"]["python"] == str(TORCH214)
    assert manifest["check_only"], manifest.get("check_only")
    verify = json.loads(compat_project.run("verify", "--arch", "sm_70", "--json").stdout)
    assert verify["ok"] and all(r["ok"] for r in verify["rows"]), [r for r in verify["rows"] if not r["ok"]]
    refused = compat_project.run("package", "--arch", "sm_70", check_rc=None)
    assert refused.returncode == 1 and "a check-only build is not packaged" in refused.stderr, refused.stderr
