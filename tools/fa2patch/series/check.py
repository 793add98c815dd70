# SPDX-License-Identifier: BSD-3-Clause
"""check: the lock, patches/, pyproject.toml's pins, the cached archive and the workspace agree."""

import tomllib
from dataclasses import dataclass
from pathlib import Path

from fa2patch.common.digest import sha256_file
from fa2patch.common.errors import CheckFailed, Fa2PatchError, mismatch
from fa2patch.common.lockfile import PIN_RE, Lock, split_pin
from fa2patch.series.export import render_series
from fa2patch.series.fetch import cached_archive, verify_archive
from fa2patch.series.replay import workspace_state


@dataclass
class Finding:
    item: str
    ok: bool
    detail: str


def toolchain_pins(lock: Lock, pyproject: Path) -> Finding:
    """The lock's pinned packages (torch and the CUDA wheels) are exactly the `==` pins of
    pyproject.toml's `build` extra, which is what ci/install.sh installs."""
    if not pyproject.is_file():
        return Finding("toolchain pins", False, f"{pyproject}: not found (it holds the `build` extra)")
    try:
        extra = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["build"]
    except (tomllib.TOMLDecodeError, KeyError) as exc:
        return Finding("toolchain pins", False, f"{pyproject}: no [project.optional-dependencies] build list ({exc!r})")
    pinned = dict(split_pin(r.replace(" ", "")) for r in extra if PIN_RE.match(r.replace(" ", "")))
    wanted = lock.toolchain.pins()
    if pinned != wanted:
        return Finding(
            "toolchain pins",
            False,
            mismatch(
                f"pinned packages of the `build` extra and {lock.path.name} [toolchain]",
                str(pyproject),
                _pins_text(wanted),
                _pins_text(pinned),
            ),
        )
    return Finding("toolchain pins", True, f"{pyproject}: the `build` extra pins what the lock pins")


def _pins_text(pins: dict) -> str:
    return ", ".join(f"{n}=={v}" for n, v in sorted(pins.items()))


def check(lock: Lock, patches_dir: Path, workspace: Path, pyproject: Path) -> list[Finding]:
    findings = []
    listed = {e.file for e in lock.patches}
    for entry in lock.patches:
        path = patches_dir / entry.file
        if not path.is_file():
            findings.append(Finding(entry.file, False, f"{path}: listed in the lock but missing"))
            continue
        actual = sha256_file(path)
        findings.append(
            Finding(
                entry.file,
                actual == entry.sha256,
                "sha256 matches the lock"
                if actual == entry.sha256
                else mismatch("sha256", str(path), entry.sha256, actual),
            )
        )
    for extra in sorted(p.name for p in patches_dir.glob("*.patch") if p.name not in listed):
        findings.append(Finding(extra, False, f"{patches_dir / extra}: not listed in {lock.path.name}"))

    findings.append(toolchain_pins(lock, pyproject))
    archive = cached_archive(lock)
    if archive.exists():
        try:
            verify_archive(archive, lock)
            findings.append(Finding("archive", True, f"{archive}: sha256 and size match"))
        except CheckFailed as exc:
            findings.append(Finding("archive", False, str(exc)))
    else:
        findings.append(Finding("archive", True, f"{archive}: not fetched yet (run fetch)"))

    if not workspace.exists():
        findings.append(Finding("workspace", True, f"{workspace}: absent (run replay)"))
        return findings
    state = workspace_state(workspace, lock)
    findings.append(
        Finding(
            "workspace",
            state == "matching",
            f"{workspace}: clean, made from this lock, tree digest matches" if state == "matching" else state,
        )
    )
    try:
        rendered = render_series(lock, workspace)
    except Fa2PatchError as exc:
        findings.append(Finding("workspace series", False, str(exc)))
        return findings
    names = [name for name, _, _ in rendered]
    if names != [e.file for e in lock.patches]:
        findings.append(
            Finding(
                "workspace series", False, mismatch("patch list", str(workspace), [e.file for e in lock.patches], names)
            )
        )
    # strict=False: a different patch list is reported just above; the patches at the same places
    # are still compared, each by its own bytes.
    for (name, data, _), entry in zip(rendered, lock.patches, strict=False):
        path = patches_dir / entry.file
        same = path.is_file() and path.read_bytes() == data
        findings.append(
            Finding(
                f"export {name}",
                same,
                "workspace commit exports to the same bytes"
                if same
                else f"{path}: differs from what the workspace exports (run export)",
            )
        )
    return findings
