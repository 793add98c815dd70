# SPDX-License-Identifier: BSD-3-Clause
"""replay/export/check on a small baseline: determinism, round trip, tampering, atomicity."""

import hashlib
import tomllib
from pathlib import Path

import pytest


def _add_patch(mini, subject, body, edits):
    """Commit ``edits`` (path -> new text) in the workspace and export the series."""
    for path, text in edits.items():
        (mini.workspace / path).write_text(text)
    mini.git("add", "-A")
    mini.git("commit", "-q", "-m", subject + ("\n\n" + body if body else ""))
    mini.run("export")


@pytest.fixture
def series(mini):
    """The mini project with two exported patches."""
    mini.run("replay", "--sdist", str(mini.archive))
    _add_patch(
        mini,
        "First change",
        "Why it is needed.\n# not a comment",
        {"src/kernel.cu": "// kernel\nint a = 10;\nint b = 2;\nint c = 3;\n"},
    )
    _add_patch(mini, "Second: add a file", "", {"src/new.h": "#pragma once\n"})
    return mini


def _commits(mini, ws=None):
    return mini.git("log", "--format=%H", cwd=ws).split()


def _rewrite_patch(mini, index: int, edit) -> Path:
    """Rewrite patch ``index`` (0-based) with ``edit(text)`` and re-lock its sha256, as a hand
    edit that also updated the lock would."""
    entry = tomllib.loads((mini.root / "baseline.lock").read_text())["patches"][index]
    patch = mini.root / "patches" / entry["file"]
    text = edit(patch.read_text())
    patch.write_text(text)
    lock = mini.root / "baseline.lock"
    lock.write_text(lock.read_text().replace(entry["sha256"], hashlib.sha256(text.encode()).hexdigest()))
    return patch


def test_replay_from_empty_cache_then_idempotent(mini):
    proc = mini.run("replay", "--sdist", str(mini.archive))
    assert "created" in proc.stdout
    assert (mini.cache / "archives" / "mini-1.0.tar.gz").exists()
    assert "unchanged" in mini.run("replay").stdout
    assert mini.run("check").returncode == 0


def test_export_writes_numbered_patches_and_lock(series):
    names = sorted(p.name for p in (series.root / "patches").iterdir())
    assert names == ["0001-first-change.patch", "0002-second-add-a-file.patch"]
    lock = tomllib.loads((series.root / "baseline.lock").read_text())
    assert [p["file"] for p in lock["patches"]] == names
    assert lock["baseline"]["project"] == "mini" and "# test lock" in (series.root / "baseline.lock").read_text()
    text = (series.root / "patches" / names[0]).read_text()
    assert text.startswith(
        "From: fa2patch\nSubject: First change\n\nWhy it is needed.\n# not a comment\n---\n"
        " src/kernel.cu | 2 +-\n 1 file changed, 1 insertion(+), 1 deletion(-)\n\n"
        "diff --git a/src/kernel.cu b/src/kernel.cu\n"
    )
    assert "Date" not in text and "2.39" not in text  # no dates, no git version signature


def test_two_replays_give_identical_commits_and_round_trip(series, tmp_path):
    before = {p.name: p.read_bytes() for p in (series.root / "patches").iterdir()}
    lock_before = (series.root / "baseline.lock").read_bytes()
    series.run("replay", "--workspace", str(tmp_path / "a"))
    series.run("replay", "--workspace", str(tmp_path / "b"))
    a, b = _commits(series, tmp_path / "a"), _commits(series, tmp_path / "b")
    assert a == b and len(a) == 3
    series.run("replay", "--force")
    assert _commits(series) == a
    series.run("export")
    assert {p.name: p.read_bytes() for p in (series.root / "patches").iterdir()} == before
    assert (series.root / "baseline.lock").read_bytes() == lock_before
    assert series.run("check").returncode == 0


def test_tampered_patch_fails_replay_and_check_naming_file_and_hashes(series):
    patch = series.root / "patches" / "0001-first-change.patch"
    data = bytearray(patch.read_bytes())
    data[-3] ^= 0x01
    patch.write_bytes(bytes(data))
    locked = tomllib.loads((series.root / "baseline.lock").read_text())["patches"][0]["sha256"]
    proc = series.run("replay", "--force", check_rc=1)
    assert str(patch) in proc.stderr and locked in proc.stderr and "actual" in proc.stderr
    check = series.run("check", check_rc=1)
    assert "0001-first-change.patch" in check.stdout and "FAIL" in check.stdout and locked in check.stdout


def test_tampered_lock_fails_replay(series):
    lock = series.root / "baseline.lock"
    text = lock.read_text()
    digest = tomllib.loads(text)["patches"][1]["tree_digest"]
    flipped = digest[:-1] + ("0" if digest[-1] != "0" else "1")
    lock.write_text(text.replace(digest, flipped))
    proc = series.run("replay", "--force", check_rc=1)
    assert "0002-second-add-a-file.patch" in proc.stderr
    assert flipped in proc.stderr and digest in proc.stderr


def test_tampered_cached_archive_fails_replay_naming_file_and_hashes(series):
    cached = series.cache / "archives" / "mini-1.0.tar.gz"
    data = bytearray(cached.read_bytes())
    data[100] ^= 0xFF
    cached.write_bytes(bytes(data))
    proc = series.run("replay", "--force", check_rc=1)
    assert str(cached) in proc.stderr and "expected" in proc.stderr and "actual" in proc.stderr
    assert series.run("check", check_rc=1).returncode == 1


def test_dirty_workspace_is_refused_unless_forced(series):
    (series.workspace / "README").write_text("local edit\n")
    proc = series.run("replay", check_rc=1)
    assert "uncommitted changes" in proc.stderr and "--force" in proc.stderr
    assert (series.workspace / "README").read_text() == "local edit\n"  # nothing lost
    assert series.run("export", check_rc=1).returncode == 1
    series.run("replay", "--force")
    assert (series.workspace / "README").read_text() == "mini baseline\n"


def test_diverging_workspace_is_refused(series):
    series.git("commit", "-q", "--allow-empty", "-m", "local work")
    proc = series.run("replay", check_rc=1)
    assert "refusing to replace the workspace" in proc.stderr


def test_patch_that_does_not_apply_leaves_nothing_behind(series):
    # Make 0001 conflict with the pristine tree: rewrite its context by hand, re-lock its hash.
    _rewrite_patch(series, 0, lambda text: text.replace(" int b = 2;", " int b = 20;"))
    target = series.root / "fresh"
    proc = series.run("replay", "--workspace", str(target), check_rc=1)
    assert "does not apply cleanly" in proc.stderr and "0001-first-change.patch" in proc.stderr
    assert not target.exists()
    assert not [p for p in series.root.iterdir() if p.name.startswith(".fresh")]


def test_unlisted_patch_file_fails_check(series):
    (series.root / "patches" / "0003-stray.patch").write_text("x")
    proc = series.run("check", "--json", check_rc=1)
    assert "0003-stray.patch" in proc.stdout and "not listed" in proc.stdout


def test_missing_patch_fails_replay_and_check(series):
    (series.root / "patches" / "0002-second-add-a-file.patch").unlink()
    proc = series.run("replay", "--force", check_rc=1)
    assert "0002-second-add-a-file.patch: listed in baseline.lock but missing" in proc.stderr
    assert "listed in the lock but missing" in series.run("check", check_rc=1).stdout


def test_export_refuses_an_empty_commit_naming_it(series):
    before = {p.name: p.read_bytes() for p in (series.root / "patches").iterdir()}
    series.git("commit", "-q", "--allow-empty", "-m", "Nothing at all")
    empty = series.git("rev-parse", "HEAD").strip()
    proc = series.run("export", check_rc=1)
    assert empty[:12] in proc.stderr and "'Nothing at all'" in proc.stderr and "changes no file" in proc.stderr
    assert {p.name: p.read_bytes() for p in (series.root / "patches").iterdir()} == before
    check = series.run("check", check_rc=1)
    assert empty[:12] in check.stdout


def test_hand_edited_diffstat_fails_replay(series):
    patch = _rewrite_patch(series, 0, lambda text: text.replace(" src/kernel.cu | 2 +-\n", " src/kernel.cu | 3 ++-\n"))
    proc = series.run("replay", "--force", check_rc=1)
    assert str(patch) in proc.stderr and "diffstat" in proc.stderr
    assert "src/kernel.cu | 2 +-" in proc.stderr and "src/kernel.cu | 3 ++-" in proc.stderr


def test_patch_without_diffstat_replays_and_check_asks_for_an_export(series):
    """Patches exported before diffstats existed still replay; check says the export differs."""

    def drop_diffstat(text):
        head, _, diff = text.partition("---\n")
        return head + "---\n" + diff[diff.index("diff --git") :]

    _rewrite_patch(series, 1, drop_diffstat)
    series.run("replay", "--force")
    check = series.run("check", check_rc=1)
    assert "0002-second-add-a-file.patch: differs from what the workspace exports" in check.stdout
