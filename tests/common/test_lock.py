# SPDX-License-Identifier: BSD-3-Clause
"""baseline.lock is checked field by field: a changed value in any field fails replay, check,
doctor or build with a message naming the lock, the field, and the expected and actual values."""

import hashlib
import tarfile
import tomllib

import pytest

from helpers import MINI_FILES, REPO, file_member, make_tar, reference_digest

# field -> (old text, new text, command, exit code, words the error must contain)
FLIPS = {
    "format": ("format = 2", "format = 3", "replay", 1, ["format mismatch", "expected: 2", "actual:   3"]),
    "baseline.project": ('project = "mini"', 'project = "minj"', "replay", 1, ["[baseline] top_dir", "minj"]),
    "baseline.version": (
        'version = "1.0"',
        'version = "1.1"',
        "replay",
        1,
        ["[baseline] top_dir", "-1.1", "actual:   mini-1.0"],
    ),
    "baseline.archive": (
        'archive = "mini-1.0.tar.gz"',
        'archive = "mini-1.0.tar.gx"',
        "replay",
        1,
        ["[baseline] archive", "expected: mini-1.0.tar.gz", "actual:   mini-1.0.tar.gx"],
    ),
    "baseline.top_dir": ('top_dir = "mini-1.0"', 'top_dir = "mini-1.1"', "replay", 1, ["[baseline] top_dir"]),
    "baseline.sha256": (None, None, "replay", 1, ["sha256 mismatch"]),
    "baseline.size": (None, None, "replay", 1, ["[baseline] size"]),
    "baseline.tree_digest": (None, None, "replay", 1, ["extracted tree digest mismatch"]),
    "baseline.files": (None, None, "replay", 1, ["files (extracted files and links) mismatch"]),
    "toolchain.cuda": ('cuda = "12.8"', 'cuda = "12.9"', "check", 1, ["CUDA release", "12.9.x", "actual:   12.8."]),
    "toolchain.torch": (
        'torch = "2.10.0"',
        'torch = "2.10.9"',
        "check",
        1,
        ["pyproject.toml", "torch==2.10.9", "torch==2.10.0"],
    ),
    "toolchain.wheels": (
        "nvidia-cuda-cccl-cu12==12.8.90",
        "nvidia-cuda-cccl-cu12==12.8.91",
        "check",
        1,
        ["pyproject.toml", "nvidia-cuda-cccl-cu12==12.8.91", "nvidia-cuda-cccl-cu12==12.8.90"],
    ),
}
# Checked elsewhere: the toolchain pins of what is installed (test_doctor.py), the patch entries
# (test_replay_export.py: a changed sha256, tree_digest or file name fails replay and check).
ELSEWHERE = {"toolchain.clang", "toolchain.fatbinary_wheel", "patches.file", "patches.sha256", "patches.tree_digest"}


def test_every_field_of_the_real_lock_has_a_test():
    lock = tomllib.loads((REPO / "baseline.lock").read_text())
    fields = {"format"} | {f"{t}.{k}" for t in ("baseline", "toolchain") for k in lock[t]}
    fields |= {f"patches.{k}" for k in lock["patches"][0]}
    assert fields == set(FLIPS) | ELSEWHERE


def _flip_value(text: str, key: str) -> tuple[str, str]:
    """The line `key = value` and the same line with the value's last character changed."""
    line = next(line for line in text.splitlines() if line.startswith(f"{key} = "))
    last = line.rstrip('"')[-1]
    new_last = {"9": "8"}.get(last, "9") if last.isdigit() else ("0" if last != "0" else "1")
    i = len(line.rstrip('"')) - 1
    return line, line[:i] + new_last + line[i + 1 :]


@pytest.mark.parametrize("field", sorted(FLIPS))
def test_a_changed_field_fails_naming_it(mini, field):
    old, new, command, rc, words = FLIPS[field]
    mini.run("fetch", "--sdist", str(mini.archive))
    lock = mini.root / "baseline.lock"
    text = lock.read_text()
    if old is None:
        old, new = _flip_value(text, field.split(".")[1])
    assert text.count(old) == 1, (old, text)
    lock.write_text(text.replace(old, new))
    proc = mini.run(command, check_rc=rc)
    output = proc.stdout + proc.stderr
    for word in words:
        assert word in output, (word, output)
    assert str(lock) in output or str(mini.root / "pyproject.toml") in output


def test_unknown_fields_are_refused(mini):
    lock = mini.root / "baseline.lock"
    original = lock.read_text()
    lock.write_text(original + '\n[workspace]\nname = "someone"\n')
    proc = mini.run("check", check_rc=1)
    assert "unknown top-level field(s) workspace" in proc.stderr and str(lock) in proc.stderr
    lock.write_text(original.replace("files = ", "file_count = 1\nfiles = "))
    proc = mini.run("check", check_rc=1)
    assert "[baseline] unknown field(s) file_count" in proc.stderr


def test_pkg_info_must_name_the_locked_project_and_version(mini, tmp_path):
    """An archive whose top folder and name fit the lock but whose PKG-INFO names another
    version (everything else re-locked to it) fails replay on the version."""
    files = {**MINI_FILES, "PKG-INFO": (0o644, b"Metadata-Version: 2.1\nName: mini\nVersion: 1.0.1\n")}
    archive = tmp_path / "other" / "mini-1.0.tar.gz"
    archive.parent.mkdir()
    top = tarfile.TarInfo("mini-1.0")
    top.type, top.mode = tarfile.DIRTYPE, 0o755
    make_tar(archive, [top] + [file_member(f"mini-1.0/{p}", d, m) for p, (m, d) in files.items()])
    lock = mini.root / "baseline.lock"
    locked = tomllib.loads(lock.read_text())["baseline"]
    text = lock.read_text().replace(locked["sha256"], hashlib.sha256(archive.read_bytes()).hexdigest())
    text = text.replace(f"size = {locked['size']}", f"size = {archive.stat().st_size}")
    lock.write_text(text.replace(locked["tree_digest"], reference_digest(files)))
    proc = mini.run("replay", "--sdist", str(archive), check_rc=1)
    assert "version (the archive's PKG-INFO Version) mismatch" in proc.stderr
    assert "expected: 1.0.1" in proc.stderr and "actual:   1.0" in proc.stderr
    assert not mini.workspace.exists()


def test_the_real_lock_is_consistent_with_its_archive(real_workspace, real_project):
    """Replay of the real series passed every check above (the fixture replays it); check too."""
    proc = real_project.run("check")
    assert "toolchain pins" in proc.stdout and "FAIL" not in proc.stdout
