# SPDX-License-Identifier: BSD-3-Clause
"""Lines per C++/CUDA function in the files the patch series adds (issue 18: none over 120).

Usage: python ci/function_lengths.py [TREE] [--max N] [--top K]
TREE is a replayed FA2 tree (default work/flash-attn); the files are those under
csrc/flash_attn/fa2patch/ (every file there is added by the series). A function is a brace block at
namespace or class scope whose head has a parameter list (lambdas and nested blocks count toward
their function); its length runs from the first line of its head to its closing brace. Comments,
strings and preprocessor lines are skipped when matching braces. Exit 1 if a function is over --max.
"""

import re
import sys
from pathlib import Path

CONTAINERS = re.compile(r"^\s*(template\s*<.*>\s*)?(namespace\b|struct\b|class\b|union\b|enum\b|extern\s+\"C\")")
MACROS = {"__launch_bounds__", "__attribute__", "alignas", "__align__", "decltype", "sizeof"}
CONTROL = re.compile(r"^\s*(if|for|while|switch|catch|do|else)\b")


def strip(text: str) -> str:
    """Comments, string and char literals blanked (newlines kept); preprocessor lines blanked."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith('R"(', i):
            j = text.find(')"', i + 3)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(" " * (j + 1 - i))
            i = j + 1
        else:
            out.append(c)
            i += 1
    lines = "".join(out).split("\n")
    return "\n".join(" " * len(line) if line.lstrip().startswith("#") else line for line in lines)


def functions(text: str):
    """(name, first line, last line) of each function body at namespace/class scope."""
    code = strip(text)
    stack: list[tuple[str, int]] = []  # per open brace: "container" or "function" or "block", and where
    head_start = 0  # offset where the current head (text since the last ; { }) begins
    found: list[list] = []  # [name, first line, last line or None, stack depth]
    for i, c in enumerate(code):
        if c == "{":
            head = code[head_start:i]
            in_function = any(kind == "function" for kind, _ in stack)
            if in_function:
                stack.append(("block", i))
            elif CONTAINERS.search(head.strip().split("\n")[-1]) or CONTAINERS.search(head.strip()):
                stack.append(("container", i))
            elif "(" in head and not CONTROL.search(head.strip()) and not head.strip().endswith("="):
                first = head_start + len(head) - len(head.lstrip())
                name = [x for x in re.findall(r"([~\w:]+)\s*\(", head) if x not in MACROS]
                stack.append(("function", first))
                found.append([name[0] if name else "?", code.count("\n", 0, first) + 1, None, len(stack)])
            else:
                stack.append(("block", i))  # an initializer list or aggregate at namespace scope
            head_start = i + 1
        elif c == "}":
            kind, _ = stack.pop() if stack else ("block", 0)
            if kind == "function":
                for f in found:
                    if f[2] is None and f[3] == len(stack) + 1:
                        f[2] = code.count("\n", 0, i) + 1
            head_start = i + 1
        elif c == ";":
            head_start = i + 1
    return [(name, a, b) for name, a, b, _ in found if b is not None]


def main(argv):
    tree = Path(argv[1]) if len(argv) > 1 and not argv[1].startswith("--") else Path("work/flash-attn")
    limit = int(argv[argv.index("--max") + 1]) if "--max" in argv else 120
    top = int(argv[argv.index("--top") + 1]) if "--top" in argv else 10
    root = tree / "csrc/flash_attn/fa2patch"
    rows = []
    for path in sorted(root.rglob("*")):
        if path.suffix in {".h", ".cuh", ".cu", ".cpp"}:
            for name, a, b in functions(path.read_text()):
                rows.append((b - a + 1, str(path.relative_to(tree)), a, name))
    rows.sort(reverse=True)
    print(f"{len(rows)} functions in {root.relative_to(tree)}; the longest {top}:")
    for n, file, line, name in rows[:top]:
        print(f"{n:5d}  {file}:{line}  {name}")
    over = [r for r in rows if r[0] > limit]
    print(f"over {limit} lines: {len(over)}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
