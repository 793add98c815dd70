# SPDX-License-Identifier: BSD-3-Clause
"""The supported vLLM releases (packaging/vllm-releases.toml): one entry per release line, each
with its sha256-pinned sdist, the torch it pins and whether a plain `pip install vllm==X` runs on a
V100; ``primary`` is the release whose torch the README's first command builds and packages for.
Read by build, package, doctor --vllm, the plugin's build record, the tests and the GPU lab."""

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from fa2patch.common.errors import EnvironmentProblem
from fa2patch.common.project import Project
from fa2patch.common.values import whole_number

MATRIX = Path("packaging") / "vllm-releases.toml"
RELEASE_KEYS = {"version", "line", "torch", "torch_cuda", "v100_from_index", "sdist", "wheel_files"}
PINNED_FILE_KEYS = {"file", "sha256", "size"}
TOP_KEYS = {"format", "primary", "release"}
SHA256 = r"[0-9a-f]{64}"
# A release number, MAJOR.MINOR first (Release.torch_minor reads them): 0.19.1, 0.10.0rc1, 0.8.5.post1.
RELEASE = r"[0-9]+\.[0-9]+(\.[0-9A-Za-z.]+)?"


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


def _text(raw: dict, key: str, where: str, pattern: str = r"[\s\S]+", what: str = "a non-empty string") -> str:
    value = raw[key]
    if not isinstance(value, str) or not re.fullmatch(pattern, value):
        raise EnvironmentProblem(f"{where}.{key}: expected {what}, actual {value!r}")
    return value


def _pinned(raw, where: str) -> Pinned:
    if not isinstance(raw, dict) or set(raw) != PINNED_FILE_KEYS:
        raise EnvironmentProblem(f"{where}: expected {{file, sha256, size}}, actual {raw!r}")
    size = raw["size"]
    if not whole_number(size, 1):
        raise EnvironmentProblem(f"{where}.size: expected a positive integer (bytes), actual {size!r}")
    return Pinned(_text(raw, "file", where), _text(raw, "sha256", where, SHA256, "64 lowercase hex digits"), size)


def _wheel_files(extra, where: str) -> tuple[Pinned | None, dict[str, str]]:
    """The wheel and its {path: sha256} of a release's optional wheel_files table."""
    if not isinstance(extra, dict):
        raise EnvironmentProblem(f"{where}: expected a table {{wheel, files}}, actual {extra!r}")
    if not extra:
        return None, {}
    files = extra.get("files")
    if set(extra) != {"wheel", "files"} or not isinstance(files, dict) or not files:
        raise EnvironmentProblem(f"{where}: expected {{wheel, files}} with files a non-empty table, actual {extra!r}")
    for name, sha in files.items():
        if not isinstance(sha, str) or not re.fullmatch(SHA256, sha):
            raise EnvironmentProblem(f"{where}.files[{name!r}]: expected 64 lowercase hex digits, actual {sha!r}")
    return _pinned(extra["wheel"], f"{where}.wheel"), dict(files)


def _release(raw, where: str) -> Release:
    if not isinstance(raw, dict):
        raise EnvironmentProblem(f"{where}: expected a table, actual {raw!r}")
    unknown = sorted(set(raw) - RELEASE_KEYS)
    missing = sorted(RELEASE_KEYS - {"wheel_files"} - set(raw))
    if unknown or missing:
        raise EnvironmentProblem(f"{where}: unknown key(s) {unknown}, missing key(s) {missing}")
    if not isinstance(raw["v100_from_index"], bool):
        raise EnvironmentProblem(f"{where}.v100_from_index: expected true or false, actual {raw['v100_from_index']!r}")
    wheel, files = _wheel_files(raw.get("wheel_files", {}), f"{where}.wheel_files")
    return Release(
        version=_text(raw, "version", where, RELEASE, "a release number such as 0.19.1"),
        line=_text(raw, "line", where),
        torch=_text(raw, "torch", where, RELEASE, "a release number such as 2.10.0"),
        torch_cuda=_text(raw, "torch_cuda", where, r"[0-9]+\.[0-9]+", "MAJOR.MINOR such as 12.8"),
        v100_from_index=raw["v100_from_index"],
        sdist=_pinned(raw["sdist"], f"{where}.sdist"),
        wheel=wheel,
        wheel_files=files,
    )


def load(project: Project) -> Matrix:
    """The matrix, checked: known keys and the type of every value, one entry per version, the
    primary among them. Anything else is refused, naming the file, the key, expected and actual."""
    path = project.root / MATRIX
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise EnvironmentProblem(f"{path}: cannot read the supported vLLM releases: {exc}") from exc
    if type(data.get("format")) is not int or data["format"] != 1:
        raise EnvironmentProblem(f"{path}: format: expected 1, actual {data.get('format')!r}")
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise EnvironmentProblem(f"{path}: unknown key(s) {unknown}, expected only {sorted(TOP_KEYS)}")
    listed = data.get("release", [])
    if not isinstance(listed, list):
        raise EnvironmentProblem(f"{path}: release: expected an array of tables ([[release]]), actual {listed!r}")
    releases = tuple(_release(r, f"{path}: release[{i}]") for i, r in enumerate(listed))
    versions = [r.version for r in releases]
    if len(set(versions)) != len(versions):
        raise EnvironmentProblem(f"{path}: a version is listed twice: {versions}")
    primary = next((r for r in releases if r.version == data.get("primary")), None)
    if primary is None:
        raise EnvironmentProblem(f"{path}: primary: expected one of {versions}, actual {data.get('primary')!r}")
    return Matrix(path, primary, releases)
