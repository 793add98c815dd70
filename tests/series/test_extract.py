# SPDX-License-Identifier: BSD-3-Clause
import tarfile

import pytest

from fa2patch.common.digest import tree_digest
from fa2patch.common.errors import CheckFailed
from fa2patch.series.extract import safe_extract
from helpers import MINI_FILES, file_member, make_tar, reference_digest


def _dir(name):
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, 0o755
    return info


def _link(name, target, kind=tarfile.SYMTYPE):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def test_good_archive_extracts_with_normalized_modes(tmp_path):
    members = [_dir("top")] + [file_member(f"top/{p}", d, m | 0o020) for p, (m, d) in MINI_FILES.items()]
    archive = make_tar(tmp_path / "a.tar.gz", members)
    n = safe_extract(archive, "top", tmp_path / "out")
    assert n == len(MINI_FILES)
    assert (tmp_path / "out" / "tools/run.sh").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "out" / "README").stat().st_mode & 0o777 == 0o644
    assert tree_digest(tmp_path / "out") == reference_digest(MINI_FILES)


def test_link_inside_tree_is_allowed(tmp_path):
    archive = make_tar(tmp_path / "a.tar.gz", [_dir("top"), file_member("top/a/x", b"x"), _link("top/a/l", "../a/x")])
    safe_extract(archive, "top", tmp_path / "out")
    assert (tmp_path / "out/a/l").read_bytes() == b"x"


@pytest.mark.parametrize(
    "member, why",
    [
        (file_member("top/../x", b"evil"), "'..' component"),
        (file_member("/tmp/abs-evil", b"evil"), "absolute path"),
        (file_member("other/x", b"evil"), "outside the top folder"),
        (_link("top/l", "../../escape"), "escapes the tree"),
        (_link("top/sub/l", "../.."), "escapes the tree"),
        (_link("top/l", "/etc/passwd"), "escapes the tree"),
        (_link("top/h", "top/README", tarfile.LNKTYPE), "hard link"),
        (_link("top/dev", "", tarfile.CHRTYPE), "device file"),
        (_link("top/fifo", "", tarfile.FIFOTYPE), "FIFO"),
    ],
)
def test_crafted_archives_are_refused_before_anything_is_written(tmp_path, member, why):
    archive = make_tar(tmp_path / "a.tar.gz", [_dir("top"), file_member("top/README", b"ok"), member])
    with pytest.raises(CheckFailed) as exc:
        safe_extract(archive, "top", tmp_path / "out")
    assert why in str(exc.value) and str(archive) in str(exc.value)
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "x").exists() and not (tmp_path / "escape").exists()
