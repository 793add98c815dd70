# SPDX-License-Identifier: BSD-3-Clause
"""The vLLM release fa2patch is tested with (packaging/vllm-release.toml): its facts
(``vllm_release``) and its Python sources from its sha256-pinned sdist (``extract_vllm_sources``),
for `package --vllm-src`, `doctor --vllm`, the peer model's extraction and the tests."""

import tarfile
import tomllib
from pathlib import Path

from fa2patch.common.errors import EnvironmentProblem
from fa2patch.common.project import Project
from fa2patch.series.fetch import fetch_pinned


def vllm_release(project: Project) -> dict:
    """The tested vLLM release (packaging/vllm-release.toml)."""
    path = project.root / "packaging" / "vllm-release.toml"
    try:
        return tomllib.loads(path.read_text())["vllm"]
    except (OSError, tomllib.TOMLDecodeError, KeyError) as exc:
        raise EnvironmentProblem(f"{path}: cannot read the tested vLLM release: {exc}") from exc


def extract_vllm_sources(project: Project, dest: Path, extra: tuple[str, ...] = ()) -> Path:
    """The tested vLLM release's Python package (and ``extra`` files of its source tree) at
    ``dest``/vllm-<version>, from its sdist fetched through the package index."""
    release = vllm_release(project)
    sdist = fetch_pinned("vllm", release["sdist"], release["sha256"], release["size"])
    top = f"vllm-{release['version']}"
    wanted = (f"{top}/vllm/", *(f"{top}/{e}" for e in extra))
    with tarfile.open(sdist) as tar:
        members = [
            m
            for m in tar.getmembers()
            if m.isfile() and m.name.startswith(wanted) and (m.name.endswith(".py") or m.name in wanted)
        ]
        tar.extractall(dest, members=members, filter="data")
    return dest / top
