# SPDX-License-Identifier: BSD-3-Clause
"""`fa2patch doctor --vllm PYTHON` against the supported releases (packaging/vllm-releases.toml):

- vLLM 0.33.0 from the package index, installed with --no-deps next to the real torch it pins
  (2.14.0, .venv-torch214/ from ci/install.sh): what pip gives a V100 user; it must say why it
  cannot work there and name the release that can. The same vLLM files next to this environment's
  torch (2.10.0) as well.
- vLLM 0.19.1, the primary release, from the package index next to the torch it pins (this
  environment's, 2.10.0+cu128): without fa2patch's wheel the next command builds and installs it;
  with the wheel the gate makes, ready. A release outside the matrix is refused by name.
- this environment alone (torch 2.10.0, which carries sm_70, no vLLM);
- a complete fake environment: a vLLM built from source for 7.0 (its metadata, a kernel library
  compiled for sm_70, fa2patch's real _vllm_fa2_C), torch 2.14.0+cu126 (a stand-in reporting
  that build's facts), fa2patch's plugin wheel installed, an nvcc 12.6: ready.
Expected facts come from the issue's and docs/DESIGN.md §10's measurements, not from the doctor.
"""

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from fa2patch.common.project import Project
from fa2patch.vllm import releases
from helpers import REPO, locked_toolchain, require_toolchain

MATRIX = releases.load(Project(REPO))
RELEASE = MATRIX.get("0.33.0")  # the source-build release: no index install runs on a V100
PRIMARY = MATRIX.primary  # 0.19.1: the newest release a V100 runs from the package index
TORCH214 = REPO / ".venv-torch214"
CU126 = "--index-url https://download.pytorch.org/whl/cu126"


def doctor(project, python, env=None, rc=1) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "fa2patch", "doctor", "--vllm", str(python), "--json"],
        capture_output=True,
        text=True,
        env={**project.env, **(env or {})},
    )
    assert proc.returncode == rc, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout)


def checks(result) -> dict:
    return {c["name"]: c for c in result["checks"]}


def env_with(path: Path, *sites: Path) -> Path:
    """A venv whose site-packages also reads ``sites`` (.pth files), in that order."""
    venv.EnvBuilder(with_pip=False).create(path)
    site = next(path.glob("lib/python*/site-packages"))
    for i, other in enumerate(sites):
        (site / f"{i}-extra.pth").write_text(f"{other}\n")
    return path / "bin" / "python"


@pytest.fixture(scope="module")
def torch214_site() -> Path:
    site = next(TORCH214.glob("lib/python*/site-packages"), None)
    if site is None or not (site / "torch").is_dir():
        message = f"{TORCH214}: no torch 2.14.0 (bash ci/install-torch.sh ci/torch-2.14.txt installs it)"
        if os.environ.get("FA2PATCH_REQUIRE_TOOLCHAIN") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return site


def index_install(target: Path, version: str) -> Path:
    """vLLM's wheel from the package index, installed --no-deps (its metadata says how: no
    direct_url.json), into a folder that environments add to their path."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            f"vllm=={version}",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return target


@pytest.fixture(scope="module")
def vllm_index_files(tmp_path_factory) -> Path:
    return index_install(tmp_path_factory.mktemp("vllm-index") / "site", RELEASE.version)


@pytest.fixture(scope="module")
def primary_index_files(tmp_path_factory) -> Path:
    return index_install(tmp_path_factory.mktemp("vllm-primary") / "site", PRIMARY.version)


def test_a_real_vllm_index_install_cannot_work_on_v100(real_project, torch214_site, vllm_index_files, tmp_path):
    python = env_with(tmp_path / "venv", torch214_site, vllm_index_files)
    result = doctor(real_project, python)
    assert result["verdict"] == "cannot" and result["ok"] is False
    # vLLM 0.33.0 pins torch==2.14.0; the index's 2.14.0 (+cu130) lists sm_75..sm_120 (issue 16).
    vllm = result["facts"]["vllm"]
    assert vllm["version"] == RELEASE.version and vllm["torch_pin"] == RELEASE.torch == "2.14.0"
    assert vllm["installed"] == "from a package index (no direct_url.json)"
    assert (
        result["facts"]["torch"]["version"] == "2.14.0+cu130" and "sm_70" not in result["facts"]["torch"]["arch_list"]
    )
    # Its kernels: _C_stable_libtorch.abi3.so sm_75..sm_120, its _vllm_fa2_C sm_80 only (issue 16).
    kernels = vllm["kernels"]
    assert Path(kernels["file"]).name == "_C_stable_libtorch.abi3.so"
    assert kernels["sm"][0] == "sm_75" and kernels["sm"][-1] == "sm_120" and "sm_70" not in kernels["sm"]
    assert result["facts"]["fa2_extension"]["sm"] == ["sm_80"] and result["facts"]["fa2_extension"]["fa2patch"] is False
    c = checks(result)
    assert c["vllm kernels"]["ok"] is False and c["torch"]["ok"] is False and c["torch pin"]["ok"] is True
    assert "installed from a package index" in result["reason"] and "carry no sm_70" in result["reason"]
    assert "its torch 2.14.0+cu130 has no sm_70 either" in result["reason"]
    assert "V100 with vLLM 0.33, from zero" in result["instead"]
    assert (
        f"pip install vllm=={PRIMARY.version}" in result["instead"]
        and "V100 from the package index" in result["instead"]
    )
    text = subprocess.run(
        [sys.executable, "-m", "fa2patch", "doctor", "--vllm", str(python)],
        capture_output=True,
        text=True,
        env=real_project.env,
    ).stdout
    assert "cannot work: vLLM 0.33.0 here was installed from a package index" in text


def test_the_same_vllm_next_to_this_torch_names_the_pin(real_project, vllm_index_files, tmp_path):
    import torch

    python = env_with(tmp_path / "venv", Path(torch.__file__).parents[1], vllm_index_files)
    result = doctor(real_project, python)
    c = checks(result)
    assert c["torch"]["ok"] is True  # 2.10.0 carries sm_70 ...
    assert c["torch pin"]["ok"] is False and f"this environment has {torch.__version__}" in c["torch pin"]["detail"]
    assert result["verdict"] == "cannot"  # ... but vLLM's own kernels still do not run on 7.0


def test_this_environment_is_told_to_install_the_release_its_torch_serves(real_project):
    """This environment: torch 2.10.0 (with sm_70), no vLLM: vLLM 0.19.1 pins that torch and runs on
    a V100 from the package index, so the next command installs it."""
    import torch

    assert torch.__version__.split("+")[0] == PRIMARY.torch == "2.10.0"
    result = doctor(real_project, sys.executable)
    c = checks(result)
    assert result["verdict"] == "next" and c["torch"]["ok"] is True and c["vllm"]["ok"] is None
    assert result["next"] == f"{sys.executable} -m pip install vllm==0.19.1"
    assert result["facts"]["release"] == {"version": "0.19.1", "line": "0.17.1 - 0.19.1", "v100_from_index": True}


@pytest.fixture(scope="module")
def primary_wheel(built_sm70, real_project) -> Path:
    """The wheel the README's first command packages (built against this environment's torch)."""
    out = json.loads(real_project.run("package", "--arch", "sm_70", "--json").stdout)
    return Path(out["wheel"])


def test_vllm_0_19_1_from_the_index_is_ready_with_the_wheel(real_project, primary_index_files, primary_wheel, tmp_path):
    """vLLM 0.19.1 as `pip install vllm==0.19.1` gives it (its wheel, this environment's torch
    2.10.0+cu128): without fa2patch the next command builds and installs the wheel; with the wheel
    the first command packages, ready."""
    import torch

    torch_site = Path(torch.__file__).parents[1]
    python = env_with(tmp_path / "bare", torch_site, primary_index_files)
    result = doctor(real_project, python)
    c = checks(result)
    assert c["vllm release"]["ok"] is True and "runs on 7.0 from the package index" in c["vllm release"]["detail"]
    assert c["vllm kernels"]["ok"] is True and "sm_70" in result["facts"]["vllm"]["kernels"]["sm"]
    assert c["torch pin"]["ok"] is True and result["facts"]["fa2_extension"]["sm"] == ["sm_80"]
    assert result["verdict"] == "next" and f"build --arch sm_70 --python {python}" in result["next"]
    plugin_site = tmp_path / "plugin"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(plugin_site), str(primary_wheel)],
        check=True,
        capture_output=True,
    )
    python = env_with(tmp_path / "ready", plugin_site, torch_site, primary_index_files)
    result = doctor(real_project, python, rc=0)
    assert result["verdict"] == "ready", result
    assert result["facts"]["plugin"]["bundles_extension"] is True and result["facts"]["plugin"]["registered"] is True
    assert checks(result)["vllm _vllm_fa2_C"]["ok"] is None  # vLLM's own (sm_80) is replaced by the wheel's


def test_a_release_outside_the_matrix_is_refused_by_name(real_project, tmp_path):
    site = tmp_path / "site"
    info = site / "vllm-0.18.0.dist-info"
    (site / "vllm").mkdir(parents=True)
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.18.0\nRequires-Dist: torch==2.10.0\n")
    (info / "RECORD").write_text("")
    import torch

    python = env_with(tmp_path / "venv", site, Path(torch.__file__).parents[1])
    result = doctor(real_project, python)
    assert result["verdict"] == "cannot" and checks(result)["vllm release"]["ok"] is False
    assert result["reason"] == (
        "vLLM 0.18.0 is not a release fa2patch supports (0.19.1, 0.16.0, 0.33.0): the plugin refuses it"
    )
    assert "pip install vllm==0.19.1" in result["instead"]


# --- a complete fake environment ----------------------------------------------------------------

FAKE_TORCH = """__version__ = "2.14.0+cu126"
class version:
    cuda = "12.6"
class _C:
    _GLIBCXX_USE_CXX11_ABI = True
    @staticmethod
    def _cuda_getArchFlags():
        return "sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90"
"""
KERNEL = "__global__ void scale(float* x, float a) { x[threadIdx.x] *= a; }\n"


def fake_torch_site(site: Path, include: list[str], lib: list[str]) -> Path:
    """A site-packages folder whose torch is the FAKE_TORCH stand-in with these include and library paths."""
    (site / "torch" / "utils").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text(FAKE_TORCH)
    (site / "torch" / "utils" / "__init__.py").write_text("")
    (site / "torch" / "utils" / "cpp_extension.py").write_text(
        f"def include_paths():\n    return {include!r}\ndef library_paths():\n    return {lib!r}\n"
    )
    return site


def fake_vllm(site: Path, fa2_extension: Path, cuda_path: Path) -> None:
    """vLLM 0.33.0 built from source for 7.0 (pip install -e . in /src/vllm): its metadata, a kernel
    library compiled for sm_70 as vllm/_C.abi3.so, and fa2patch's _vllm_fa2_C where vLLM's build
    installs it."""
    pkg = site / "vllm"
    (pkg / "vllm_flash_attn").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('the doctor must not import vllm')\n")
    src = site.parent / "kernel.cu"
    src.write_text(KERNEL)
    clang = __import__("fa2patch.compile.toolchain", fromlist=["x"]).find_clang(locked_toolchain().clang)
    subprocess.run(
        [
            str(clang),
            "-x",
            "cuda",
            "--cuda-gpu-arch=sm_70",
            f"--cuda-path={cuda_path}",
            "-shared",
            "-fPIC",
            "-O2",
            str(src),
            "-o",
            str(pkg / "_C.abi3.so"),
        ],
        check=True,
        capture_output=True,
    )
    (pkg / "vllm_flash_attn" / "_vllm_fa2_C.abi3.so").write_bytes(fa2_extension.read_bytes())
    info = site / "vllm-0.33.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.0\nRequires-Dist: torch==2.14.0\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "direct_url.json").write_text(json.dumps({"url": "file:///src/vllm", "dir_info": {"editable": True}}))
    (info / "RECORD").write_text("")


@pytest.fixture(scope="module")
def fake_site(built_sm70, real_project, tmp_path_factory) -> Path:
    from fa2patch.compile import toolchain

    root = tmp_path_factory.mktemp("fake-env")
    site = fake_torch_site(root / "site", ["/opt/torch/include"], ["/opt/torch/lib"])
    cuda = toolchain.assemble_cuda_path(root / "cuda", locked_toolchain())
    fake_vllm(site, built_sm70 / "_vllm_fa2_C.abi3.so", cuda)
    out = json.loads(
        real_project.run("package", "--vllm-src", str(root / "tree"), "--out", str(root / "dist"), "--json").stdout
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site), out["wheel"]],
        check=True,
        capture_output=True,
    )
    return site


def fake_python(tmp_path: Path, site: Path) -> Path:
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def fake_nvcc(tmp_path: Path, release: str, archs: str) -> dict:
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text(
        f"#!/bin/sh\ncase \"$1\" in --version) echo 'Cuda compilation tools, release {release}, V{release}.85';;"
        f" --list-gpu-arch) echo {archs};; esac\n"
    )
    nvcc.chmod(0o755)
    return {"FA2PATCH_NVCC": str(nvcc)}


def test_a_complete_fake_environment_is_ready(real_project, fake_site, tmp_path):
    require_toolchain()
    result = doctor(
        real_project,
        fake_python(tmp_path, fake_site),
        fake_nvcc(tmp_path, "12.6", "compute_70 compute_75 compute_80 compute_90"),
        rc=0,
    )
    assert result["verdict"] == "ready" and result["ok"] is True
    c = checks(result)
    assert [n for n, v in c.items() if v["ok"] is False] == []
    assert result["facts"]["vllm"]["installed"] == "built from source at /src/vllm"
    assert result["facts"]["vllm"]["kernels"]["sm"] == ["sm_70"]
    assert result["facts"]["fa2_extension"]["fa2patch"] is True and result["facts"]["fa2_extension"]["sm"] == ["sm_70"]
    assert result["facts"]["plugin"] == {
        "version": "0.1.0",
        "bundles_extension": False,
        "torch": None,
        "registered": True,
    }
    assert "fa2patch-vllm: FlashAttention-2 on compute capability 7.0 through" in result["ready"]


def test_without_the_plugin_the_next_command_installs_it(real_project, fake_site, tmp_path):
    require_toolchain()
    import shutil

    site = tmp_path / "site"
    shutil.copytree(
        fake_site, site, symlinks=True, ignore=lambda d, names: [n for n in names if n.startswith("fa2patch_vllm")]
    )
    python = fake_python(tmp_path, site)
    result = doctor(real_project, python, fake_nvcc(tmp_path, "12.6", "compute_70"))
    assert result["verdict"] == "next" and checks(result)["fa2patch plugin"]["ok"] is None
    assert result["next"] == (
        f"{python} -m pip install --no-deps {real_project.root}/dist/fa2patch_vllm-0.1.0-py3-none-any.whl"
    )


@pytest.mark.parametrize(
    "release, archs, expected",
    [
        ("13.0", "compute_75 compute_90", "cannot target sm_70"),
        ("12.8", "compute_70 compute_90", "vLLM 0.33 drops 7.0 from its arch list from nvcc 12.8 on"),
    ],
)
def test_a_source_build_needs_nvcc_below_12_8(real_project, tmp_path, release, archs, expected):
    """torch 2.14.0 with sm_70 (the stand-in), no vLLM yet: the next step depends on nvcc."""
    site = fake_torch_site(tmp_path / "site", [], [])
    python = fake_python(tmp_path, site)
    result = doctor(real_project, python, fake_nvcc(tmp_path, release, archs))
    assert result["verdict"] == "next" and expected in checks(result)["nvcc"]["detail"]
    assert result["next"].startswith("install the CUDA 12.6 toolkit (nvcc below 12.8;")
    good = doctor(real_project, python, fake_nvcc(tmp_path / "ok", "12.6", "compute_70"))
    assert good["next"] == (
        "fa2patch package --arch sm_70 --vllm-src ~/fa2-src --force && cd /path/to/vllm && "
        f"{python} tools/use_existing_torch.py && {python} -m pip install -r "
        "requirements/build/cuda.txt && TORCH_CUDA_ARCH_LIST=7.0 VLLM_FLASH_ATTN_SRC_DIR=~/fa2-src "
        f"{python} -m pip install --no-build-isolation -e ."
    )
