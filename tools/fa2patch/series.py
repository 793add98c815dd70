"""The patch file format of patches/NNNN-<slug>.patch.

    From: fa2patch
    Subject: <subject>

    <body>
    ---
    <git diff>

No dates, commit ids or tool-version signatures: the same commit always renders to the same
bytes. The subject and body become the commit message again on replay.
"""

import re
from dataclasses import dataclass

HEADER = "From: fa2patch\n"
SEPARATOR = "\n---\n"


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
        text = f"{HEADER}Subject: {self.subject}\n\n{body}---\n{self.diff}"
        return text if text.endswith("\n") else text + "\n"

    @classmethod
    def parse(cls, text: str, where: str) -> "PatchFile":
        if not text.startswith(HEADER + "Subject: "):
            raise ValueError(f"{where}: not a fa2patch patch (expected it to start with "
                             f"{(HEADER + 'Subject: ')!r})")
        head, sep, diff = text[len(HEADER):].partition(SEPARATOR + "diff --git ")
        if not sep:
            raise ValueError(f"{where}: no '---' line followed by a 'diff --git' section")
        subject_line, _, body = head.partition("\n")
        return cls(subject_line[len("Subject: "):], body.strip("\n"), "diff --git " + diff)


def slug(subject: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", subject.lower()).strip("-")
    return s[:60].rstrip("-") or "patch"


def patch_name(index: int, subject: str) -> str:
    return f"{index:04d}-{slug(subject)}.patch"
