# SPDX-License-Identifier: BSD-3-Clause
"""The patch file format of patches/NNNN-<slug>.patch.

    From: fa2patch
    Subject: <subject>

    <body>
    ---
     <path> | <changed lines> <+++-->
     N files changed, A insertions(+), D deletions(-)

    <git diff>

No dates, commit ids or tool-version signatures: the same commit always renders to the same
bytes. The diffstat is computed here from the diff (not by git, whose diffstat layout depends on
its version and options) and checked when a patch is read. The subject and body become the
commit message again on replay.
"""

import re
from dataclasses import dataclass
from typing import Any

from fa2patch.common.errors import mismatch

HEADER = "From: fa2patch\n"
DIFF_START = "diff --git "
GRAPH_WIDTH = 40  # the widest +/- bar; larger changes are scaled down


@dataclass(frozen=True)
class PatchFile:
    subject: str
    body: str
    diff: str

    @property
    def message(self) -> str:
        return self.subject + ("\n\n" + self.body if self.body else "") + "\n"

    @classmethod
    def from_commit(cls, message: str, diff: str) -> "PatchFile":
        subject, _, body = message.strip("\n").partition("\n")
        return cls(subject.strip(), body.strip("\n"), diff)

    def render(self) -> str:
        body = self.body + "\n" if self.body else ""
        text = f"{HEADER}Subject: {self.subject}\n\n{body}---\n{diffstat(self.diff)}\n{self.diff}"
        return text if text.endswith("\n") else text + "\n"

    @classmethod
    def parse(cls, text: str, where: str) -> "PatchFile":
        """Read a patch file; its diffstat must be the one its diff gives (a file exported before
        diffstats existed, with none, is read too: `check` then asks for a new export)."""
        if not text.startswith(HEADER + "Subject: "):
            raise ValueError(f"{where}: not a fa2patch patch (expected it to start with {(HEADER + 'Subject: ')!r})")
        start = text.find("\n" + DIFF_START)
        head, sep, stat = text[len(HEADER) : start + 1].rpartition("\n---\n")
        if start < 0 or not sep:
            raise ValueError(f"{where}: no '---' line followed by a diffstat and a 'diff --git' section")
        diff = text[start + 1 :]
        if stat and stat != diffstat(diff) + "\n":
            raise ValueError(mismatch("diffstat (written by hand?)", where, diffstat(diff), stat.rstrip("\n")))
        subject_line, _, body = head.partition("\n")
        return cls(subject_line[len("Subject: ") :], body.strip("\n"), diff)


def file_changes(diff: str) -> list[tuple[str, int, int, bool]]:
    """(path, added lines, removed lines, binary) per file of a `git diff --no-renames` text."""
    files: list[list[Any]] = []  # [path, added, removed, binary], counted as the diff is read
    in_hunk = False
    for line in diff.splitlines():
        if line.startswith(DIFF_START):
            rest = line[len(DIFF_START) + 2 :]  # "<path> b/<path>": both paths are equal without renames
            files.append([rest[: (len(rest) - 3) // 2], 0, 0, False])
            in_hunk = False
        elif not files:
            continue
        elif line.startswith("@@"):
            in_hunk = True
        elif in_hunk and line.startswith("+"):
            files[-1][1] += 1
        elif in_hunk and line.startswith("-"):
            files[-1][2] += 1
        elif not in_hunk and line.startswith(("GIT binary patch", "Binary files ")):
            files[-1][3] = True
    return [(path, added, removed, binary) for path, added, removed, binary in files]


def diffstat(diff: str) -> str:
    """One line per file (path, changed lines, a +/- bar) and a summary line."""
    changes = file_changes(diff)
    if not changes:
        return " 0 files changed"
    width = max(len(p) for p, *_ in changes)
    most = max(a + d for _, a, d, _ in changes)
    count_width = len(str(most))

    def bar(n: int) -> int:
        return n if most <= GRAPH_WIDTH else (max(1, n * GRAPH_WIDTH // most) if n else 0)

    lines = [
        f" {p.ljust(width)} | " + ("Bin" if binary else f"{a + d:>{count_width}} {'+' * bar(a)}{'-' * bar(d)}")
        for p, a, d, binary in changes
    ]
    adds, dels = sum(c[1] for c in changes), sum(c[2] for c in changes)
    summary = f" {len(changes)} file{'s' if len(changes) != 1 else ''} changed"
    summary += f", {adds} insertion{'s' if adds != 1 else ''}(+)" if adds else ""
    summary += f", {dels} deletion{'s' if dels != 1 else ''}(-)" if dels else ""
    return "\n".join([*lines, summary]) + "\n"


def slug(subject: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", subject.lower()).strip("-")
    return s[:60].rstrip("-") or "patch"


def patch_name(index: int, subject: str) -> str:
    return f"{index:04d}-{slug(subject)}.patch"
