# SPDX-License-Identifier: BSD-3-Clause
"""Shared test helpers: small archives, the mini project, toolchain requirement, scripts by path."""

import hashlib
import importlib.util
import io
import os
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def load_script(path: Path, name: str):
    """A script that is not a package module (ci/vllm-lab/*.py, tests/gpu/*_cases.py), imported from
    its path under ``name``; its own folder first on sys.path, for the imports beside it."""
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference_digest(files: dict[str, tuple[int, bytes]]) -> str:
    """The tree digest, recomputed here from its definition (not with fa2patch.common.digest)."""
    lines = [
        f"{'100755' if mode & 0o111 else '100644'} {hashlib.sha256(data).hexdigest()} {p}\n"
        for p, (mode, data) in sorted(files.items(), key=lambda kv: kv[0].encode())
    ]
    return "sha256:" + hashlib.sha256("".join(lines).encode()).hexdigest()


def make_tar(path: Path, members: list[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for m in members:
            info, data = m if isinstance(m, tuple) else (m, None)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def file_member(name: str, data: bytes, mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    return info, data


MINI_FILES = {
    "PKG-INFO": (0o644, b"Metadata-Version: 2.1\nName: mini\nVersion: 1.0\n"),
    "README": (0o644, b"mini baseline\n"),
    "src/kernel.cu": (0o644, b"// kernel\nint a = 1;\nint b = 2;\nint c = 3;\n"),
    "src/api.cpp": (0o644, b"#include <x>\n\nvoid f() {\n  return;\n}\n"),
    "tools/run.sh": (0o755, b"#!/bin/sh\necho run\n"),
}


@dataclass
class MiniProject:
    root: Path
    cache: Path
    archive: Path

    @property
    def env(self) -> dict:
        return {**os.environ, "FA2PATCH_ROOT": str(self.root), "FA2PATCH_CACHE": str(self.cache)}

    @property
    def workspace(self) -> Path:
        return self.root / "work" / "flash-attn"

    def run(self, *args, check_rc: int | None = 0) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [sys.executable, "-m", "fa2patch", *args], capture_output=True, text=True, env=self.env, cwd=self.root
        )
        if check_rc is not None:
            assert proc.returncode == check_rc, (args, proc.returncode, proc.stdout, proc.stderr)
        return proc

    def git(self, *args, cwd=None) -> str:
        env = {
            **os.environ,
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_AUTHOR_NAME": "dev",
            "GIT_AUTHOR_EMAIL": "dev@x",
            "GIT_COMMITTER_NAME": "dev",
            "GIT_COMMITTER_EMAIL": "dev@x",
        }
        return subprocess.run(
            ["git", *args], cwd=cwd or self.workspace, env=env, check=True, capture_output=True, text=True
        ).stdout


def locked_toolchain():
    """This repository's [toolchain] pins."""
    from fa2patch.common.lockfile import Lock

    return Lock.load(REPO / "baseline.lock").toolchain


def require_toolchain():
    """Skip without the sm_70 toolchain, unless CI demands it (FA2PATCH_REQUIRE_TOOLCHAIN=1)."""
    from fa2patch.compile import toolchain

    pins = locked_toolchain()
    missing = [
        n
        for n, ok in (
            (f"clang++-{pins.clang}", toolchain.find_clang(pins.clang)),
            ("fatbinary", toolchain.find_fatbinary()),
            ("nvidia-cuda-nvcc-cu12", toolchain.nvidia_wheel_dir("cuda_nvcc")),
            ("cuobjdump", toolchain.find_cuda12_binutil("cuobjdump")),
        )
        if not ok
    ]
    if missing:
        if os.environ.get("FA2PATCH_REQUIRE_TOOLCHAIN") == "1":
            pytest.fail(f"toolchain required but missing: {missing}")
        pytest.skip(f"sm_70 toolchain missing: {missing} (run the README's set-up command)")


def dense_geometry(head_dim, rows=64, keys=32, warps=4):
    """A build_info() kernel entry of the exact route as the extension declares it."""
    from fa2patch.common.routes import EXACT

    return {
        "kernel": f"flash_fwd_sm70_kernel<{head_dim}>",
        "threads": 32 * warps,
        "dynamic_smem": 1024,
        "route": EXACT,
        "head_dim": head_dim,
        "rows_per_cta": rows,
        "keys_per_iteration": keys,
        "warps": warps,
    }


def cpp_head_dims(tree: Path) -> list[int]:
    """kHeadDims as kernel_traits.h writes it: the one C++ list of instantiated head dims."""
    import re

    text = (tree / "csrc/flash_attn/fa2patch/sm70/kernel_traits.h").read_text()
    found = re.findall(r"kHeadDims\s*=\s*\{([0-9,\s]+)\}", text)
    assert len(found) == 1, "kernel_traits.h must define kHeadDims exactly once"
    return [int(x) for x in found[0].split(",")]


# One mma.m8n8k4 (four HMMA.884 steps on sm_70), for tiny kernels built by the tests.
MMA = (
    'asm volatile("mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32 {%0,%1,%2,%3,%4,%5,%6,%7}, '
    '{%8,%9}, {%10,%11}, {%0,%1,%2,%3,%4,%5,%6,%7};" : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), '
    '"+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]) : "r"(a[0]), "r"(a[1]), '
    '"r"(b[0]), "r"(b[1]));'
)


def compile_cu(clang_cuda, source, tmp_path, extra=(), macros=True):
    """Compile ``source`` for sm_70 with the locked clang and CUDA folder; (object, stderr)."""
    from fa2patch.compile.builder import clang_cuda_flags

    clang, cuda = clang_cuda
    src, obj = tmp_path / "k.cu", tmp_path / "k.o"
    src.write_text(source)
    flags = clang_cuda_flags("sm_70", cuda, locked_toolchain().cuda)
    if not macros:
        flags = [f for f in flags if "__CUDACC_VER" not in f]
    proc = subprocess.run(
        [str(clang), "-O3", "-std=c++17", *flags, *extra, "-c", str(src), "-o", str(obj)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    return obj, proc.stderr


def project_copy(tmp_path_factory, name: str) -> MiniProject:
    """A copy of this repository's lock, patches, schemas, budgets, packaging and licence files in a
    temporary project. Uses the user's archive cache (fetching the real baseline into it if needed)."""
    import shutil

    from fa2patch.common.project import user_cache_dir

    root = tmp_path_factory.mktemp(name) / "proj"
    root.mkdir()
    for file in ("baseline.lock", "budgets.toml", "pyproject.toml", "LICENSE", "NOTICE"):
        shutil.copy(REPO / file, root / file)
    for folder in ("patches", "schemas", "packaging"):
        shutil.copytree(REPO / folder, root / folder)
    return MiniProject(root, user_cache_dir(), user_cache_dir() / "archives")
