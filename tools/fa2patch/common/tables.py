# SPDX-License-Identifier: BSD-3-Clause
"""The one text-table renderer of the command line's text output (check, doctor, verify, smoke,
report, bench, tune, the peer model)."""


def table(rows: list[list], header: list[str]) -> str:
    """``header`` over a dashed rule, then ``rows``: columns left-aligned two spaces apart, trailing
    spaces trimmed; a cell (``str`` of it) shows its first line, except the last column's, whose
    further lines follow on lines of their own under it."""
    cells = [[str(c) for c in r] for r in [header, *rows]]
    first = [[c.splitlines()[0] if c else "" for c in r] for r in cells]
    widths = [max(len(r[i]) for r in first) for i in range(len(header))]
    indent = " " * (sum(widths[:-1]) + 2 * (len(widths) - 1))
    lines = []
    for r, f in zip(cells, first, strict=True):
        lines.append("  ".join(c.ljust(w) for c, w in zip(f, widths, strict=True)).rstrip())
        lines += [indent + extra for extra in (r[-1].splitlines()[1:] if r[-1] else [])]
    lines.insert(1, "  ".join("-" * w for w in widths).rstrip())
    return "\n".join(lines)
