# SPDX-License-Identifier: BSD-3-Clause
"""vLLM's own CMake around fa2patch's --vllm-src tree: what a vLLM source build does with
``VLLM_FLASH_ATTN_SRC_DIR`` (the GPU lab with nvcc, CI with clang; README "V100 with vLLM 0.33").

- ``nvcc``: a top-level CMakeLists.txt cut from vLLM's real one (``driver_cmakelists``: the
  project, its C++/CUDA standards, Python and torch discovery, the CUDA arch list taken from
  TORCH_CUDA_ARCH_LIST and its supported-arch filter, the include flags), unchanged, then vLLM's
  real ``cmake/external_projects/vllm_flash_attn.cmake``. vLLM's own kernels and its other
  external projects are left out: they need the network (FetchContent of git repositories) and
  hours of compiling, and nothing of them reaches the FA2 target.
- ``clang``: a stand-in top level (vLLM's needs nvcc through torch's CMake package) that includes
  the same vllm_flash_attn.cmake; the tree then takes its clang route.

Both are configured, built and installed as vLLM's setup.py does it (its cmake_build_ext):
configure with -DCMAKE_BUILD_TYPE (RelWithDebInfo by default), -DVLLM_TARGET_DEVICE=cuda,
-DVLLM_PYTHON_EXECUTABLE, -DFETCHCONTENT_BASE_DIR, the nvcc of CUDA_HOME, ccache as launcher;
`cmake --build` of the FA targets; `cmake --install --component` of each into the folder above
``vllm/``. ``commands`` lists the compile and link commands without running them (ninja -t
commands): the dry run that checks the nvcc flags on a machine without a GPU.

    python -m fa2patch.vllm.cmake {build,commands} --vllm SRC --tree TREE --work DIR [...]
"""

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from fa2patch.common.errors import CheckFailed, EnvironmentProblem
from fa2patch.compile import extension

FA_CMAKE = "cmake/external_projects/vllm_flash_attn.cmake"
# What vLLM's files must contain (read by the driver; ci/gpu-vllm.sh prepare carries them).
VLLM_FILES = ("CMakeLists.txt", "cmake/utils.cmake", FA_CMAKE)
# Components setup.py builds and installs for vLLM's FA (vllm.vllm_flash_attn.*).
COMPONENTS = ("_vllm_fa2_C", "_vllm_fa3_C", "_vllm_fa4_cutedsl_C")
MIN_CMAKE = (3, 26)  # vLLM 0.33's cmake_minimum_required

# Pieces of vLLM's top-level CMakeLists.txt, each found by its first line(s) (exactly once):
# [start, SPINLOOP) and [GPU_LANG, FETCHCONTENT) are kept, then the two FetchContent lines and the
# include of vllm_flash_attn.cmake, which vLLM does last.
SPINLOOP = "#\n# spinloop extension"
GPU_LANG = "#\n# Set up GPU language"
FETCHCONTENT = "#\n# Use FetchContent for C++ dependencies"
FETCH_LINES = "include(FetchContent)\nfile(MAKE_DIRECTORY ${FETCHCONTENT_BASE_DIR})"
FA_INCLUDE = f"include({FA_CMAKE})"

CLANG_TOP = """cmake_minimum_required(VERSION 3.22)
# Stands in for vLLM's top-level CMakeLists.txt on the clang route (vLLM's needs nvcc through
# torch's CMake package): vLLM's standards, then vLLM's real vllm_flash_attn.cmake, included last
# as vLLM includes it.
project(vllm_extensions LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 20)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
include(FetchContent)
set(VLLM_GPU_LANG "CUDA_VIA_CLANG")  # not "CUDA": the CUDA arch block needs nvcc's CMake
include(cmake/external_projects/vllm_flash_attn.cmake)
"""


def _once(text: str, marker: str, where: Path) -> int:
    count = text.count(marker)
    if count != 1:
        raise CheckFailed(
            f"{where}: expected the line(s) {marker!r} once, found {count}: vLLM's "
            "CMakeLists.txt changed; update fa2patch.vllm.cmake"
        )
    return text.index(marker)


def driver_cmakelists(vllm: Path) -> str:
    """The FA2 part of vLLM's top-level CMakeLists.txt, cut from the real file (see the module doc)."""
    path = vllm / "CMakeLists.txt"
    if not path.is_file():
        raise EnvironmentProblem(f"{path}: not found (vLLM's source tree: {', '.join(VLLM_FILES)})")
    text = path.read_text()
    spinloop, gpu, fetch = (_once(text, m, path) for m in (SPINLOOP, GPU_LANG, FETCHCONTENT))
    _once(text, FETCH_LINES, path)
    _once(text, FA_INCLUDE, path)
    if not spinloop < gpu < fetch:
        raise CheckFailed(f"{path}: its sections are not in the order fa2patch.vllm.cmake expects")
    return (
        f"# Cut by fa2patch.vllm.cmake from {path}: everything before {SPINLOOP.splitlines()[1]!r}, the\n"
        f"# section from {GPU_LANG.splitlines()[1]!r} to {FETCHCONTENT.splitlines()[1]!r}, then\n"
        "# FetchContent and vLLM's vllm_flash_attn.cmake (its last include). Unchanged text.\n"
        + text[:spinloop]
        + text[gpu:fetch]
        + FETCH_LINES
        + "\n"
        + FA_INCLUDE
        + "\n"
    )


def find_cmake() -> Path:
    """$FA2PATCH_CMAKE, else the cmake beside this interpreter (pip's cmake), else PATH's; at least
    MIN_CMAKE (vLLM's minimum)."""
    candidates = [os.environ.get("FA2PATCH_CMAKE"), str(Path(sys.executable).parent / "cmake"), shutil.which("cmake")]
    found = []
    for c in candidates:
        if not c or not Path(c).exists():
            continue
        out = subprocess.run([c, "--version"], capture_output=True, text=True).stdout
        m = re.search(r"cmake version (\d+)\.(\d+)", out)
        if m and (int(m.group(1)), int(m.group(2))) >= MIN_CMAKE:
            return Path(c)
        found.append(f"{c} ({m.group(0) if m else 'no version'})")
    raise EnvironmentProblem(
        f"cmake >= {'.'.join(map(str, MIN_CMAKE))} (vLLM 0.33's minimum) not found"
        f"{': ' + ', '.join(found) if found else ''}\n  install: python -m pip install "
        "'cmake>=3.26' (or set FA2PATCH_CMAKE)"
    )


@dataclass
class Run:
    """One vLLM-style build of the tree: where everything is and how it is compiled."""

    vllm: Path  # vLLM's source tree (VLLM_FILES)
    tree: Path  # fa2patch's --vllm-src tree (VLLM_FLASH_ATTN_SRC_DIR)
    work: Path  # the driver, the build folder and FetchContent's base folder
    prefix: Path  # where setup.py installs: the folder that holds vllm/
    compiler: str = "nvcc"  # "nvcc" (vLLM's top level) or "clang" (the stand-in)
    python: str = sys.executable
    arch_list: str = "7.0"  # TORCH_CUDA_ARCH_LIST (the nvcc route's CUDA_ARCHS come from it)
    build_type: str = "RelWithDebInfo"  # setup.py's default
    jobs: int = os.cpu_count() or 1
    clang: Path | None = None  # clang route: clang++ and the CUDA 12.x folder
    cuda_path: Path | None = None
    extra: list[str] = field(default_factory=list)  # more -D arguments

    @property
    def build_dir(self) -> Path:
        return self.work / "build"

    @property
    def installed(self) -> Path:
        return self.prefix / "vllm" / "vllm_flash_attn" / "_vllm_fa2_C.abi3.so"


def write_driver(run: Run) -> Path:
    """The top-level folder: CMakeLists.txt and vLLM's cmake/ folder beside it."""
    missing = [f for f in VLLM_FILES if not (run.vllm / f).is_file()]
    if missing:
        raise EnvironmentProblem(f"{run.vllm}: not vLLM's source tree (missing {', '.join(missing)})")
    top = run.work / "top"
    top.mkdir(parents=True, exist_ok=True)
    (top / "CMakeLists.txt").write_text(driver_cmakelists(run.vllm) if run.compiler == "nvcc" else CLANG_TOP)
    link = top / "cmake"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to((run.vllm / "cmake").resolve(), target_is_directory=True)
    return top


def configure_command(run: Run, top: Path) -> tuple[list[str], dict]:
    """setup.py's configure (cmake_build_ext.configure), for the FA part."""
    from fa2patch.compile import toolchain

    args = [
        str(find_cmake()),
        str(top),
        "-G",
        "Ninja",
        f"-DCMAKE_MAKE_PROGRAM={toolchain.find_ninja()}",
        "-DVLLM_TARGET_DEVICE=cuda",
        f"-DVLLM_PYTHON_EXECUTABLE={run.python}",
        f"-DFETCHCONTENT_BASE_DIR={run.work / '.deps'}",
        "-DCMAKE_JOB_POOL_COMPILE:STRING=compile",
        f"-DCMAKE_JOB_POOLS:STRING=compile={run.jobs}",
    ]
    if run.build_type:
        args.append(f"-DCMAKE_BUILD_TYPE={run.build_type}")
    ccache = toolchain.find_ccache()
    if ccache:
        args += [f"-DCMAKE_{lang}_COMPILER_LAUNCHER={ccache}" for lang in ("C", "CXX", "CUDA")]
    env = {**os.environ, "VLLM_FLASH_ATTN_SRC_DIR": str(run.tree), "TORCH_CUDA_ARCH_LIST": run.arch_list}
    if run.compiler == "nvcc":
        nvcc = toolchain.find_nvcc()
        if nvcc is None:
            raise EnvironmentProblem("nvcc: not found ($CUDA_HOME/bin/nvcc or PATH): vLLM's build needs it")
        args.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")  # setup.py: {CUDA_HOME}/bin/nvcc
        # torch's CMake package finds the toolkit with FindCUDA, which reads CUDA_PATH, not CUDA_HOME.
        env.setdefault("CUDA_PATH", str(nvcc.parent.parent))
    else:
        if run.clang is None or run.cuda_path is None:
            raise EnvironmentProblem("the clang route needs clang++ and a CUDA 12.x folder")
        args += [f"-DCMAKE_CXX_COMPILER={run.clang}", f"-DFA2PATCH_CUDA_PATH={run.cuda_path}"]
    return args + run.extra, env


def _run(cmd: list[str], cwd: Path, env: dict, log) -> None:
    log(f"[vllm-cmake] {shlex.join(cmd)}")
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log(proc.stdout.rstrip())
    if proc.returncode != 0:
        raise CheckFailed(f"{shlex.join(cmd[:3])}...: exit code {proc.returncode} (its output is above)")


def configure(run: Run, log=print) -> None:
    top = write_driver(run)
    run.build_dir.mkdir(parents=True, exist_ok=True)
    cmd, env = configure_command(run, top)
    _run(cmd, run.build_dir, env, log)


def commands(run: Run) -> list[list[str]]:
    """The compile and link commands of _vllm_fa2_C (after ``configure``), none run."""
    from fa2patch.compile import toolchain

    out = subprocess.run(
        [str(toolchain.find_ninja()), "-C", str(run.build_dir), "-t", "commands", "_vllm_fa2_C"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [shlex.split(line) for line in out.splitlines() if line.strip()]


def compile_commands(cmds: list[list[str]], compiler: str) -> dict[str, list[str]]:
    """{source path: command} of the commands that compile one source with ``compiler``."""
    found = {}
    for cmd in cmds:
        tool = next((Path(w).name for w in cmd if not Path(w).name.startswith("ccache")), "")
        if tool != compiler or "-c" not in cmd:
            continue
        source = cmd[cmd.index("-c") + 1]
        found[source] = cmd
    return found


def build_and_install(run: Run, log=print) -> Path:
    """setup.py's build_extensions for the FA targets: one build, then one install per component."""
    env = {**os.environ, "VLLM_FLASH_ATTN_SRC_DIR": str(run.tree)}
    cmake = str(find_cmake())
    _run([cmake, "--build", ".", f"-j={run.jobs}", *(f"--target={c}" for c in COMPONENTS)], run.build_dir, env, log)
    run.prefix.mkdir(parents=True, exist_ok=True)
    for component in COMPONENTS:
        _run([cmake, "--install", ".", "--prefix", str(run.prefix), "--component", component], run.build_dir, env, log)
    if not run.installed.is_file():
        raise CheckFailed(f"{run.installed}: vLLM's install did not put the extension there")
    return run.installed


def check_nvcc_commands(cmds: list[list[str]], tree: Path, arch: str) -> list[str]:
    """What must hold of nvcc's commands for the tree's CUDA sources (empty: all of it): each source
    compiled once, for ``arch`` only (torch's and vLLM's arch flags cleared), as C++20, with
    fa2patch's flags and the tree's defines."""
    from fa2patch.compile import builder as build
    from fa2patch.compile.description import BuildDescription

    desc = BuildDescription.load(tree)
    nvcc = compile_commands(cmds, "nvcc")
    problems = []
    for src in desc.arch(arch).cuda_sources:
        got = [c for s, c in nvcc.items() if s.endswith("/" + src)]
        if len(got) != 1:
            problems.append(f"{src}: {len(got)} nvcc command(s), expected 1")
            continue
        cmd = got[0]
        sm = arch.removeprefix("sm_")
        archs = [w for w in cmd if w.startswith(("-gencode", "--generate-code", "-arch", "--gpu-architecture"))]
        want = [
            f"-std={build.CXX_STANDARD}",
            *build.nvcc_cuda_flags(arch),
            *(f"-D{d}" for d in build.defines(desc, arch)),
        ]
        missing = [w for w in want if w not in cmd]
        if missing:
            problems.append(f"{src}: missing {missing}")
        if archs != [f"-gencode=arch=compute_{sm},code=sm_{sm}"]:
            problems.append(f"{src}: architecture flags {archs}, expected only {arch}")
        if not any(w.startswith("-D_GLIBCXX_USE_CXX11_ABI=") for w in cmd):
            problems.append(f"{src}: no -D_GLIBCXX_USE_CXX11_ABI (torch's C++ ABI)")
    return problems


def lab_manifest(run: Run, arch: str, cmds: list[list[str]], seconds: float) -> dict:
    """A build/<arch>/manifest.json for the extension vLLM's CMake built and installed, so that
    `fa2patch verify/smoke` and tests/gpu run against it (no ptxas log: spills from stack frames)."""
    from fa2patch.compile import builder as build, toolchain

    manifest = build.artifact_manifest(run.installed, run.tree, arch)
    torch = toolchain.torch_info(run.python)
    nvcc = toolchain.find_nvcc() if run.compiler == "nvcc" else run.clang
    if nvcc is None:
        raise EnvironmentProblem(f"vLLM's build ran, but its {run.compiler} is not found now")
    tree_record = json.loads((run.tree / "fa2patch-vllm-src.json").read_text())
    manifest.update(
        {
            "built_by": f"vLLM's {FA_CMAKE} ({run.vllm.name}), {run.compiler}, CMAKE_BUILD_TYPE={run.build_type}",
            "installed": str(run.installed),
            "compiler": {
                "kind": run.compiler,
                "path": str(nvcc),
                "version": toolchain.nvcc_version(nvcc) if run.compiler == "nvcc" else toolchain.clang_version(nvcc),
            },
            "cxx_standard": tree_record.get("cxx_standard"),
            "commands": {"compile": [shlex.join(c) for c in cmds]},
            "torch": {k: torch.get(k) for k in ("version", "cuda", "cxx11_abi", "arch_list", "python_version")}
            | {"python": run.python},
            "check_only": None,
            "source_tree_digest": tree_record["source_tree_digest"],
            "source_matches_lock": tree_record["source_matches_lock"],
            "wall_seconds": round(seconds, 1),
        }
    )
    manifest["artifact"] = {"file": run.installed.name, "sha256": manifest["artifact"]["sha256"]}
    return manifest


def extract_vllm(archive: Path, dest: Path) -> Path:
    """vLLM's source files from ci/gpu-vllm.sh prepare's archive (vllm-<version>/...)."""
    import tarfile

    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    found = [d for d in dest.glob("vllm-*") if (d / "CMakeLists.txt").is_file()]
    if len(found) != 1:
        raise EnvironmentProblem(f"{archive}: no vLLM CMakeLists.txt in it (run `bash ci/gpu-vllm.sh prepare` again)")
    return found[0]


def lab(args, log) -> dict:
    """On the GPU lab: the workspace's --vllm-src tree built by vLLM's CMake (nvcc) as vLLM installs
    it; build/<arch>/ then holds that extension and its manifest, for verify, smoke and tests/gpu."""
    from fa2patch.common.lockfile import Lock
    from fa2patch.common.project import Project
    from fa2patch.vllm.package import vllm_source_tree

    project = Project.find()
    work = args.work.resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    tree = vllm_source_tree(
        project, args.workspace.resolve(), work / "fa2-src", args.arch, Lock.load(project.lock_path)
    )
    vllm = extract_vllm(args.vllm_archive, work / "vllm-src")
    return {"tree": tree["vllm_src"], "vllm": str(vllm)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fa2patch.vllm.cmake", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "action",
        choices=["commands", "build", "lab"],
        help="commands: configure and list the commands (a dry run); build: configure, build, "
        "install; lab: make the tree from --workspace, take vLLM from --vllm-archive, build",
    )
    ap.add_argument("--vllm", type=Path, help="vLLM's source tree (CMakeLists.txt, cmake/)")
    ap.add_argument("--tree", type=Path, help="fa2patch package --vllm-src's tree")
    ap.add_argument("--work", type=Path, required=True, help="folder for the driver and the build")
    ap.add_argument("--prefix", type=Path, help="install prefix (the folder above vllm/) [default: WORK/install]")
    ap.add_argument("--compiler", choices=["nvcc", "clang"], default="nvcc")
    ap.add_argument("--arch", default="sm_90", help="the tree's architecture (checked in nvcc's commands)")
    ap.add_argument("--arch-list", default=None, help="TORCH_CUDA_ARCH_LIST [default: from --arch]")
    ap.add_argument("--python", default=sys.executable, help="VLLM_PYTHON_EXECUTABLE")
    ap.add_argument("--build-type", default="RelWithDebInfo")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--cmake-arg", action="append", default=[], help="one more configure argument (-D...)")
    ap.add_argument(
        "--lab-build-dir",
        type=Path,
        default=None,
        help="after building: copy the installed extension and a manifest here (build/<arch>)",
    )
    ap.add_argument("--workspace", type=Path, help="lab: the replayed workspace")
    ap.add_argument("--vllm-archive", type=Path, help="lab: .lab/vllm-src.tar.gz (ci/gpu-vllm.sh prepare)")
    ap.add_argument("--dry-run", action="store_true", help="lab: stop after the commands' check")
    ap.add_argument("--summary", type=Path, help="also write the JSON result here")
    args = ap.parse_args(argv)
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    start = time.monotonic()
    result = {}
    if args.action == "lab":
        if not (args.workspace and args.vllm_archive):
            ap.error("lab needs --workspace and --vllm-archive")
        result.update(lab(args, log))
        args.tree, args.vllm = Path(result["tree"]), Path(result["vllm"])
    elif not (args.vllm and args.tree):
        ap.error(f"{args.action} needs --vllm and --tree")
    sm = args.arch.removeprefix("sm_")
    run = Run(
        args.vllm.resolve(),
        args.tree.resolve(),
        args.work.resolve(),
        (args.prefix or args.work / "install").resolve(),
        args.compiler,
        args.python,
        args.arch_list or f"{sm[:-1]}.{sm[-1]}",
        args.build_type,
        args.jobs,
        extra=args.cmake_arg,
    )
    configure(run, log)
    cmds = commands(run)
    problems = check_nvcc_commands(cmds, run.tree, args.arch) if args.compiler == "nvcc" else []
    result.update(
        {
            "ok": not problems,
            "problems": problems,
            "arch_list": run.arch_list,
            "commands": [shlex.join(c) for c in cmds],
        }
    )
    if args.action != "commands" and not args.dry_run and not problems:
        installed = build_and_install(run, log)
        result["installed"] = str(installed)
        if args.lab_build_dir:
            args.lab_build_dir.mkdir(parents=True, exist_ok=True)
            extension.clear_manifest(args.lab_build_dir)
            shutil.copy(installed, args.lab_build_dir / installed.name)
            manifest = lab_manifest(run, args.arch, cmds, time.monotonic() - start)
            extension.write_manifest(args.lab_build_dir, manifest)
            result["lab_build_dir"] = str(args.lab_build_dir)
    result["seconds"] = round(time.monotonic() - start, 1)
    text = json.dumps(result, indent=1)
    print(text)
    if args.summary:
        args.summary.write_text(text + "\n")
    for p in problems:
        print(f"[vllm-cmake] FAIL {p}", file=sys.stderr)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (CheckFailed, EnvironmentProblem) as exc:
        print(f"[vllm-cmake] error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
