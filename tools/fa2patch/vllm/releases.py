# SPDX-License-Identifier: BSD-3-Clause
"""The supported vLLM releases (packaging/vllm-releases.toml): one entry per release line, each
with its sha256-pinned sdist, the torch it pins and whether a plain `pip install vllm==X` runs on a
V100; ``primary`` is the release whose torch the README's first command builds and packages for.
Read by build, package, doctor --vllm, the plugin's build record, the tests and the GPU lab."""

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from fa2patch.common.errors import EnvironmentProblem
from fa2patch.common.project import Project

MATRIX = Path("packaging") / "vllm-releases.toml"
RELEASE_KEYS = {"version", "line", "torch", "torch_cuda", "v100_from_index", "sdist", "wheel_files"}
PINNED_FILE_KEYS = {"file", "sha256", "size"}


@dataclass(frozen=True)
class Pinned:
    """A file on the package index, pinned by sha256 and size."""

    file: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Release:
    version: str
    line: str  # the releases that pin the same torch and call the op surface alike
    torch: str  # the torch the release pins (its wheel's Requires-Dist: torch==...)
    torch_cuda: str  # the CUDA of that torch's build on the package index
    v100_from_index: bool  # a plain `pip install vllm==<version>` runs on a V100
    sdist: Pinned
    # Python files the sdist lacks, read from the release's wheel: {path in the wheel: sha256}.
    wheel: Pinned | None = None
    wheel_files: dict[str, str] = field(default_factory=dict)

    @property
    def torch_minor(self) -> tuple[int, int]:
        major, minor = self.torch.split(".")[:2]
        return int(major), int(minor)


@dataclass(frozen=True)
class Matrix:
    path: Path
    primary: Release
    releases: tuple[Release, ...]

    def get(self, version: str) -> Release | None:
        return next((r for r in self.releases if r.version == version), None)

    def for_torch(self, torch_version: str) -> list[Release]:
        """The releases that pin this torch (a local label such as +cu128 ignored)."""
        return [r for r in self.releases if r.torch == torch_version.split("+")[0]]

    def versions(self) -> list[str]:
        return [r.version for r in self.releases]


def _pinned(raw, where: str) -> Pinned:
    if not isinstance(raw, dict) or set(raw) != PINNED_FILE_KEYS:
        raise EnvironmentProblem(f"{where}: expected {{file, sha256, size}}, actual {raw!r}")
    return Pinned(str(raw["file"]), str(raw["sha256"]), int(raw["size"]))


def _release(raw: dict, where: str) -> Release:
    unknown = sorted(set(raw) - RELEASE_KEYS)
    missing = sorted(RELEASE_KEYS - {"wheel_files"} - set(raw))
    if unknown or missing:
        raise EnvironmentProblem(f"{where}: unknown key(s) {unknown}, missing key(s) {missing}")
    extra = raw.get("wheel_files") or {}
    if extra and (set(extra) != {"wheel", "files"} or not extra["files"]):
        raise EnvironmentProblem(f"{where}.wheel_files: expected {{wheel, files}}, actual {extra!r}")
    return Release(
        version=raw["version"],
        line=raw["line"],
        torch=raw["torch"],
        torch_cuda=raw["torch_cuda"],
        v100_from_index=bool(raw["v100_from_index"]),
        sdist=_pinned(raw["sdist"], f"{where}.sdist"),
        wheel=_pinned(extra["wheel"], f"{where}.wheel_files.wheel") if extra else None,
        wheel_files=dict(extra.get("files", {})),
    )


def load(project: Project) -> Matrix:
    """The matrix, checked: known keys, one entry per version, the primary among them."""
    path = project.root / MATRIX
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise EnvironmentProblem(f"{path}: cannot read the supported vLLM releases: {exc}") from exc
    if data.get("format") != 1:
        raise EnvironmentProblem(f"{path}: format: expected 1, actual {data.get('format')!r}")
    releases = tuple(_release(r, f"{path}: release[{i}]") for i, r in enumerate(data.get("release", [])))
    versions = [r.version for r in releases]
    if len(set(versions)) != len(versions):
        raise EnvironmentProblem(f"{path}: a version is listed twice: {versions}")
    primary = next((r for r in releases if r.version == data.get("primary")), None)
    if primary is None:
        raise EnvironmentProblem(f"{path}: primary: expected one of {versions}, actual {data.get('primary')!r}")
    return Matrix(path, primary, releases)
