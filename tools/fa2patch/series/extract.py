# SPDX-License-Identifier: BSD-3-Clause
"""Safe extraction of the baseline archive.

Every member is checked before anything is written: no absolute paths, no ``..``, nothing
outside the archive's single top folder, no device files or FIFOs, no hard links, and no
symbolic link whose target leaves the tree. Files are written with normalized modes (0644,
or 0755 when any execute bit is set) so that the tree digest does not depend on the umask.
"""

import posixpath
import tarfile
from email.parser import HeaderParser
from pathlib import Path

from fa2patch.common.errors import CheckFailed


def _unsafe(archive: Path, member: str, why: str) -> CheckFailed:
    return CheckFailed(f"{archive}: refusing unsafe archive member {member!r}: {why}")


def _checked_relpath(archive: Path, m: tarfile.TarInfo, top_dir: str) -> str:
    """Path of ``m`` below ``top_dir`` ('' for the top folder itself)."""
    name = m.name
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise _unsafe(archive, name, "absolute path")
    parts = name.split("/")
    if ".." in parts:
        raise _unsafe(archive, name, "'..' component")
    norm = posixpath.normpath(name)
    if norm != top_dir and not norm.startswith(top_dir + "/"):
        raise _unsafe(archive, name, f"outside the top folder {top_dir!r}")
    return "" if norm == top_dir else norm[len(top_dir) + 1 :]


def safe_extract(archive: Path, top_dir: str, dest: Path) -> int:
    """Extract the contents of ``top_dir`` inside ``archive`` into ``dest``; return the file count."""
    archive, dest = Path(archive), Path(dest)
    with tarfile.open(archive, "r:*") as tar:
        members = tar.getmembers()
        plan = []
        for m in members:
            rel = _checked_relpath(archive, m, top_dir)
            if m.isdev() or m.isfifo():
                raise _unsafe(archive, m.name, "device file or FIFO")
            if m.islnk():
                raise _unsafe(archive, m.name, "hard link")
            if m.issym():
                target = m.linkname
                resolved = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
                if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
                    raise _unsafe(archive, m.name, f"symbolic link escapes the tree ({target!r})")
            elif not (m.isfile() or m.isdir()):
                raise _unsafe(archive, m.name, f"unsupported member type {m.type!r}")
            plan.append((m, rel))
        dest.mkdir(parents=True, exist_ok=True)
        files = 0
        for m, rel in plan:
            out = dest / rel if rel else dest
            if m.isdir():
                out.mkdir(parents=True, exist_ok=True)
                continue
            out.parent.mkdir(parents=True, exist_ok=True)
            if out.is_symlink() or out.exists():
                raise _unsafe(archive, m.name, "duplicate member")
            if m.issym():
                out.symlink_to(m.linkname)
            else:
                data = tar.extractfile(m)
                if data is None:  # only regular files reach here, and they have data
                    raise _unsafe(archive, m.name, "no data for a regular file")
                with data as src, open(out, "wb") as f:
                    while chunk := src.read(1 << 20):
                        f.write(chunk)
                out.chmod(0o755 if m.mode & 0o111 else 0o644)
            files += 1
    return files


def sdist_metadata(tree: Path) -> dict[str, str]:
    """Name and Version from the PKG-INFO at the top of an extracted sdist."""
    path = Path(tree) / "PKG-INFO"
    if not path.is_file():
        raise CheckFailed(f"{path}: the archive has no PKG-INFO at its top (not an sdist?)")
    headers = HeaderParser().parsestr(path.read_text(errors="replace"), headersonly=True)
    return {"Name": headers.get("Name", ""), "Version": headers.get("Version", "")}
