"""check: the lock, patches/, the cached archive and the workspace agree."""

from dataclasses import dataclass
from pathlib import Path

from .digest import sha256_file
from .errors import Fa2PatchError, mismatch
from .export import render_series
from .fetch import cached_archive
from .lockfile import Lock
from .replay import workspace_state


@dataclass
class Finding:
    item: str
    ok: bool
    detail: str


def check(lock: Lock, patches_dir: Path, workspace: Path) -> list[Finding]:
    findings = []
    listed = {e.file for e in lock.patches}
    for entry in lock.patches:
        path = patches_dir / entry.file
        if not path.is_file():
            findings.append(Finding(entry.file, False, f"{path}: listed in the lock but missing"))
            continue
        actual = sha256_file(path)
        findings.append(Finding(entry.file, actual == entry.sha256,
                                "sha256 matches the lock" if actual == entry.sha256
                                else mismatch("sha256", str(path), entry.sha256, actual)))
    for extra in sorted(p.name for p in patches_dir.glob("*.patch") if p.name not in listed):
        findings.append(Finding(extra, False, f"{patches_dir / extra}: not listed in {lock.path.name}"))

    archive = cached_archive(lock)
    if archive.exists():
        actual = sha256_file(archive)
        findings.append(Finding("archive", actual == lock.baseline.sha256,
                                f"{archive}: sha256 matches" if actual == lock.baseline.sha256
                                else mismatch("sha256", str(archive), lock.baseline.sha256, actual)))
    else:
        findings.append(Finding("archive", True, f"{archive}: not fetched yet (run fetch)"))

    if not workspace.exists():
        findings.append(Finding("workspace", True, f"{workspace}: absent (run replay)"))
        return findings
    state = workspace_state(workspace, lock)
    findings.append(Finding("workspace", state == "matching",
                            f"{workspace}: clean, made from this lock, tree digest matches"
                            if state == "matching" else state))
    try:
        rendered = render_series(lock, workspace)
    except Fa2PatchError as exc:
        findings.append(Finding("workspace series", False, str(exc)))
        return findings
    names = [name for name, _, _ in rendered]
    if names != [e.file for e in lock.patches]:
        findings.append(Finding("workspace series", False, mismatch(
            "patch list", str(workspace), [e.file for e in lock.patches], names)))
    for (name, data, _), entry in zip(rendered, lock.patches):
        path = patches_dir / entry.file
        same = path.is_file() and path.read_bytes() == data
        findings.append(Finding(f"export {name}", same,
                                "workspace commit exports to the same bytes" if same else
                                f"{path}: differs from what the workspace exports (run export)"))
    return findings
