# SPDX-License-Identifier: BSD-3-Clause
"""Replay: pristine archive -> git workspace with one deterministic commit per patch.

Atomic: everything happens in a temporary folder beside the workspace, which is moved into
place only when every digest matched the lock. Idempotent: a clean workspace already made
from the same lock is left alone; a dirty or diverging one is refused unless ``force``.
"""

import shutil
import tempfile
from pathlib import Path

import git

from fa2patch.common.digest import sha256_file, tree_digest
from fa2patch.common.errors import CheckFailed, EnvironmentProblem, mismatch
from fa2patch.common.lockfile import Lock, normalize_name
from fa2patch.series import gitws
from fa2patch.series.extract import safe_extract, sdist_metadata
from fa2patch.series.fetch import fetch
from fa2patch.series.patches import PatchFile


def load_patches(lock: Lock, patches_dir: Path) -> list[tuple[Path, PatchFile]]:
    """Each locked patch, sha256-verified and parsed, in series order."""
    loaded = []
    for entry in lock.patches:
        path = patches_dir / entry.file
        if not path.is_file():
            raise CheckFailed(f"{path}: listed in {lock.path.name} but missing")
        actual = sha256_file(path)
        if actual != entry.sha256:
            raise CheckFailed(mismatch("sha256", str(path), entry.sha256, actual))
        try:
            loaded.append((path, PatchFile.parse(path.read_bytes().decode("utf-8", "surrogateescape"), str(path))))
        except ValueError as exc:
            raise CheckFailed(str(exc)) from exc
    return loaded


def workspace_state(workspace: Path, lock: Lock) -> str:
    """'absent', 'matching', or a reason why the workspace is dirty or diverging."""
    if not workspace.exists():
        return "absent"
    try:
        repo = gitws.open_repo(workspace)
    except EnvironmentProblem as exc:
        return str(exc)
    dirty = gitws.uncommitted_paths(repo)
    if dirty:
        return f"{workspace}: uncommitted changes ({len(dirty)} paths, first: {dirty[0].strip()})"
    recorded = gitws.recorded_series(repo)
    if recorded is None or recorded[0] != lock.series_fingerprint():
        return (
            f"{workspace}: made from another lock (series fingerprint)\n"
            f"  expected: {lock.series_fingerprint()}\n  actual:   {recorded and recorded[0]}"
            "\n  (export it first, or replay with --force)"
        )
    if recorded[1] != repo.head.commit.hexsha:
        return (
            f"{workspace}: commits since the last replay or export\n  expected HEAD: "
            f"{recorded[1]}\n  actual HEAD:   {repo.head.commit.hexsha}\n  (export them first, "
            "or replay with --force)"
        )
    digest = tree_digest(workspace)
    if digest != lock.final_digest():
        return mismatch("tree digest", str(workspace), lock.final_digest(), digest)
    return "matching"


def replay(
    lock: Lock,
    patches_dir: Path,
    workspace: Path,
    force: bool = False,
    sdist: Path | None = None,
    echo=lambda msg: None,
) -> str:
    """Build the workspace; return 'created', 'replaced' or 'unchanged'."""
    patches = load_patches(lock, patches_dir)  # fail on tampered patches before any work
    state = workspace_state(workspace, lock)
    if state == "matching" and not force:
        return "unchanged"
    if state not in ("absent", "matching") and not force:
        raise CheckFailed(
            f"refusing to replace the workspace: {state}\n  (use --force to "
            "discard it and replay from the pristine archive)"
        )
    archive = fetch(lock, sdist=sdist)

    workspace.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=workspace.parent, prefix=f".{workspace.name}.replay-"))
    try:
        _build(lock, archive, patches, tmp, echo)
        if workspace.exists():
            old = Path(tempfile.mkdtemp(dir=workspace.parent, prefix=f".{workspace.name}.old-"))
            workspace.rename(old / "ws")
            tmp.rename(workspace)
            shutil.rmtree(old)
            return "replaced"
        tmp.rename(workspace)
        return "created"
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _check_baseline_fields(lock: Lock, archive: Path, tree: Path, files: int) -> None:
    """[baseline] project, version and files against the extracted archive (sha256 and size were
    checked by fetch, top_dir by the extraction, tree_digest right after this)."""
    b, where = lock.baseline, f"{lock.path} [baseline] vs {archive}"
    meta = sdist_metadata(tree)
    if normalize_name(meta["Name"]) != normalize_name(b.project):
        raise CheckFailed(mismatch("project (the archive's PKG-INFO Name)", where, meta["Name"], b.project))
    if meta["Version"] != b.version:
        raise CheckFailed(mismatch("version (the archive's PKG-INFO Version)", where, meta["Version"], b.version))
    if files != b.files:
        raise CheckFailed(mismatch("files (extracted files and links)", where, files, b.files))


def _build(lock: Lock, archive: Path, patches, tmp: Path, echo) -> None:
    b = lock.baseline
    echo(f"extract {archive.name}")
    files = safe_extract(archive, b.top_dir, tmp)
    _check_baseline_fields(lock, archive, tmp, files)
    digest = tree_digest(tmp)
    if digest != b.tree_digest:
        raise CheckFailed(
            mismatch("extracted tree digest", str(archive), b.tree_digest, digest)
            + f"\n  (expected: {lock.path} [baseline] tree_digest)"
        )
    repo = gitws.init_repo(tmp)
    gitws.commit_all(repo, f"{b.project} {b.version} (pristine)\n\n{gitws.PRISTINE_TRAILER}\n", lock.identity)
    for (path, patch), entry in zip(patches, lock.patches, strict=True):
        echo(f"apply {path.name}")
        diff_file = tmp / ".git" / "fa2patch-apply.diff"
        diff_file.write_bytes(patch.diff.encode("utf-8", "surrogateescape"))
        try:
            # git apply never fuzzes: every context line must match exactly.
            repo.git.apply("--index", "--whitespace=nowarn", "-p1", str(diff_file))
        except git.GitCommandError as exc:
            raise CheckFailed(
                f"{path}: does not apply cleanly to the tree after the previous patches:\n{exc.stderr.strip()}"
            ) from exc
        finally:
            diff_file.unlink()
        digest = tree_digest(tmp)
        if digest != entry.tree_digest:
            raise CheckFailed(mismatch("tree digest after the patch", str(path), entry.tree_digest, digest))
        gitws.commit_all(repo, patch.message, lock.identity)
    gitws.record_series(repo, lock.series_fingerprint())
