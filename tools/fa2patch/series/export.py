# SPDX-License-Identifier: BSD-3-Clause
"""Export: workspace commits -> patches/NNNN-<slug>.patch, and the lock's [[patches]] list.

Deterministic: the same commits always give byte-identical files. A commit that changes
nothing is refused (its patch would have no diff). Files are written only
after every patch rendered, and stale patch files are removed, so patches/ always matches
the lock that is written with it.
"""

import itertools
from pathlib import Path

from fa2patch.common.digest import git_tree_digest, sha256_bytes
from fa2patch.common.errors import CheckFailed, mismatch
from fa2patch.common.lockfile import Lock, PatchEntry
from fa2patch.series import gitws
from fa2patch.series.patches import PatchFile, patch_name


def render_series(lock: Lock, workspace: Path) -> list[tuple[str, bytes, str]]:
    """(file name, bytes, tree digest after it) for each commit after the pristine import."""
    repo = gitws.open_repo(workspace)
    dirty = gitws.uncommitted_paths(repo)
    if dirty:
        raise CheckFailed(
            f"{workspace}: uncommitted changes, commit them first ({len(dirty)} paths, first: {dirty[0].strip()})"
        )
    commits = gitws.series_commits(repo)
    pristine = git_tree_digest(repo, commits[0].hexsha)
    if pristine != lock.baseline.tree_digest:
        raise CheckFailed(
            mismatch("pristine tree digest", f"{workspace} (root commit)", lock.baseline.tree_digest, pristine)
        )
    rendered = []
    for i, (parent, commit) in enumerate(itertools.pairwise(commits), start=1):
        patch = PatchFile.from_commit(gitws.commit_message(commit), gitws.diff(repo, parent.hexsha, commit.hexsha))
        if not patch.subject:
            raise CheckFailed(f"{workspace}: commit {commit.hexsha[:12]} has an empty subject")
        if not patch.diff.strip():
            raise CheckFailed(
                f"{workspace}: commit {commit.hexsha[:12]} ({patch.subject!r}) changes no "
                "file: it would export as a patch without a diff, which replay cannot "
                "apply; drop it or squash it into a neighbour"
            )
        data = patch.render().encode("utf-8", "surrogateescape")
        rendered.append((patch_name(i, patch.subject), data, git_tree_digest(repo, commit.hexsha)))
    return rendered


def export(lock: Lock, workspace: Path, patches_dir: Path) -> list[str]:
    """Write the series and the lock; return the names of the files that changed."""
    rendered = render_series(lock, workspace)
    patches_dir.mkdir(parents=True, exist_ok=True)
    changed = []
    wanted = {name for name, _, _ in rendered}
    for stale in sorted(patches_dir.glob("*.patch")):
        if stale.name not in wanted:
            stale.unlink()
            changed.append(stale.name)
    for name, data, _ in rendered:
        path = patches_dir / name
        if not path.exists() or path.read_bytes() != data:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
            changed.append(name)
    lock.write_patches([PatchEntry(name, sha256_bytes(data), digest) for name, data, digest in rendered])
    gitws.record_series(gitws.open_repo(workspace), lock.series_fingerprint())
    return changed
