"""The compilers and tools a build needs, how to find them, and how to install what is missing.

Two routes build the same build description (DESIGN.md §5):
- nvcc from a CUDA toolkit ($CUDA_HOME or PATH): the expected compiler where one is installed;
  CUDA 12.x for sm_70 (CUDA 13 cannot target Volta), any recent one for the sm_90 lab build.
- clang-22 with a CUDA 12.8 folder assembled from the pinned wheels (headers, ptxas,
  libdevice) plus a fatbinary: needs no toolkit install.
"""

import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import EnvironmentProblem

PIP_BUILD = "python -m pip install -e '.[build]'"
PIP_FATBINARY = "python -m pip install --no-deps nvidia-cuda-nvcc==13.0.88"
CLANG_MAJOR = 22
APT_CLANG = f"apt-get install -y clang-{CLANG_MAJOR}"
CUDA_HEADER_WHEELS = ("cuda_runtime", "cuda_nvcc", "cuda_cccl", "cublas", "cusparse", "cusolver", "curand")


@dataclass
class Item:
    name: str
    found: bool
    detail: str
    install: str = ""
    required_for: str = ""


def _run(cmd: list[str]) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout + proc.stderr


def nvidia_wheel_dir(name: str) -> Path | None:
    """Folder of an installed nvidia-* wheel package (nvidia/<name>), or None."""
    try:
        spec = importlib.util.find_spec(f"nvidia.{name}")
    except ModuleNotFoundError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


TORCH_QUERY = Path(__file__).with_name("torch_query.py")


@functools.lru_cache(maxsize=None)
def torch_info(python: str = sys.executable) -> dict:
    """torch's version, CUDA version, GPU architectures, C++ ABI flag, include and library paths,
    as seen by ``python`` (a subprocess, so that another environment's torch can be read)."""
    try:
        proc = subprocess.run([python, str(TORCH_QUERY)], capture_output=True, text=True)
    except OSError:
        return {}
    if proc.returncode != 0:
        return {}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def torch_runs_arch(torch: dict, arch: str) -> bool:
    """Whether torch's own kernels run on ``arch`` (sm_XY): built for it, or PTX at or below it."""
    want = int(arch.removeprefix("sm_"))
    for a in torch.get("arch_list", []):
        kind, _, num = a.partition("_")
        if num.isdigit() and ((kind == "sm" and int(num) == want) or (kind == "compute" and int(num) <= want)):
            return True
    return False


def find_clang() -> Path | None:
    path = os.environ.get("FA2PATCH_CLANG") or shutil.which(f"clang++-{CLANG_MAJOR}")
    return Path(path) if path and Path(path).exists() else None


def clang_version(clang: Path) -> str:
    m = re.search(r"clang version (\d+\.\d+\.\d+)", _run([str(clang), "--version"]))
    return m.group(1) if m else ""


def find_nvcc() -> Path | None:
    if os.environ.get("FA2PATCH_NVCC"):
        p = Path(os.environ["FA2PATCH_NVCC"])
        return p if p.exists() else None
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").exists():
        return Path(home) / "bin" / "nvcc"
    found = shutil.which("nvcc")
    return Path(found) if found else None


def nvcc_version(nvcc: Path) -> str:
    m = re.search(r"release (\d+\.\d+)", _run([str(nvcc), "--version"]))
    return m.group(1) if m else ""


def nvcc_archs(nvcc: Path) -> set[str]:
    return {a.replace("compute_", "sm_") for a in _run([str(nvcc), "--list-gpu-arch"]).split()}


def find_fatbinary() -> Path | None:
    candidates = [os.environ.get("FA2PATCH_FATBINARY")]
    cu13 = nvidia_wheel_dir("cu13")
    if cu13:
        candidates.append(str(cu13 / "bin" / "fatbinary"))
    candidates.append(shutil.which("fatbinary"))
    nvcc = find_nvcc()
    if nvcc:
        candidates.append(str(nvcc.parent / "fatbinary"))
    for c in candidates:
        if c and Path(c).exists():
            return Path(c)
    return None


def find_cuda12_binutil(name: str) -> Path | None:
    """cuobjdump/nvdisasm of CUDA 12.x (they still read sm_70): triton's copy, else a toolkit's."""
    if os.environ.get(f"FA2PATCH_{name.upper()}"):
        return Path(os.environ[f"FA2PATCH_{name.upper()}"])
    spec = importlib.util.find_spec("triton")
    if spec and spec.submodule_search_locations:
        p = Path(list(spec.submodule_search_locations)[0]) / "backends" / "nvidia" / "bin" / name
        if p.exists():
            return p
    nvcc = find_nvcc()
    if nvcc and (nvcc.parent / name).exists():
        return nvcc.parent / name
    found = shutil.which(name)
    return Path(found) if found else None


def find_ccache() -> Path | None:
    if os.environ.get("FA2PATCH_NO_CCACHE"):
        return None
    found = shutil.which("ccache")
    return Path(found) if found else None


def find_ninja() -> Path | None:
    found = shutil.which("ninja")
    if found:
        return Path(found)
    try:
        import ninja  # the pip package ships the binary

        p = Path(ninja.BIN_DIR) / "ninja"
        return p if p.exists() else None
    except ImportError:
        return None


def assemble_cuda_path(dest: Path) -> Path:
    """A CUDA 12.8 folder for clang --cuda-path, made of symlinks into the pinned wheels."""
    missing = [w for w in CUDA_HEADER_WHEELS[:3] if nvidia_wheel_dir(w) is None]
    fatbinary = find_fatbinary()
    if missing or fatbinary is None:
        raise EnvironmentProblem(
            "clang route: missing " + ", ".join([f"nvidia-{w.replace('_', '-')}-cu12" for w in missing]
                                                + (["fatbinary"] if fatbinary is None else []))
            + f"\n  install: {PIP_BUILD}" + ("" if fatbinary else f"; {PIP_FATBINARY}"))
    if dest.exists():
        shutil.rmtree(dest)
    for sub in ("bin", "include", "lib64", "nvvm/libdevice"):
        (dest / sub).mkdir(parents=True)
    for wheel in CUDA_HEADER_WHEELS:
        wdir = nvidia_wheel_dir(wheel)
        if wdir is None or not (wdir / "include").is_dir():
            continue
        _link_tree(wdir / "include", dest / "include")
    nvcc_wheel = nvidia_wheel_dir("cuda_nvcc")
    (dest / "bin" / "ptxas").symlink_to(nvcc_wheel / "bin" / "ptxas")
    (dest / "bin" / "fatbinary").symlink_to(fatbinary)
    (dest / "nvvm" / "libdevice" / "libdevice.10.bc").symlink_to(
        nvcc_wheel / "nvvm" / "libdevice" / "libdevice.10.bc")
    (dest / "lib64" / "libcudart.so").symlink_to(
        nvidia_wheel_dir("cuda_runtime") / "lib" / "libcudart.so.12")
    return dest


def _link_tree(src: Path, dst: Path) -> None:
    for entry in src.iterdir():
        if entry.name in ("__init__.py", "__pycache__"):
            continue
        target = dst / entry.name
        if entry.is_dir() and target.is_dir():
            _link_tree(entry, target)
        elif entry.is_dir():
            target.mkdir()
            _link_tree(entry, target)
        elif not target.exists():
            target.symlink_to(entry)


def ptxas_version(ptxas: Path) -> str:
    m = re.search(r"release (\d+\.\d+), V([\d.]+)", _run([str(ptxas), "--version"]))
    return m.group(2) if m else ""


def doctor(lock_toolchain: dict) -> list[Item]:
    """Everything the build and verify steps use: found or not, and how to install it."""
    items = []
    torch = torch_info()
    want_torch = lock_toolchain.get("torch", "")
    items.append(Item("torch", bool(torch) and torch.get("version", "").split("+")[0] == want_torch,
                      f"{torch.get('version')} (CUDA {torch.get('cuda')}), want {want_torch}"
                      if torch else f"not importable by {sys.executable}, want {want_torch}",
                      PIP_BUILD, "build, verify"))
    ninja = find_ninja()
    items.append(Item("ninja", ninja is not None, str(ninja or "not found"), PIP_BUILD, "build"))
    clang = find_clang()
    cv = clang_version(clang) if clang else ""
    items.append(Item(f"clang++-{CLANG_MAJOR}", bool(clang) and cv.startswith(f"{CLANG_MAJOR}."),
                      f"{clang} ({cv})" if clang else "not found", APT_CLANG, "build (clang route)"))
    for wheel, what in (("cuda_nvcc", "ptxas, libdevice, crt headers"),
                        ("cuda_runtime", "CUDA runtime headers, libcudart"),
                        ("cuda_cccl", "CUDA C++ core libraries")):
        wdir = nvidia_wheel_dir(wheel)
        detail = f"{wdir} ({what})" if wdir else f"not installed ({what})"
        if wheel == "cuda_nvcc" and wdir:
            detail += f", ptxas {ptxas_version(wdir / 'bin' / 'ptxas')}"
        items.append(Item(f"nvidia-{wheel.replace('_', '-')}-cu12", wdir is not None, detail,
                          PIP_BUILD, "build (clang route)"))
    fb = find_fatbinary()
    items.append(Item("fatbinary", fb is not None, str(fb or "not found"), PIP_FATBINARY,
                      "build (clang route)"))
    nvcc = find_nvcc()
    items.append(Item("nvcc", nvcc is not None,
                      f"{nvcc} (CUDA {nvcc_version(nvcc)})" if nvcc else "not found (optional: "
                      "a CUDA 12.x toolkit for sm_70, any for the sm_90 lab build)",
                      "install a CUDA toolkit and set CUDA_HOME", "build (nvcc route, optional)"))
    for tool in ("cuobjdump", "nvdisasm"):
        p = find_cuda12_binutil(tool)
        items.append(Item(tool, p is not None, str(p or "not found"), PIP_BUILD, "verify"))
    cc = find_ccache()
    items.append(Item("ccache", cc is not None, str(cc or "not found (optional: warm rebuilds)"),
                      "apt-get install -y ccache", "build (optional)"))
    items.append(Item("git", shutil.which("git") is not None, shutil.which("git") or "not found",
                      "apt-get install -y git", "replay, export"))
    return items


@dataclass
class Compiler:
    kind: str  # "nvcc" or "clang"
    path: Path
    version: str
    cuda_path: Path | None = None  # clang: the assembled CUDA folder
    host_cxx: Path | None = None  # nvcc: the compiler for .cpp files


def choose_compiler(choice: str, arch: str, build_dir: Path) -> Compiler:
    """Pick and check the compiler for ``arch``; raise with install commands if none fits."""
    problems = []
    if choice in ("auto", "nvcc"):
        nvcc = find_nvcc()
        if nvcc is None:
            problems.append("nvcc: not found ($CUDA_HOME/bin/nvcc or PATH)")
        else:
            version = nvcc_version(nvcc)
            if arch not in nvcc_archs(nvcc):
                problems.append(f"{nvcc}: CUDA {version} cannot target {arch}"
                                + (" (CUDA 12.x is the last release for Volta)" if arch == "sm_70" else ""))
            else:
                host = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
                return Compiler("nvcc", nvcc, version, host_cxx=Path(host) if host else None)
    if choice in ("auto", "clang"):
        clang = find_clang()
        if clang is None:
            problems.append(f"clang++-{CLANG_MAJOR}: not found\n    install: {APT_CLANG}")
        else:
            version = clang_version(clang)
            if not version.startswith(f"{CLANG_MAJOR}."):
                problems.append(f"{clang}: clang {version}, expected {CLANG_MAJOR}.x")
            else:
                try:
                    cuda = assemble_cuda_path(build_dir / "cuda-12.8")
                except EnvironmentProblem as exc:
                    problems.append(str(exc))
                else:
                    return Compiler("clang", clang, version, cuda_path=cuda)
    raise EnvironmentProblem(f"no compiler can build {arch} (--cuda-compiler {choice}):\n  "
                             + "\n  ".join(problems))
