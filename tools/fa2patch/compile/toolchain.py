# SPDX-License-Identifier: BSD-3-Clause
"""The compilers and tools a build needs, how to find them, and how to install what is missing.

Two routes build the same build description (docs/DESIGN.md §5):
- nvcc from a CUDA toolkit ($CUDA_HOME or PATH): the expected compiler where one is installed;
  CUDA 12.x for sm_70 (CUDA 13 cannot target Volta), any recent one for the sm_90 lab build.
- clang (the major version baseline.lock pins) with a CUDA folder assembled from the pinned
  wheels (headers, ptxas, libdevice) plus a fatbinary: needs no toolkit install.
"""

import functools
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from fa2patch.common.errors import EnvironmentProblem, mismatch
from fa2patch.common.lockfile import Toolchain, split_pin

PIP_BUILD = "python -m pip install -e '.[build]'"
CUDA_HEADER_WHEELS = ("cuda_runtime", "cuda_nvcc", "cuda_cccl", "cublas", "cusparse", "cusolver", "curand")
CLANG_ROUTE = "build (clang route)"


def pip_fatbinary(pins: Toolchain) -> str:
    return f"python -m pip install --no-deps {pins.fatbinary_wheel}"


def apt_clang(pins: Toolchain) -> str:
    return f"apt-get install -y clang-{pins.clang}"


@dataclass
class Item:
    name: str
    found: bool
    detail: str
    install: str = ""
    required_for: str = ""
    required: bool = True  # a missing required item makes doctor fail; an optional one warns


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def pinned_wheels(pins: Toolchain) -> list[tuple[str, str, str | None]]:
    """(name, pinned version, installed version or None) of each wheel of the clang route."""
    out = []
    for pin in (*pins.wheels, pins.fatbinary_wheel):
        name, version = split_pin(pin)
        out.append((name, version, installed_version(name)))
    return out


def wheel_pin_problems(pins: Toolchain, fatbinary: Path | None) -> list[str]:
    """The clang route's pinned wheels that are missing or installed in another version (the
    fatbinary wheel only when ``fatbinary`` is not one from elsewhere, e.g. $FA2PATCH_FATBINARY)."""
    return [
        f"{name}=={want}: " + (f"{have} is installed" if have else "not installed")
        for name, want, have in pinned_wheels(pins)
        if have != want and (name != pins.fatbinary_pin[0] or not fatbinary_elsewhere(fatbinary))
    ]


def fatbinary_elsewhere(fatbinary: Path | None) -> bool:
    """True when the fatbinary found is not the pinned wheel's."""
    wheel = nvidia_wheel_dir("cu13")
    return fatbinary is not None and not (wheel is not None and wheel in fatbinary.parents)


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
    return Path(next(iter(spec.submodule_search_locations)))


TORCH_QUERY = Path(__file__).with_name("torch_query.py")


@functools.cache
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


def find_clang(major: str) -> Path | None:
    path = os.environ.get("FA2PATCH_CLANG") or shutil.which(f"clang++-{major}")
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
        p = Path(next(iter(spec.submodule_search_locations))) / "backends" / "nvidia" / "bin" / name
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


def assemble_cuda_path(dest: Path, pins: Toolchain) -> Path:
    """A CUDA folder for clang --cuda-path, made of symlinks into the pinned wheels."""
    fatbinary = find_fatbinary()
    problems = wheel_pin_problems(pins, fatbinary)
    if problems or fatbinary is None:
        raise EnvironmentProblem(
            "clang route: "
            + "; ".join(problems + (["no fatbinary"] if fatbinary is None else []))
            + f"\n  install: {PIP_BUILD}; {pip_fatbinary(pins)}"
        )
    nvcc_wheel, runtime_wheel = nvidia_wheel_dir("cuda_nvcc"), nvidia_wheel_dir("cuda_runtime")
    if nvcc_wheel is None or runtime_wheel is None:
        raise EnvironmentProblem(
            "clang route: the folder of the nvidia-cuda-nvcc-cu12 or nvidia-cuda-runtime-cu12 wheel is not found"
            f"\n  install: {PIP_BUILD}"
        )
    if dest.exists():
        shutil.rmtree(dest)
    for sub in ("bin", "include", "lib64", "nvvm/libdevice"):
        (dest / sub).mkdir(parents=True)
    for wheel in CUDA_HEADER_WHEELS:
        wdir = nvidia_wheel_dir(wheel)
        if wdir is None or not (wdir / "include").is_dir():
            continue
        _link_tree(wdir / "include", dest / "include")
    (dest / "bin" / "ptxas").symlink_to(nvcc_wheel / "bin" / "ptxas")
    (dest / "bin" / "fatbinary").symlink_to(fatbinary)
    (dest / "nvvm" / "libdevice" / "libdevice.10.bc").symlink_to(nvcc_wheel / "nvvm" / "libdevice" / "libdevice.10.bc")
    (dest / "lib64" / "libcudart.so").symlink_to(runtime_wheel / "lib" / "libcudart.so.12")
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


def doctor(pins: Toolchain) -> list[Item]:
    """Everything the build and verify steps use, against the lock's pins: found or not, and how
    to install it. The clang route's items are required unless an nvcc that can target sm_70
    is installed; nvcc (the other route) and ccache are optional."""
    items = []
    torch = torch_info()
    have_torch = torch.get("version", "").split("+")[0] if torch else None
    items.append(
        Item(
            "torch",
            have_torch == pins.torch,
            f"{torch.get('version')} (CUDA {torch.get('cuda')}), pinned {pins.torch}"
            if torch
            else f"not importable by {sys.executable}, pinned {pins.torch}",
            PIP_BUILD,
            "build, verify",
        )
    )
    ninja = find_ninja()
    items.append(Item("ninja", ninja is not None, str(ninja or "not found"), PIP_BUILD, "build"))
    nvcc = find_nvcc()
    nvcc_sm70 = nvcc is not None and "sm_70" in nvcc_archs(nvcc)
    clang_required = not nvcc_sm70
    clang = find_clang(pins.clang)
    cv = clang_version(clang) if clang else ""
    items.append(
        Item(
            f"clang++-{pins.clang}",
            bool(clang) and cv.startswith(f"{pins.clang}."),
            f"{clang} ({cv}), pinned {pins.clang}.x" if clang else "not found",
            apt_clang(pins),
            CLANG_ROUTE,
            clang_required,
        )
    )
    fb = find_fatbinary()
    for name, want, have in pinned_wheels(pins):
        detail = f"{have} installed, pinned {want}" if have else f"not installed, pinned {want}"
        fatbinary_wheel = name == pins.fatbinary_pin[0]
        items.append(
            Item(
                name,
                have == want,
                detail,
                pip_fatbinary(pins) if fatbinary_wheel else PIP_BUILD,
                CLANG_ROUTE,
                clang_required and not (fatbinary_wheel and fatbinary_elsewhere(fb)),
            )
        )
    items.append(
        Item("fatbinary", fb is not None, str(fb or "not found"), pip_fatbinary(pins), CLANG_ROUTE, clang_required)
    )
    items.append(
        Item(
            "nvcc",
            nvcc is not None,
            f"{nvcc} (CUDA {nvcc_version(nvcc)}{'' if nvcc_sm70 else ', cannot target sm_70'})"
            if nvcc
            else "not found (a CUDA 12.x toolkit for sm_70, any for the sm_90 lab build)",
            "install a CUDA toolkit and set CUDA_HOME",
            "build (nvcc route)",
            required=False,
        )
    )
    for tool in ("cuobjdump", "nvdisasm"):
        p = find_cuda12_binutil(tool)
        items.append(Item(tool, p is not None, str(p or "not found"), PIP_BUILD, "verify"))
    cc = find_ccache()
    items.append(
        Item(
            "ccache",
            cc is not None,
            str(cc or "not found (warm rebuilds)"),
            "apt-get install -y ccache",
            "build (warm rebuilds)",
            required=False,
        )
    )
    items.append(
        Item(
            "git",
            shutil.which("git") is not None,
            shutil.which("git") or "not found",
            "apt-get install -y git",
            "replay, export",
        )
    )
    return items


@dataclass
class Compiler:
    kind: str  # "nvcc" or "clang"
    path: Path
    version: str
    cuda_path: Path | None = None  # clang: the assembled CUDA folder
    host_cxx: Path | None = None  # nvcc: the compiler for .cpp files


def choose_compiler(choice: str, arch: str, build_dir: Path, pins: Toolchain) -> Compiler:
    """Pick and check the compiler for ``arch``; raise with install commands if none fits."""
    problems = []
    if choice in ("auto", "nvcc"):
        nvcc = find_nvcc()
        if nvcc is None:
            problems.append("nvcc: not found ($CUDA_HOME/bin/nvcc or PATH)")
        else:
            version = nvcc_version(nvcc)
            if arch not in nvcc_archs(nvcc):
                problems.append(
                    f"{nvcc}: CUDA {version} cannot target {arch}"
                    + (" (CUDA 12.x is the last release for Volta)" if arch == "sm_70" else "")
                )
            else:
                host = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
                return Compiler("nvcc", nvcc, version, host_cxx=Path(host) if host else None)
    if choice in ("auto", "clang"):
        clang = find_clang(pins.clang)
        if clang is None:
            problems.append(f"clang++-{pins.clang}: not found\n    install: {apt_clang(pins)}")
        else:
            version = clang_version(clang)
            if not version.startswith(f"{pins.clang}."):
                problems.append(
                    mismatch("clang version", str(clang), f"{pins.clang}.x (baseline.lock [toolchain] clang)", version)
                )
            else:
                try:
                    cuda = assemble_cuda_path(build_dir / f"cuda-{pins.cuda}", pins)
                except EnvironmentProblem as exc:
                    problems.append(str(exc))
                else:
                    return Compiler("clang", clang, version, cuda_path=cuda)
    raise EnvironmentProblem(f"no compiler can build {arch} (--cuda-compiler {choice}):\n  " + "\n  ".join(problems))


# --- running cuobjdump and c++filt (sass.py parses what they print) ------------------------------

NO_DEVICE_CODE = "does not contain device code"


def cuobjdump(tool: Path, args: list[str], binary: Path) -> str:
    """Run cuobjdump; a binary without device code gives an empty listing."""
    try:
        proc = subprocess.run([str(tool), *args, str(binary)], capture_output=True, text=True)
    except OSError as exc:
        raise EnvironmentProblem(f"{tool}: cannot run cuobjdump: {exc}") from exc
    if proc.returncode != 0:
        if NO_DEVICE_CODE in proc.stdout + proc.stderr:
            return ""
        raise EnvironmentProblem(f"{tool} {' '.join(args)} {binary}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def demangle(names: list[str]) -> dict[str, str]:
    try:
        out = subprocess.run(
            ["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return {n: n for n in names}
    return dict(zip(names, out, strict=True)) if len(out) == len(names) else {n: n for n in names}
