# SPDX-License-Identifier: BSD-3-Clause
"""fa2patch.vllm.cmake: vLLM's own CMake around the --vllm-src tree (the GPU lab's LAB_VLLM_CMAKE=1).

- The nvcc driver is vLLM 0.33.0's own top-level text (fetched, never copied here), cut to the FA2
  part; a changed file is refused by name.
- The lab's path on a CPU: `python -m fa2patch.vllm.cmake lab --dry-run` with this machine's nvcc
  (13.0) and torch 2.14.0 (.venv-torch214), TORCH_CUDA_ARCH_LIST=9.0: vLLM's real CMake configures
  the tree and the nvcc commands it would run are checked flag by flag (the lab compiles them).
- The nvcc-command check itself, on commands with one flag wrong.
The clang route through the same driver builds in test_vllm_packaging.py (vllm_built_tree).
"""

import json
import os
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from fa2patch.common.errors import CheckFailed
from fa2patch.vllm import cmake as vllm_cmake
from helpers import REPO

CUDA_HOME = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda")
TORCH214 = REPO / ".venv-torch214" / "bin" / "python"


def need(condition: bool, message: str):
    if not condition:
        if os.environ.get("FA2PATCH_REQUIRE_TOOLCHAIN") == "1":
            pytest.fail(message)
        pytest.skip(message)


def test_the_nvcc_driver_is_vllms_own_text_cut_to_the_fa2_part(vllm_src):
    text = (vllm_src / "CMakeLists.txt").read_text()
    driver = vllm_cmake.driver_cmakelists(vllm_src)
    body = driver.split("\n", 3)[3]  # after the three lines that say where it comes from
    head, rest = text.split("#\n# spinloop extension", 1)
    gpu = (
        "#\n# Set up GPU language"
        + rest.split("#\n# Set up GPU language", 1)[1].split("#\n# Use FetchContent for C++ dependencies", 1)[0]
    )
    assert body == head + gpu + (
        "include(FetchContent)\nfile(MAKE_DIRECTORY ${FETCHCONTENT_BASE_DIR})\n"
        "include(cmake/external_projects/vllm_flash_attn.cmake)\n"
    )
    # What reaches the FA2 target: vLLM's standards and its arch list, 7.0 kept below nvcc 12.8.
    for line in (
        "set(CMAKE_CXX_STANDARD 20)",
        "set(CMAKE_CUDA_STANDARD 20)",
        "find_package(Torch REQUIRED)",
        'set(CUDA_SUPPORTED_ARCHS "7.0;7.5;8.0;8.6;8.7;8.9;9.0")',
        "clear_cuda_gencode_flags(CUDA_ARCH_FLAGS)",
    ):
        assert line in body, line
    # vLLM's own kernels and its other external projects are not in it.
    assert "_moe_C" not in body and "deepgemm.cmake" not in body and "spinloop" not in body


def test_a_changed_vllm_cmakelists_is_refused_by_name(vllm_src, tmp_path):
    (tmp_path / "CMakeLists.txt").write_text(
        (vllm_src / "CMakeLists.txt").read_text().replace("# Set up GPU language", "# Set up the GPU language")
    )
    with pytest.raises(CheckFailed) as exc:
        vllm_cmake.driver_cmakelists(tmp_path)
    assert str(tmp_path / "CMakeLists.txt") in str(exc.value) and "Set up GPU language" in str(exc.value)


def nvcc_command(src: str, *, gencode="-gencode=arch=compute_90,code=sm_90", std="-std=c++20") -> list[str]:
    return [
        "/usr/bin/ccache",
        "/usr/local/cuda/bin/nvcc",
        "-DFLASHATTENTION_VLLM_OPS",
        "-DFLASHATTENTION_DISABLE_BACKWARD",
        "-DFLASHATTENTION_DISABLE_DROPOUT",
        "-DFLASHATTENTION_DISABLE_SM80",
        "-DTORCH_EXTENSION_NAME=_vllm_fa2_C",
        "-DNDEBUG",
        "-D_GLIBCXX_USE_CXX11_ABI=1",
        std,
        "-O3",
        gencode,
        "-Xptxas=-v",
        "--expt-relaxed-constexpr",
        "--expt-extended-lambda",
        "-x",
        "cu",
        "-c",
        f"/t/{src}",
        "-o",
        "x.o",
    ]


def test_the_nvcc_check_names_what_is_wrong(real_workspace):
    from fa2patch.compile.description import BuildDescription

    sources = BuildDescription.load(real_workspace).arch("sm_90").cuda_sources
    good = [nvcc_command(s) for s in sources]
    assert vllm_cmake.check_nvcc_commands(good, real_workspace, "sm_90") == []
    bad = [
        nvcc_command(sources[0], std="-std=c++17"),
        *good[1:-1],
        [*nvcc_command(sources[-1]), "-gencode=arch=compute_80,code=sm_80"],
    ]
    problems = vllm_cmake.check_nvcc_commands(bad, real_workspace, "sm_90")
    assert problems[0] == f"{sources[0]}: missing ['-std=c++20']"
    assert problems[1].startswith(f"{sources[-1]}: architecture flags") and "compute_80" in problems[1]
    assert len(problems) == 2


@pytest.fixture(scope="module")
def lab_dry_run(vllm_src, real_project, real_workspace, tmp_path_factory):
    need((CUDA_HOME / "bin" / "nvcc").exists(), f"{CUDA_HOME}/bin/nvcc: no nvcc (the machine image's CUDA 13.0)")
    need(TORCH214.exists(), f"{TORCH214}: no torch 2.14.0 (bash ci/install-torch.sh ci/torch-2.14.txt)")
    try:
        vllm_cmake.find_cmake()
    except Exception as exc:
        need(False, str(exc))
    root = tmp_path_factory.mktemp("lab")
    archive = root / "vllm-src.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(vllm_src, arcname=vllm_src.name)
    summary = root / "vllm-cmake.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fa2patch.vllm.cmake",
            "lab",
            "--dry-run",
            "--workspace",
            str(real_workspace),
            "--vllm-archive",
            str(archive),
            "--work",
            str(root / "work"),
            "--arch",
            "sm_90",
            "--python",
            str(TORCH214),
            "--summary",
            str(summary),
        ],
        capture_output=True,
        text=True,
        cwd=real_project.root,
        env={**real_project.env, "CUDA_HOME": str(CUDA_HOME)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(summary.read_text()), proc.stderr


def test_vllms_cmake_configures_the_lab_build_with_nvcc_and_the_flags_hold(lab_dry_run, real_workspace):
    from fa2patch.compile.description import BuildDescription

    desc = BuildDescription.load(real_workspace)
    result, log = lab_dry_run
    assert result["ok"] and result["problems"] == [] and "installed" not in result
    # vLLM's arch list from TORCH_CUDA_ARCH_LIST, filtered by its supported list (CUDA 13).
    assert result["arch_list"] == "9.0" and "CUDA supported target architectures: 9.0" in log
    cmds = [shlex.split(c) for c in result["commands"]]
    nvcc = vllm_cmake.compile_commands(cmds, "nvcc")
    hdim64 = next(c for s, c in nvcc.items() if s.endswith("flash_fwd_sm70_hdim64.cu"))
    assert [w for w in hdim64 if w.startswith("-gencode")] == ["-gencode=arch=compute_90,code=sm_90"]
    for flag in (
        "-std=c++20",
        "-Xptxas=-v",
        "--expt-relaxed-constexpr",
        "--expt-extended-lambda",
        "-O3",
        "-DFLASHATTENTION_VLLM_OPS",
        "-DFLASHATTENTION_DISABLE_SM80",
        "-D_GLIBCXX_USE_CXX11_ABI=1",
        "-g",
    ):  # RelWithDebInfo, setup.py's default build type
        assert flag in hdim64, flag
    assert any(w.startswith("-Xcompiler=-ffile-prefix-map=") and w.endswith("=python-include") for w in hdim64)
    assert len(nvcc) == len(desc.arch("sm_90").cuda_sources)
    host = [c for c in cmds if "-c" in c and c[c.index("-c") + 1].endswith(".cpp")]
    assert len(host) == len(desc.host_sources) and all("-std=c++20" in c for c in host)
    link = next(c for c in cmds if "-shared" in c)
    # The shared CUDA runtime torch loads, not CMake's default static copy (CUDA_RUNTIME_LIBRARY).
    assert "-lcudart_static" not in link and "-lcudart" in link
