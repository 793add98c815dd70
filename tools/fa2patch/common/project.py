# SPDX-License-Identifier: BSD-3-Clause
"""Where things live: the project root (the folder holding baseline.lock) and its paths."""

import os
from dataclasses import dataclass
from pathlib import Path

from fa2patch.common.errors import EnvironmentProblem

LOCK_NAME = "baseline.lock"


def scratch_dir(root: Path | None = None) -> Path:
    """Where third-party kernels are compiled for their SASS (never committed; docs/anchor-sources.md):
    $FA2PATCH_SCRATCH, else work/scratch in the project (ignored by git)."""
    if os.environ.get("FA2PATCH_SCRATCH"):
        return Path(os.environ["FA2PATCH_SCRATCH"])
    return (root or Project.find().root) / "work" / "scratch"


def user_cache_dir() -> Path:
    """The archive cache: $FA2PATCH_CACHE, else $XDG_CACHE_HOME/fa2patch, else ~/.cache/fa2patch."""
    if os.environ.get("FA2PATCH_CACHE"):
        return Path(os.environ["FA2PATCH_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fa2patch"


@dataclass(frozen=True)
class Project:
    root: Path

    @classmethod
    def find(cls, start: Path | None = None) -> "Project":
        """The nearest folder at or above ``start`` (or $FA2PATCH_ROOT) holding baseline.lock."""
        if os.environ.get("FA2PATCH_ROOT"):
            root = Path(os.environ["FA2PATCH_ROOT"]).resolve()
            if not (root / LOCK_NAME).is_file():
                raise EnvironmentProblem(f"{root / LOCK_NAME}: not found ($FA2PATCH_ROOT points here)")
            return cls(root)
        here = (start or Path.cwd()).resolve()
        for candidate in [here, *here.parents]:
            if (candidate / LOCK_NAME).is_file():
                return cls(candidate)
        raise EnvironmentProblem(
            f"{here}: no {LOCK_NAME} here or in any parent folder; run fa2patch inside the project or set FA2PATCH_ROOT"
        )

    @property
    def lock_path(self) -> Path:
        return self.root / LOCK_NAME

    @property
    def patches_dir(self) -> Path:
        return self.root / "patches"

    @property
    def default_workspace(self) -> Path:
        return self.root / "work" / "flash-attn"

    def build_dir(self, arch: str) -> Path:
        return self.root / "build" / arch

    @property
    def schemas_path(self) -> Path:
        return self.root / "schemas" / "vllm_fa2_ops.toml"

    @property
    def budgets_path(self) -> Path:
        return self.root / "budgets.toml"

    @property
    def pyproject_path(self) -> Path:
        return self.root / "pyproject.toml"
