# SPDX-License-Identifier: BSD-3-Clause
"""package: what people who ship vLLM for V100 install (README, docs/packaging.md).

- ``wheel``: the verified extension of ``build/<arch>`` plus the vLLM plugin
  (``packaging/fa2patch_vllm``, entry point in ``vllm.general_plugins``), for an existing vLLM
  install whose torch is the one the extension was built against.
- ``vllm_source_tree``: the patched tree, restricted to what the build needs, with a
  CMakeLists.txt generated from its fa2patch-build.toml and fa2patch's compiler flags, for a
  vLLM source build (``VLLM_FLASH_ATTN_SRC_DIR``); plus a plugin-only wheel (the gates).

Wheels are written here (zipfile, RECORD hashes) rather than by a build backend: a backend
would tag a wheel of prebuilt files as pure Python, and fixed timestamps make the bytes depend
only on the contents.
"""

import base64
import hashlib
import io
import json
import re
import shutil
import subprocess
import sysconfig
import tarfile
import tempfile
import zipfile
from pathlib import Path

from fa2patch import __version__
from fa2patch.common.digest import git_tree_digest
from fa2patch.common.errors import CheckFailed, EnvironmentProblem
from fa2patch.common.lockfile import Lock
from fa2patch.common.project import Project
from fa2patch.compile import builder as build
from fa2patch.compile.description import BuildDescription
from fa2patch.compile.toolchain import TORCH_QUERY
from fa2patch.series import gitws
from fa2patch.vllm import releases

DIST = "fa2patch_vllm"  # distribution and import name
ENTRY_POINTS = "[vllm.general_plugins]\nfa2patch_v100 = fa2patch_vllm.plugin:register\n"
PLUGIN_FILES = ("__init__.py", "plugin.py", "routing_profile.py", "backend.py", "segments.py")
ZIP_DATE = (1980, 1, 1, 0, 0, 0)
LICENSES = ("LICENSE", "NOTICE")  # fa2patch's, at the project root: in every wheel
# In the extension's wheel, from the FA2 tree: FA2's LICENSE, and CUTLASS's licence as the release
# states it (the FA2 sdist ships csrc/cutlass without CUTLASS's LICENSE.txt): the comment that opens
# cutlass.h, stored as a REUSE-style <file>.license next to the path it comes from.
FA2_LICENSE = "LICENSE"
FA2_AUTHORS = "AUTHORS"  # FA2's LICENSE assigns copyright to the contributors "as shown by the AUTHORS file"
CUTLASS_LICENSED_HEADER = "csrc/cutlass/include/cutlass/cutlass.h"
# Besides the build's include folders: the build description and FA2's licence.
TREE_EXTRAS = ("fa2patch-build.toml", "LICENSE", "AUTHORS")
# vLLM's fork ships FA2's Triton rotary kernel as vllm.vllm_flash_attn.layers.rotary (vLLM's
# ApplyRotaryEmb.forward_cuda imports it); vLLM installs the tree's vllm_flash_attn/*.py.
ROTARY = {
    "flash_attn/layers/rotary.py": "vllm_flash_attn/layers/rotary.py",
    "flash_attn/ops/triton/rotary.py": "vllm_flash_attn/ops/triton/rotary.py",
}


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_wheel(
    out_dir: Path, version: str, tag: str, files: dict[str, bytes], summary: str, licenses: dict[str, bytes]
) -> Path:
    """A wheel of ``files`` ({archive path: bytes}) with metadata, entry points and RECORD;
    ``licenses`` ({path below the dist-info's licenses/: bytes}) go there, each named by a
    License-File line of METADATA (PEP 639, core metadata 2.4)."""
    info = f"{DIST}-{version}.dist-info"
    purelib = tag.endswith("-none-any")
    meta = {
        f"{info}/METADATA": (
            f"Metadata-Version: 2.4\nName: {DIST.replace('_', '-')}\nVersion: {version}\n"
            f"Summary: {summary}\nLicense-Expression: BSD-3-Clause\n"
            + "".join(f"License-File: {name}\n" for name in licenses)
            + "Requires-Python: >=3.9\n"
        ),
        f"{info}/WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: fa2patch {__version__}\n"
            f"Root-Is-Purelib: {'true' if purelib else 'false'}\nTag: {tag}\n"
        ),
        f"{info}/entry_points.txt": ENTRY_POINTS,
    }
    entries = {
        **files,
        **{f"{info}/licenses/{name}": data for name, data in licenses.items()},
        **{k: v.encode() for k, v in meta.items()},
    }
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in sorted(entries.items()))
    entries[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"{DIST}-{version}-{tag}.whl"
    tmp = wheel.with_name(wheel.name + ".partial")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in sorted(entries.items()):
            item = zipfile.ZipInfo(name, ZIP_DATE)
            item.external_attr = (0o755 if name.endswith(".so") else 0o644) << 16
            item.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(item, data)
    tmp.replace(wheel)
    return wheel


def plugin_files(project: Project) -> dict[str, bytes]:
    folder = project.root / "packaging" / DIST
    missing = [n for n in PLUGIN_FILES if not (folder / n).is_file()]
    if missing:
        raise EnvironmentProblem(f"{folder}: the vLLM plugin package is incomplete (missing {missing})")
    return {f"{DIST}/{n}": (folder / n).read_bytes() for n in PLUGIN_FILES}


def own_licenses(project: Project) -> dict[str, bytes]:
    """fa2patch's LICENSE and NOTICE (the project root's), for every wheel."""
    missing = [n for n in LICENSES if not (project.root / n).is_file()]
    if missing:
        raise EnvironmentProblem(f"{project.root}: no {' or '.join(missing)} to put in the wheel")
    return {n: (project.root / n).read_bytes() for n in LICENSES}


def tree_licenses(workspace: Path) -> dict[str, bytes]:
    """The licences of the code the extension is compiled from, from the replayed FA2 tree, under
    flash-attn/ by their paths in it: FA2's LICENSE with the AUTHORS file it names, and CUTLASS's
    (``license_comment`` of cutlass.h) as cutlass.h.license."""
    missing = [p for p in (FA2_LICENSE, FA2_AUTHORS, CUTLASS_LICENSED_HEADER) if not (workspace / p).is_file()]
    if missing:
        raise EnvironmentProblem(f"{workspace}: no {', '.join(missing)} (is it the replayed FA2 tree?)")
    return {
        f"flash-attn/{FA2_LICENSE}": (workspace / FA2_LICENSE).read_bytes(),
        f"flash-attn/{FA2_AUTHORS}": (workspace / FA2_AUTHORS).read_bytes(),
        f"flash-attn/{CUTLASS_LICENSED_HEADER}.license": license_comment(workspace / CUTLASS_LICENSED_HEADER),
    }


def license_comment(path: Path) -> bytes:
    """The comment that opens ``path`` (its first bytes up to the line that closes it), when it
    holds a BSD-3-Clause licence text: byte for byte."""
    data = path.read_bytes()
    end = data.find(b"*/\n") if data.startswith(b"/*") else -1
    comment = data[: end + 3] if end >= 0 else b""
    if b"SPDX-License-Identifier: BSD-3-Clause" not in comment or b"Redistribution and use" not in comment:
        raise EnvironmentProblem(f"{path}: does not open with a comment holding its BSD-3-Clause licence")
    return comment


def platform_tag() -> str:
    return re.sub(r"[-.]", "_", sysconfig.get_platform())


def packageable(project: Project, arch: str) -> tuple[dict, Path]:
    """The manifest and extension of build/<arch>, refused when it is not for a vLLM install: a lab
    build, or a check-only build against a torch that cannot run it (--allow-torch-without-sm70)."""
    from fa2patch.compile.extension import load_manifest

    manifest, artifact = load_manifest(project.build_dir(arch))
    if manifest.get("lab"):
        raise CheckFailed(f"{project.build_dir(arch)}: a lab build ({arch}) is not for vLLM installs")
    if manifest.get("check_only"):
        torch = manifest["torch"]
        raise CheckFailed(
            f"{project.build_dir(arch) / 'manifest.json'}: a check-only build is not packaged (that torch "
            f"cannot run it)\n  expected: a build against a torch that runs {arch} (fa2patch build --python "
            f"PY, without --allow-torch-without-sm70)\n  actual:   a build against torch {torch['version']} "
            f"({torch['python']}): " + "; ".join(manifest["check_only"]["why"])
        )
    return manifest, artifact


def wheel(project: Project, arch: str, out_dir: Path, verified_rows: list, workspace: Path) -> Path:
    """The extension of build/<arch> (already verified: ``verified_rows``) with the plugin, and
    the licences of fa2patch and of the code compiled into the extension (from ``workspace``,
    the FA2 tree it is built from)."""
    manifest, artifact = packageable(project, arch)
    failed = [r for r in verified_rows if not r.ok]
    if failed:
        raise CheckFailed(
            f"{project.build_dir(arch)}: verify failed, nothing packaged:\n  "
            + "\n  ".join(f"{r.name}: {r.detail.splitlines()[0]}" for r in failed)
        )
    torch = manifest["torch"]
    matrix = releases.load(project)
    supported = [r.version for r in matrix.for_torch(torch["version"])]
    if not supported:
        raise CheckFailed(
            f"{project.build_dir(arch) / 'manifest.json'}: torch {torch['version']} is the torch of no supported "
            f"vLLM release\n  expected: one of {', '.join(f'{r.torch} (vLLM {r.version})' for r in matrix.releases)} "
            f"({matrix.path})\n  actual:   {torch['version']} ({torch['python']})"
        )
    record = {
        "bundles_extension": True,
        "fa2patch": __version__,
        "vllm": supported,  # the plugin refuses any other vLLM release
        "arch": arch,
        "torch": {k: torch[k] for k in ("version", "cuda", "cxx11_abi", "arch_list", "python_version")},
        "extension_sha256": manifest["artifact"]["sha256"],
        "compiler": manifest["compiler"]["kind"],
        "cxx_standard": manifest["cxx_standard"],
        "source_tree_digest": manifest["source_tree_digest"],
        "source_matches_lock": manifest["source_matches_lock"],
    }
    files = {
        **plugin_files(project),
        f"{DIST}/build.json": (json.dumps(record, indent=1) + "\n").encode(),
        f"{DIST}/{artifact.name}": artifact.read_bytes(),
    }
    # The torch it needs, in the version (a local label): pip cannot resolve it, the plugin checks it.
    version = f"{__version__}+torch{re.sub(r'[^0-9A-Za-z]+', '.', torch['version'])}"
    py = "cp39-abi3"  # the extension uses the limited API of CPython 3.9 (python_module.cpp)
    return write_wheel(
        out_dir,
        version,
        f"{py}-{platform_tag()}",
        files,
        f"fa2patch's _vllm_fa2_C ({arch}, torch {torch['version']}) and its vLLM plugin",
        {**own_licenses(project), **tree_licenses(workspace)},
    )


def plugin_wheel(project: Project, out_dir: Path, source_digest: str) -> Path:
    """The plugin alone, for a vLLM that built fa2patch's extension itself (--vllm-src)."""
    record = {
        "bundles_extension": False,
        "fa2patch": __version__,
        "vllm": releases.load(project).versions(),  # vLLM built from fa2patch's tree: any supported release
        "source_tree_digest": source_digest,
    }
    files = {**plugin_files(project), f"{DIST}/build.json": (json.dumps(record, indent=1) + "\n").encode()}
    return write_wheel(
        out_dir,
        __version__,
        "py3-none-any",
        files,
        "vLLM plugin for fa2patch's _vllm_fa2_C built by vLLM from fa2patch's source tree",
        own_licenses(project),
    )


def _cmake_list(items) -> str:
    return " ".join('"' + str(i).replace("\\", "\\\\").replace('"', '\\"') + '"' for i in items)


def cmake_lists(project: Project, desc: "BuildDescription", arch: str, cuda_release: str) -> str:
    """The tree's CMakeLists.txt: the template filled with the description and fa2patch's flags."""
    template = project.root / "packaging" / "vllm-src" / "CMakeLists.txt.in"
    if not template.is_file():
        raise EnvironmentProblem(f"{template}: not found")
    spec = desc.arch(arch)
    values = {
        "ARCH": arch,
        "HOST_SOURCES": _cmake_list(desc.host_sources),
        "CUDA_SOURCES": _cmake_list(spec.cuda_sources),
        "INCLUDE_DIRS": _cmake_list(desc.include_dirs),
        "SYSTEM_INCLUDE_DIRS": _cmake_list(desc.system_include_dirs),
        "DEFINES": _cmake_list(build.defines(desc, arch)),
        # -std and -fPIC come from CMake's CXX_STANDARD/CUDA_STANDARD and its module libraries.
        "OPT_FLAGS": _cmake_list([f for f in build.BASE_FLAGS if not f.startswith(("-std=", "-fPIC"))]),
        "CXX_STANDARD": build.CXX_STANDARD.removeprefix("c++"),
        "CLANG_CUDA_FLAGS": _cmake_list(
            [f for f in build.clang_cuda_flags(arch, Path(), cuda_release) if not f.startswith("--cuda-path=")]
        ),
        "NVCC_FLAGS": _cmake_list(build.nvcc_cuda_flags(arch)),
        "TORCH_LIBS": _cmake_list(build.TORCH_LIBS),
    }
    text = template.read_text()
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    left = sorted(set(re.findall(r"@([A-Z_]+)@", text)))
    if left:
        raise CheckFailed(f"{template}: placeholders without a value: {left}")
    return text


def tree_paths(desc: "BuildDescription", arch: str) -> list[str]:
    """The top folders of the build's sources and includes (nested ones dropped)."""
    sources = desc.host_sources + desc.arch(arch).cuda_sources
    roots = sorted(set(desc.include_dirs + desc.system_include_dirs + [str(Path(s).parent) for s in sources]))
    return [r for r in roots if not any(r != o and r.startswith(o + "/") for o in roots)]


def vllm_source_tree(project: Project, workspace: Path, dest: Path, arch: str, lock: Lock, force: bool = False) -> dict:
    """Write the tree for VLLM_FLASH_ATTN_SRC_DIR at ``dest`` from the workspace's HEAD commit."""
    repo = gitws.open_repo(workspace)
    dirty = gitws.uncommitted_paths(repo)
    if dirty:
        raise CheckFailed(
            f"{workspace}: uncommitted changes ({', '.join(dirty[:5])}); the source tree "
            "is made from committed work only"
        )
    desc = BuildDescription.load(workspace)
    desc.arch(arch)
    dest = dest.resolve()
    if dest.exists() and any(dest.iterdir()) and not force:
        raise EnvironmentProblem(f"{dest}: exists and is not empty (pass --force to replace it)")
    committed = set(repo.git.ls_tree("-r", "--name-only", "HEAD").splitlines())
    paths = tree_paths(desc, arch) + [p for p in TREE_EXTRAS if p in committed]
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        archive = subprocess.run(
            ["git", "-C", str(workspace), "archive", "--format=tar", "HEAD", "--", *paths],
            capture_output=True,
            check=True,
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(staging, filter="data")
        for source, target in ROTARY.items():
            if source in committed:
                text = repo.git.show(f"HEAD:{source}")
                (staging / target).parent.mkdir(parents=True, exist_ok=True)
                (staging / target).write_text(
                    text.replace("flash_attn.ops.triton.rotary", "vllm.vllm_flash_attn.ops.triton.rotary") + "\n"
                )
        (staging / "vllm_flash_attn").mkdir(exist_ok=True)  # vLLM installs its *.py files
        (staging / "cmake").mkdir()
        shutil.copy(TORCH_QUERY, staging / "cmake" / "torch_query.py")
        (staging / "CMakeLists.txt").write_text(cmake_lists(project, desc, arch, lock.toolchain.cuda))
        digest = git_tree_digest(repo, "HEAD")
        record = {
            "fa2patch": __version__,
            "arch": arch,
            "cxx_standard": build.CXX_STANDARD,
            "source_tree_digest": digest,
            "source_matches_lock": digest == lock.final_digest(),
            "paths": paths,
        }
        (staging / "fa2patch-vllm-src.json").write_text(json.dumps(record, indent=1) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        staging.rename(dest)
    except (OSError, subprocess.CalledProcessError, tarfile.TarError) as exc:
        raise EnvironmentProblem(f"{dest}: cannot write the source tree: {exc}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"vllm_src": str(dest), **record}
