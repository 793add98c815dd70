# SPDX-License-Identifier: BSD-3-Clause
import os

from fa2patch.common.digest import git_tree_digest, tree_digest
from fa2patch.common.lockfile import Identity
from fa2patch.series import gitws
from helpers import MINI_FILES, reference_digest


def _write(root, files):
    for p, (mode, data) in files.items():
        f = root / p
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data)
        f.chmod(mode)


def test_filesystem_digest_matches_its_definition(tmp_path):
    _write(tmp_path, MINI_FILES)
    assert tree_digest(tmp_path) == reference_digest(MINI_FILES)


def test_digest_changes_with_content_mode_and_name(tmp_path):
    _write(tmp_path, MINI_FILES)
    base = tree_digest(tmp_path)
    (tmp_path / "README").chmod(0o755)
    assert tree_digest(tmp_path) != base
    (tmp_path / "README").chmod(0o644)
    (tmp_path / "README").write_bytes(b"mini baseline!\n")
    assert tree_digest(tmp_path) != base


def test_git_digest_equals_filesystem_digest(tmp_path):
    _write(tmp_path, MINI_FILES)
    os.symlink("src/api.cpp", tmp_path / "link")
    repo = gitws.init_repo(tmp_path)
    gitws.commit_all(repo, "x\n", Identity("a", "a@b", "2025-01-01T00:00:00+00:00"))
    assert git_tree_digest(repo, "HEAD") == tree_digest(tmp_path)
