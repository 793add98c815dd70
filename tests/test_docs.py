# SPDX-License-Identifier: BSD-3-Clause
"""The docs against what they describe: the README's command table lists every CLI command once
(and nothing else), and docs/lab/README.md indexes every lab run folder."""

import re

from fa2patch.cli.main import cli
from helpers import REPO


def test_readme_command_table_lists_each_command_once():
    readme = (REPO / "README.md").read_text()
    rows = re.findall(r"^\| `fa2patch ([a-z-]+)", readme, flags=re.M)
    assert sorted(rows) == sorted(cli.commands), "README's command table and the CLI differ"
    assert len(rows) == len(set(rows)), f"listed more than once: {sorted({r for r in rows if rows.count(r) > 1})}"


def test_lab_readme_indexes_every_run_folder():
    lab = REPO / "docs" / "lab"
    index = (lab / "README.md").read_text()
    folders = sorted(p.name for p in lab.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders and all(re.match(r"\d{4}-\d{2}-\d{2}-series-", f) for f in folders), folders
    listed = re.findall(r"^\| `([^`/]+)/` \|", index, flags=re.M)
    assert sorted(listed) == folders
