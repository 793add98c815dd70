# SPDX-License-Identifier: BSD-3-Clause
"""build: compile `_vllm_fa2_C` from the replayed workspace for one architecture with ninja.

The patched tree says what to build in ``fa2patch-build.toml`` (sources per architecture,
defines, include folders, which kernels must use tensor cores). This module turns it into a
``build.ninja`` for the chosen compiler route, runs it, and writes ``manifest.json``.
"""

import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fa2patch import __version__
from fa2patch.common.digest import sha256_file, tree_digest
from fa2patch.common.errors import EnvironmentProblem, Fa2PatchError, mismatch
from fa2patch.common.lockfile import Toolchain
from fa2patch.compile import sass, toolchain
from fa2patch.compile.description import BuildDescription
from fa2patch.compile.extension import clear_manifest, manifest_for_artifact, write_manifest

ARTIFACT_SUFFIX = ".abi3.so"


class BuildFailed(Fa2PatchError):
    exit_code = 1


def _q(args) -> str:
    return " ".join(shlex.quote(str(a)) for a in args)


# C++20 for every torch: torch >= 2.10's headers require it ("C++20 or later compatible compiler
# is required to use ATen"), and the sources build cleanly as C++20 against 2.9.1 too (measured:
# docs/packaging.md), so one standard serves every supported torch, clang and nvcc alike.
CXX_STANDARD = "c++20"
BASE_FLAGS = [f"-std={CXX_STANDARD}", "-O3", "-fPIC"]
TORCH_LIBS = ["c10", "c10_cuda", "torch", "torch_cpu", "torch_cuda"]


def defines(desc: BuildDescription, arch: str) -> list[str]:
    """Preprocessor definitions of every source (torch's C++ ABI flag comes on top)."""
    return [*desc.defines, *desc.arch(arch).defines, f"TORCH_EXTENSION_NAME={desc.name}", "NDEBUG"]


def clang_cuda_flags(arch: str, cuda_path: Path | str, cuda_release: str) -> list[str]:
    """clang's flags for a CUDA source compiled for ``arch`` against the assembled CUDA folder of
    ``cuda_release`` ("12.8", baseline.lock's [toolchain] cuda)."""
    major, minor = cuda_release.split(".")
    return [
        "-x",
        "cuda",
        f"--cuda-gpu-arch={arch}",
        f"--cuda-path={cuda_path}",
        # CuTe/CUTLASS enable their MMA atoms only when these nvcc macros exist; without
        # them every MMA silently compiles to a trap (docs/DESIGN.md §5).
        f"-D__CUDACC_VER_MAJOR__={major}",
        f"-D__CUDACC_VER_MINOR__={minor}",
        "-Xcuda-ptxas",
        "-v",
    ]


def nvcc_cuda_flags(arch: str) -> list[str]:
    """nvcc's flags for a CUDA source compiled for ``arch`` (host flags go through -Xcompiler)."""
    sm = arch.removeprefix("sm_")
    return [
        f"-gencode=arch=compute_{sm},code=sm_{sm}",
        "-Xptxas=-v",
        "--expt-relaxed-constexpr",
        "--expt-extended-lambda",
    ]


def folder_links(tree: Path, site_packages: Path, python_include: str) -> dict[str, Path]:
    """The build folder's links to the folders a compile reads, by the name build.ninja spells them
    with. ninja runs in the build folder, so every path on a command line is relative and names no
    folder of this machine: the same series against the same torch gives the same commands in any
    project folder (ccache hits across folders: CI's gate and its tests, a second checkout), and the
    header paths that reach the binary through __FILE__ read fa2/..., site-packages/..."""
    return {"fa2": tree.absolute(), "site-packages": site_packages.absolute(), "python-include": Path(python_include)}


def make_links(build_dir: Path, links: dict[str, Path]) -> None:
    for name, target in links.items():
        link = build_dir / name
        if link.is_symlink() or link.is_file():
            link.unlink()
        elif link.exists():
            raise BuildFailed(f"{link}: expected a link to {target} made by fa2patch build, found a folder (remove it)")
        link.symlink_to(target, target_is_directory=True)


def spell(path: Path | str, build_dir: Path, links: dict[str, Path]) -> str:
    """``path`` as build.ninja spells it: relative to the build folder, through the link to the
    deepest linked folder that holds it; a path outside all of them stays absolute."""
    path = Path(path)
    roots = sorted([(".", build_dir.absolute()), *links.items()], key=lambda item: -len(item[1].parts))
    for name, root in roots:
        if path.is_relative_to(root):
            return str(Path(name) / path.relative_to(root))
    return str(path)


# What `fa2patch build --python` says when a torch cannot run the build (README: "V100 with vLLM
# 0.33, from zero").
TORCH_HINT = (
    "  (vLLM 0.33 pins torch 2.14.0: install PyTorch's CUDA 12.6 build of it, which carries sm_70;\n"
    "   other torch wheels with sm_70: 2.9.x and 2.10 for CUDA 12.6/12.8, from 2.11 the CUDA 12.6 ones.\n"
    "   To only check that fa2patch builds and loads with this torch, nothing to package:\n"
    "   --allow-torch-without-sm70)"
)


def torch_for_build(python: str, arch: str, check_only: bool = False) -> tuple[dict, list[str]]:
    """torch of ``python``, and why the result could not run with it (empty for a torch that can).

    A V100 build of vLLM needs a torch that still carries sm_70 (the extension must load and run
    in that process): any other is refused, unless ``check_only`` (--allow-torch-without-sm70),
    where the reasons are returned and recorded, and `package` refuses the result."""
    torch = toolchain.torch_info(python)
    if not torch:
        raise EnvironmentProblem(
            f"{python}: cannot import torch with this interpreter\n  install: {toolchain.PIP_BUILD}"
        )
    if not torch.get("cuda"):
        raise EnvironmentProblem(
            f"torch {torch['version']} ({python}) is a CPU build: "
            f"it cannot run {arch} kernels (and has no libtorch_cuda to link)"
        )
    reasons = []
    if not toolchain.torch_runs_arch(torch, arch):
        message = (
            f"torch {torch['version']} ({python}) carries no {arch} code\n"
            f"  expected: {arch} (or PTX at or below it) in torch's arch list\n"
            f"  actual:   {' '.join(torch['arch_list']) or '(empty)'}"
        )
        if not check_only:
            raise EnvironmentProblem(message + "\n" + TORCH_HINT)
        reasons.append(
            f"torch {torch['version']} carries no {arch} code (arch list: {' '.join(torch['arch_list']) or 'empty'})"
        )
    # Recorded as given (a venv's bin/python), not as the interpreter it resolves to.
    return {**torch, "python": str(python)}, reasons


def math_headers(torch: dict, python: str) -> list[str]:
    """-isystem flags for the headers of the CUDA math libraries torch pins (ATen's CUDA headers
    include cuBLAS, cuSPARSE, cuSOLVER and cuRAND's), from the wheels of torch's own environment:
    never from fa2patch's. A pinned library that is missing there, or installed in another version,
    is an error naming both versions."""
    flags = []
    for lib in torch.get("cuda_libraries", []):
        install = f"{python} -m pip install --no-deps {lib['dist']}=={lib['pin']}"
        if lib["installed"] is None or lib["include"] is None:
            raise EnvironmentProblem(
                f"{python}: torch {torch['version']} pins {lib['dist']}=={lib['pin']}, which is not installed "
                f"there (the extension compiles against its headers)\n  install: {install}"
            )
        if lib["installed"] != lib["pin"]:
            raise EnvironmentProblem(
                mismatch(
                    lib["dist"], f"torch {torch['version']}'s environment ({python})", lib["pin"], lib["installed"]
                )
                + f"\n  install: {install}"
            )
        flags += ["-isystem", lib["include"]]
    return flags


@dataclass
class Plan:
    """Everything the ninja file and the manifest say about one build."""

    compiler: toolchain.Compiler
    cxx: list[str]
    cxx_flags: list[str]
    cuda: list[str]
    cuda_flags: list[str]
    link: list[str]
    link_flags: list[str]
    ptxas: Path | None
    torch: dict = field(default_factory=dict)  # the torch built against (toolchain.torch_info)
    # A build that cannot run with that torch (--allow-torch-without-sm70): why, and the CUDA
    # runtime verify preloads to load it there; None for a build that can.
    check_only: dict | None = None
    links: dict[str, Path] = field(default_factory=dict)  # folder_links: what build.ninja's paths go through


def plan(
    desc: BuildDescription,
    arch: str,
    tree: Path,
    build_dir: Path,
    compiler_choice: str,
    pins: Toolchain,
    python: str = sys.executable,
    check_only: bool = False,
) -> Plan:
    torch, reasons = torch_for_build(python, arch, check_only)
    if toolchain.find_ninja() is None:
        raise EnvironmentProblem(f"ninja: not found\n  install: {toolchain.PIP_BUILD}")
    comp = toolchain.choose_compiler(compiler_choice, arch, build_dir, pins)
    cuda = pins.cuda if comp.kind == "clang" else comp.version
    other_cuda = cuda.split(".")[0] != str(torch["cuda"]).split(".")[0]
    if other_cuda and not check_only:
        raise EnvironmentProblem(
            mismatch(
                "CUDA major version",
                f"torch {torch['version']} ({python})",
                f"{cuda.split('.')[0]}.x (the {comp.kind} route builds with CUDA {cuda})",
                torch["cuda"],
            )
            + "\n  (the extension and torch must share libcudart)"
        )
    if other_cuda:
        reasons.append(
            f"torch {torch['version']} uses CUDA {torch['cuda']}, the build CUDA {cuda} "
            f"(libcudart.so.{cuda.split('.')[0]})"
        )
    if other_cuda:
        reasons.append(f"the CUDA math libraries' headers are those of the CUDA {cuda} wheels, not torch's pins")
    flags = [f"-D{d}" for d in defines(desc, arch)] + [f"-D_GLIBCXX_USE_CXX11_ABI={torch['cxx11_abi']}"]
    links = folder_links(tree, Path(torch["site_packages"]), torch["python_include"])

    def rel(path: Path | str) -> str:
        return spell(path, build_dir, links)

    includes = [f"-I{rel(tree / d)}" for d in desc.include_dirs]
    # The clang route's CUDA folder is made of wheels: the math libraries' headers come from torch's own
    # environment, at its pins. nvcc's toolkit has its own (the lab's CUDA 13 build).
    math_includes = math_headers(torch, python) if comp.kind == "clang" and not other_cuda else []
    includes += [w if w == "-isystem" else rel(w) for w in math_includes]
    for p in [*(tree / d for d in desc.system_include_dirs), *torch["include"], torch["python_include"]]:
        includes += ["-isystem", rel(p)]  # separate words: nvcc rejects -isystem<dir>
    common = [*BASE_FLAGS, *flags, *includes]
    launcher = [str(toolchain.find_ccache())] if toolchain.find_ccache() else []
    libs = [f"-L{p}" for p in torch["lib"]] + [f"-l{lib}" for lib in TORCH_LIBS]
    if comp.kind == "clang":
        cuda_path = comp.cuda_path
        if cuda_path is None:
            raise EnvironmentProblem("clang route: no CUDA folder was assembled for clang's --cuda-path")
        cxx = [*launcher, str(comp.path)]
        cxx_flags = [*common, "-isystem", rel(cuda_path / "include")]
        cuda_flags = [*common, *clang_cuda_flags(arch, rel(cuda_path), pins.cuda)]
        link = [str(comp.path)]
        link_flags = ["-shared", *libs, f"-L{cuda_path / 'lib64'}", "-lcudart"]
        ptxas = cuda_path / "bin" / "ptxas"
        cudart = cuda_path / "lib64" / "libcudart.so"
    else:
        host = comp.host_cxx
        if host is None:
            raise EnvironmentProblem("nvcc route: no host C++ compiler (set CXX or install g++)")
        cuda_home = comp.path.parent.parent
        cxx = [*launcher, str(host)]
        cxx_flags = [*common, "-isystem", str(cuda_home / "include")]
        cuda_flags = [
            f"-std={CXX_STANDARD}",
            "-O3",
            "-Xcompiler",
            "-fPIC",
            *flags,
            *includes,
            *nvcc_cuda_flags(arch),
            f"-ccbin={host}",
        ]
        link = [str(host)]
        link_flags = ["-shared", *libs, f"-L{cuda_home / 'lib64'}", "-lcudart"]
        ptxas = comp.path.parent / "ptxas"
        cudart = cuda_home / "lib64" / "libcudart.so"
    check = None
    if check_only and reasons:
        # The CUDA runtime the extension links, loaded by verify before it (torch brings another).
        check = {"why": reasons, "preload": [str(cudart.resolve())] if other_cuda else []}
    return Plan(
        comp, cxx, cxx_flags, [*launcher, str(comp.path)], cuda_flags, link, link_flags, ptxas, torch, check, links
    )


def write_ninja(desc: BuildDescription, arch: str, tree: Path, build_dir: Path, p: Plan) -> Path:
    spec = desc.arch(arch)
    artifact = build_dir / (desc.name + ARTIFACT_SUFFIX)
    lines = [
        "# generated by fa2patch build; do not edit",
        "builddir = .",  # ninja runs in the build folder
        f"cxx = {_q(p.cxx)}",
        f"cxx_flags = {_q(p.cxx_flags)}",
        f"cuda = {_q(p.cuda)}",
        f"cuda_flags = {_q(p.cuda_flags)}",
        f"link = {_q(p.link)}",
        f"link_flags = {_q(p.link_flags)}",
        "rule cxx",
        "  command = $cxx $cxx_flags -MD -MF $out.d -c $in -o $out",
        "  depfile = $out.d",
        "  deps = gcc",
        "  description = CXX $in",
        # Keep ptxas -v output (registers, spills per kernel) beside each object.
        "rule cuda",
        "  command = sh -c '$cuda $cuda_flags -MD -MF $out.d -c $in -o $out 2> $out.log; "
        "s=$$?; cat $out.log >&2; exit $$s'",
        "  depfile = $out.d",
        "  deps = gcc",
        "  description = CUDA $in",
        "rule link",
        "  command = $link $in -o $out $link_flags",
        "  description = LINK $out",
    ]
    objects = []
    for rule, sources in (("cxx", desc.host_sources), ("cuda", spec.cuda_sources)):
        for src in sources:
            obj = object_path(build_dir, src)
            objects.append(obj)
            lines.append(f"build {_ninja_path(obj, build_dir, p)}: {rule} {_ninja_path(tree / src, build_dir, p)}")
    linked = " ".join(_ninja_path(o, build_dir, p) for o in objects)
    lines.append(f"build {_ninja_path(artifact, build_dir, p)}: link {linked}")
    lines.append(f"default {_ninja_path(artifact, build_dir, p)}")
    ninja_file = build_dir / "build.ninja"
    ninja_file.write_text("\n".join(lines) + "\n")
    return ninja_file


def object_path(build_dir: Path, src: str) -> Path:
    return build_dir / "obj" / (src.replace("/", "__") + ".o")


def ptxas_kernels(build_dir: Path, cuda_sources: list[str]) -> list[dict]:
    """ptxas's numbers for the entry functions of this build's CUDA objects (the logs the cuda rule
    keeps beside them); logs of objects that a previous build description listed are ignored."""
    entries = {}
    for src in cuda_sources:
        log = Path(f"{object_path(build_dir, src)}.log")
        if not log.is_file():
            raise BuildFailed(f"{log}: the ptxas -v output of {src} is missing (remove {build_dir} and build again)")
        entries.update(sass.parse_ptxas_log(log.read_text(errors="replace")))
    return [asdict(e) for e in entries.values() if e.entry]


def _ninja_path(path: Path, build_dir: Path, p: Plan) -> str:
    return spell(path, build_dir, p.links).replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def build(
    tree: Path,
    arch: str,
    build_dir: Path,
    pins: Toolchain,
    compiler_choice: str = "auto",
    jobs: int | None = None,
    expected_digest: str | None = None,
    echo=print,
    python: str = sys.executable,
    check_only: bool = False,
) -> dict:
    """Compile the extension against the torch of ``python``; return the manifest. The
    compiler's and ninja's output go to stderr (stdout stays free for the command's result).
    ``check_only``: accept a torch that cannot run the result (recorded; `package` refuses it)."""
    start = time.monotonic()
    tree = Path(tree).resolve()
    if not tree.is_dir():
        raise EnvironmentProblem(f"{tree}: workspace not found (run fa2patch replay)")
    desc = BuildDescription.load(tree)
    spec = desc.arch(arch)
    build_dir = Path(build_dir).absolute()  # ninja runs there
    build_dir.mkdir(parents=True, exist_ok=True)
    clear_manifest(build_dir)
    p = plan(desc, arch, tree, build_dir, compiler_choice, pins, python, check_only)
    make_links(build_dir, p.links)
    ninja_file = write_ninja(desc, arch, tree, build_dir, p)
    echo(
        f"build {desc.name} for {arch} with {p.compiler.kind} {p.compiler.version} against torch "
        f"{p.torch['version']}, {CXX_STANDARD} ({len(desc.host_sources)} host, {len(spec.cuda_sources)} "
        "CUDA sources)"
    )
    if p.check_only:
        echo("check-only build (--allow-torch-without-sm70), not for packaging: " + "; ".join(p.check_only["why"]))
    cmd = [str(toolchain.find_ninja()), "-f", str(ninja_file), "-j", str(jobs or os.cpu_count() or 1)]
    proc = subprocess.run(cmd, cwd=build_dir, env={**os.environ, "NINJA_STATUS": "[%f/%t %es] "}, stdout=sys.stderr)
    if proc.returncode != 0:
        raise BuildFailed(
            f"{ninja_file}: ninja failed with exit code {proc.returncode} (the compiler's message is above)"
        )
    artifact = build_dir / (desc.name + ARTIFACT_SUFFIX)
    manifest = _manifest(desc, arch, tree, build_dir, p, artifact, expected_digest)
    manifest["wall_seconds"] = round(time.monotonic() - start, 1)
    write_manifest(build_dir, manifest)
    return manifest


def _manifest(desc, arch, tree, build_dir, p: Plan, artifact: Path, expected_digest) -> dict:
    spec = desc.arch(arch)
    digest = tree_digest(tree)
    kernels = ptxas_kernels(build_dir, spec.cuda_sources)
    return {
        "fa2patch": __version__,
        "extension": desc.name,
        "arch": arch,
        "lab": spec.lab,
        "compiler": {"kind": p.compiler.kind, "path": str(p.compiler.path), "version": p.compiler.version},
        "cxx_standard": CXX_STANDARD,
        "ptxas_version": toolchain.ptxas_version(p.ptxas) if p.ptxas and p.ptxas.exists() else "",
        "commands": {"cxx": p.cxx + p.cxx_flags, "cuda": p.cuda + p.cuda_flags, "link": p.link + p.link_flags},
        # The torch this build is for: verify loads it with that interpreter, package records it.
        "torch": {
            **{k: p.torch[k] for k in ("version", "cuda", "cxx11_abi", "arch_list", "python", "python_version")},
            # The CUDA math libraries torch pins, whose headers the build took from its environment.
            "cuda_libraries": p.torch.get("cuda_libraries", []),
        },
        # Not None: this torch cannot run the build (why), built only to check it; package refuses it.
        "check_only": p.check_only,
        "source_tree_digest": digest,
        "source_matches_lock": digest == expected_digest if expected_digest else None,
        "build_description_sha256": sha256_file(desc.path),
        "tensor_core_kernels": spec.tensor_core_kernels,
        "artifact": {"file": artifact.name, "sha256": sha256_file(artifact)},
        "ptxas_kernels": kernels,
    }


def artifact_manifest(artifact: Path, tree: Path, arch: str) -> dict:
    """The manifest verify needs for an extension built without ``fa2patch build`` (for example by
    the CMake of ``fa2patch package --vllm-src``): the arch, lab flag and tensor-core kernel globs
    from the tree's build description (extension.manifest_for_artifact); there is no ptxas log."""
    spec = BuildDescription.load(tree).arch(arch)
    return manifest_for_artifact(artifact, arch, spec.lab, spec.tensor_core_kernels)
