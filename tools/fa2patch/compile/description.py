# SPDX-License-Identifier: BSD-3-Clause
"""The patched tree's build description, ``fa2patch-build.toml``: the extension's name, host sources,
defines and include folders, and per architecture its CUDA sources, defines and the kernels that must
use tensor cores. `fa2patch build`, `package --vllm-src` and vLLM's CMake route all read it here."""

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from fa2patch.common.errors import CheckFailed, EnvironmentProblem

DESCRIPTION = "fa2patch-build.toml"


@dataclass
class ArchSpec:
    cuda_sources: list[str]
    defines: list[str]
    tensor_core_kernels: list[str]
    lab: bool = False


@dataclass
class BuildDescription:
    path: Path
    name: str
    include_dirs: list[str]
    defines: list[str]
    host_sources: list[str]
    archs: dict[str, ArchSpec] = field(default_factory=dict)
    system_include_dirs: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, tree: Path) -> "BuildDescription":
        path = Path(tree) / DESCRIPTION
        if not path.is_file():
            raise EnvironmentProblem(f"{path}: no build description in the workspace (is it replayed with patch 0001?)")
        try:
            data = tomllib.loads(path.read_text())
            groups = data.get("sources", {})
            ext = data["extension"]
            archs = {
                a: ArchSpec(
                    expand_sources(path, f"[arch.{a}] cuda_sources", spec.get("cuda_sources", []), groups),
                    spec.get("defines", []),
                    spec.get("tensor_core_kernels", []),
                    bool(spec.get("lab", False)),
                )
                for a, spec in data.get("arch", {}).items()
            }
            desc = cls(
                path,
                ext["name"],
                ext["include_dirs"],
                ext.get("defines", []),
                expand_sources(path, "[extension] host_sources", ext["host_sources"], groups),
                archs,
                ext.get("system_include_dirs", []),
            )
        except (tomllib.TOMLDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise CheckFailed(f"{path}: malformed build description: {exc!r}") from exc
        grouped = [f for files in groups.values() for f in files]  # setup.py reads the groups too
        for src in desc.host_sources + [s for a in archs.values() for s in a.cuda_sources] + grouped:
            if not (Path(tree) / src).is_file():
                raise CheckFailed(f"{path}: lists {src}, which is not in the tree")
        return desc

    def arch(self, arch: str) -> ArchSpec:
        if arch not in self.archs:
            raise EnvironmentProblem(
                f"{self.path}: unsupported --arch\n  expected: one of "
                f"{', '.join(sorted(self.archs))}\n  actual:   {arch}"
            )
        return self.archs[arch]


def expand_sources(path: Path, where: str, entries: list[str], groups: dict[str, list[str]]) -> list[str]:
    """A source list with each "@<group>" entry replaced by the files of [sources].<group>
    (the format is described in the build description's own comments)."""
    files = []
    for entry in entries:
        if not entry.startswith("@"):
            files.append(entry)
            continue
        group = groups.get(entry[1:])
        if group is None:
            raise CheckFailed(
                f"{path}: {where} names an unknown source group\n  expected: one of "
                f"{', '.join('@' + g for g in sorted(groups)) or '(no [sources] groups)'}"
                f"\n  actual:   {entry}"
            )
        nested = [f for f in group if f.startswith("@")]
        if nested:
            raise CheckFailed(
                f"{path}: [sources] {entry[1:]} lists {nested[0]}\n  expected: file paths "
                "(a group does not include another group)\n  actual:   a group reference"
            )
        files += group
    twice = sorted({f for f in files if files.count(f) > 1})
    if twice:
        raise CheckFailed(
            f"{path}: {where} lists a file more than once\n  expected: each file once\n"
            f"  actual:   {', '.join(twice)} repeated (after expanding source groups)"
        )
    return files
