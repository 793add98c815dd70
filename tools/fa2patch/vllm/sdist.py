# SPDX-License-Identifier: BSD-3-Clause
"""A supported vLLM release's Python sources (``extract_vllm_sources``): its sha256-pinned sdist
from the package index, plus the Python files the sdist lacks, read from the release's wheel and
checked one by one (packaging/vllm-releases.toml, ``wheel_files``). For `package --vllm-src`, the
peer model's extraction, the tests and the GPU lab."""

import tarfile
from pathlib import Path

from fa2patch.common.project import Project
from fa2patch.series.fetch import fetch_pinned, fetch_pinned_member
from fa2patch.vllm import releases
from fa2patch.vllm.releases import Release


def extract_vllm_sources(
    project: Project, dest: Path, extra: tuple[str, ...] = (), release: Release | None = None
) -> Path:
    """The release's Python package (default: the primary release; and ``extra`` files of its
    source tree) at ``dest``/vllm-<version>, from its sdist fetched through the package index."""
    release = release or releases.load(project).primary
    sdist = fetch_pinned("vllm", release.sdist.file, release.sdist.sha256, release.sdist.size)
    top = f"vllm-{release.version}"
    wanted = (f"{top}/vllm/", *(f"{top}/{e}" for e in extra))
    with tarfile.open(sdist) as tar:
        members = [
            m
            for m in tar.getmembers()
            if m.isfile() and m.name.startswith(wanted) and (m.name.endswith(".py") or m.name in wanted)
        ]
        tar.extractall(dest, members=members, filter="data")
    for member, sha256 in release.wheel_files.items():
        assert release.wheel is not None  # releases.load pairs them
        data = fetch_pinned_member("vllm", release.wheel.file, release.wheel.size, member, sha256)
        target = dest / top / member
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return dest / top
