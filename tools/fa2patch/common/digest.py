# SPDX-License-Identifier: BSD-3-Clause
"""Content digests: sha256 of a file, and the tree digest recorded in baseline.lock.

The tree digest is sha256 over one line per file, sorted by path:
``<mode> <sha256 of content> <path>\\n`` with mode 100644, 100755 or 120000 (a symlink,
whose "content" is its target). Directories do not count. It can be computed from a
directory on disk or from a git commit, and both give the same value for the same tree.
"""

import hashlib
import os
import stat
from pathlib import Path

CHUNK = 1 << 20


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _digest_lines(entries) -> str:
    h = hashlib.sha256()
    for path, mode, content_sha in sorted(entries, key=lambda e: e[0].encode()):
        h.update(f"{mode} {content_sha} {path}\n".encode())
    return "sha256:" + h.hexdigest()


def tree_digest(root: Path, exclude=(".git",)) -> str:
    """Digest of the files below ``root`` (names in ``exclude`` are skipped at every level)."""
    root = Path(root)
    entries = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in exclude]
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            if name in exclude:
                continue
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                entries.append((rel, "120000", sha256_bytes(os.readlink(full).encode())))
            elif stat.S_ISREG(st.st_mode):
                mode = "100755" if st.st_mode & 0o111 else "100644"
                entries.append((rel, mode, sha256_file(Path(full))))
    return _digest_lines(entries)


def git_tree_digest(repo, rev: str) -> str:
    """The same digest, computed from the objects of commit ``rev`` in a gitpython Repo."""
    listing = repo.git.ls_tree("-r", "-z", "--full-tree", rev)
    items = []
    for record in filter(None, listing.split("\0")):
        meta, path = record.split("\t", 1)
        mode, kind, sha = meta.split()
        if kind != "blob":
            raise ValueError(f"{rev}:{path}: unsupported git object kind {kind}")
        items.append((path, mode, sha))
    # gitpython keeps one `git cat-file --batch` process for all the blobs.
    entries = [(path, mode, sha256_bytes(repo.odb.stream(bytes.fromhex(sha)).read())) for path, mode, sha in items]
    return _digest_lines(entries)
