# SPDX-License-Identifier: BSD-3-Clause
"""Every source file carries the SPDX line of the project's licence (LICENSE: BSD-3-Clause).

Usage: python ci/check_spdx.py [--add] [FILE ...]   (no FILE: every file git tracks; pre-commit passes its own)
       --add writes the line where it is missing (first line, or second after a shebang); never in patches.

Source files are the Python, shell, TOML, YAML, CMake and requirements files of this repository
(`comment_of` says which), and every file that a patch in patches/ adds to FA2's tree: the line must
be among the first HEAD_LINES lines of each, as a comment (`#` or `//`). Documentation, data, logs
and lab evidence are not source files. Exit 1 and one line per file without it.
"""

import re
import subprocess
import sys
from pathlib import Path

LICENSE = "BSD-3-Clause"
HEAD_LINES = 5  # room for a shebang, an encoding line or a C++ include guard before it
HASH_SUFFIXES = {".py", ".sh", ".toml", ".lock", ".yaml", ".yml", ".cmake", ".in"}
HASH_NAMES = {".clang-format", "run"}  # .ci/run: a shell script without a suffix
SLASH_SUFFIXES = {".h", ".hpp", ".cuh", ".cu", ".cpp", ".cc", ".c"}


def comment_of(path: str) -> str | None:
    """The comment marker of a source file's SPDX line; None: not a source file."""
    p = Path(path)
    if p.suffix in HASH_SUFFIXES or p.name in HASH_NAMES or (p.parent.name == "ci" and p.suffix == ".txt"):
        return "#"
    if p.suffix in SLASH_SUFFIXES:
        return "//"
    return None


def licence_in(lines: list[str], marker: str) -> str | None:
    """The SPDX licence named in a ``marker`` comment among the first HEAD_LINES ``lines``, None if none is."""
    spdx = re.compile(rf"^{re.escape(marker)} SPDX-License-Identifier: (\S+)\s*$")
    for line in lines[:HEAD_LINES]:
        m = spdx.match(line)
        if m:
            return m.group(1)
    return None


def check_file(path: Path) -> str | None:
    """Why ``path`` (a source file) fails, or None."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"{path}: cannot read: {exc}"
    found = licence_in(lines, comment_of(str(path)) or "#")
    if found is None:
        return (
            f"{path}: no '{comment_of(str(path))} SPDX-License-Identifier: {LICENSE}' in its first {HEAD_LINES} lines"
        )
    if found != LICENSE:
        return f"{path}: SPDX-License-Identifier {found}, expected {LICENSE}"
    return None


def added_files(patch: str) -> dict[str, list[str]]:
    """Per file a patch creates (new file mode), its first added lines."""
    files: dict[str, list[str]] = {}
    current, head = "", None
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            current, head = line.split(" b/", 1)[-1], None
        elif line.startswith("new file mode"):
            head = files[current] = []
        elif head is not None and line.startswith("+") and not line.startswith("+++") and len(head) < HEAD_LINES:
            head.append(line[1:])
    return files


def check_patch(path: Path) -> list[str]:
    """Why the files ``path`` adds fail: each source file it creates needs the SPDX line."""
    problems = []
    for name, head in added_files(path.read_text(errors="replace")).items():
        marker = comment_of(name)
        if marker is None:
            continue
        found = licence_in(head, marker)
        if found != LICENSE:
            problems.append(
                f"{path}: adds {name} without '{comment_of(name)} SPDX-License-Identifier: {LICENSE}' "
                f"in its first {HEAD_LINES} lines" + (f" (found {found})" if found else "")
            )
    return problems


def add_line(path: Path) -> None:
    """Insert the SPDX line as the first line, or the second after a shebang."""
    text = path.read_text()
    line = f"{comment_of(str(path))} SPDX-License-Identifier: {LICENSE}\n"
    at = text.index("\n") + 1 if text.startswith("#!") else 0
    path.write_text(text[:at] + line + text[at:])


def problems_in(paths: list[str]) -> list[str]:
    problems = []
    for name in paths:
        path = Path(name)
        if path.suffix == ".patch":
            problems += check_patch(path)
        elif comment_of(name) is not None and path.is_file():
            problems += [p for p in [check_file(path)] if p]
    return problems


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], capture_output=True, text=True, check=True).stdout
    return [p for p in out.split("\0") if p]


def main(argv: list[str]) -> int:
    add = "--add" in argv
    paths = [a for a in argv[1:] if a != "--add"] or tracked_files()
    for name in paths if add else []:
        path, marker = Path(name), comment_of(name)
        source = marker and path.suffix != ".patch" and path.is_file()
        if source and licence_in(path.read_text(errors="replace").splitlines(), marker or "#") is None:
            add_line(path)
    problems = problems_in(paths)
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
