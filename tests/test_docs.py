# SPDX-License-Identifier: BSD-3-Clause
"""The docs against what they describe: the README is a landing page whose quick start runs as written
(its fa2patch commands and options are the CLI's, its wheel is the file `package` names), the guide's
CLI reference is generated from the click group and documents every command once, no guide page is
too long, the guide's navigation lists every page, and docs/lab/README.md indexes every lab run folder.
(`bash ci/docs.sh` builds the guide strictly: links, pages and anchors.)"""

import re
import shlex

import pytest
import tomlkit

from fa2patch import __version__
from fa2patch.cli.main import cli
from helpers import REPO

README = (REPO / "README.md").read_text()
DOCS = REPO / "docs"
CLI_PAGE = DOCS / "cli.md"
MAX_README_LINES = 200
MAX_PAGE_LINES = 430  # "about 400" (docs/anchor-sources.md: 427)


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", text, flags=re.M | re.S)


def test_readme_is_a_landing_page_with_the_two_commands():
    lines = README.count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines (at most {MAX_README_LINES})"
    # CI's .ci/run runs these two; the README says so in one fenced bash block.
    two = [b for b in bash_blocks(README) if "ci/gate.sh" in b and "ci/test.sh" in b]
    assert two, "README.md lost the two commands' block"
    assert [line.split("#")[0].strip() for line in two[0].strip().splitlines()] == [
        "bash ci/gate.sh",
        "bash ci/test.sh",
    ]


def quick_start() -> str:
    section = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    (block,) = bash_blocks(section)
    return block


def test_quick_start_commands_are_the_clis():
    """Each `fa2patch` command of the quick start exists and takes the options it is given."""
    calls = []
    for line in quick_start().splitlines():
        words = shlex.split(line.split(" #", 1)[0].replace("<model>", "MODEL"))
        if words and words[0].endswith("/fa2patch"):
            calls.append(words[1:])
    assert calls, "the quick start runs no fa2patch command"
    for words in calls:
        name, args = words[0], words[1:]
        assert name in cli.commands, f"quick start: fa2patch {name}: no such command"
        command = cli.commands[name]
        ctx = command.make_context(f"fa2patch {name}", list(args), resilient_parsing=True)
        known = {opt for p in command.params for opt in getattr(p, "opts", [])}
        assert all(not a.startswith("--") or a in known for a in args), (name, args, sorted(known))
        assert not ctx.args, f"quick start: fa2patch {name}: unexpected arguments {ctx.args}"
    assert any(c[0] == "doctor" and "--vllm" in c for c in calls)


def test_quick_start_installs_the_wheel_package_writes():
    """The wheel the quick start installs is the file name `fa2patch package` gives the gate's build:
    fa2patch_vllm-<version>+torch<the build extra's torch, +cu128>-cp39-abi3-<platform>.whl."""
    from fa2patch.vllm import package

    pyproject = tomlkit.parse((REPO / "pyproject.toml").read_text())
    (torch,) = [r for r in pyproject["project"]["optional-dependencies"]["build"] if r.startswith("torch==")]
    torch_version = torch.split("==")[1] + "+cu128"  # the index's CUDA 12.8 build (DESIGN.md §5)
    local = re.sub(r"[^0-9A-Za-z]+", ".", torch_version)
    wheel = f"{package.DIST}-{__version__}+torch{local}-cp39-abi3-linux_x86_64.whl"
    assert f"dist/{wheel}" in quick_start(), f"the quick start should install dist/{wheel}"
    source = (REPO / "tools" / "fa2patch" / "vllm" / "package.py").read_text()
    assert 'version = f"{__version__}+torch{re.sub(r' in source and 'py = "cp39-abi3"' in source
    assert re.search(r'f"\{DIST\}-\{version\}-\{tag\}\.whl"', source)


def test_cli_reference_is_generated_and_documents_every_command_once():
    """docs/cli.md generates the reference from the click group (mkdocs-click); what it generates has
    one section per command, and the hand-written README table is gone."""
    mkdocs_click = pytest.importorskip("mkdocs_click._docs")
    page = CLI_PAGE.read_text()
    directive = re.search(r"^::: mkdocs-click\n((?:    :.*\n)+)", page, flags=re.M)
    assert directive, "docs/cli.md: no mkdocs-click directive"
    options = dict(re.findall(r":(\w+): (\S+)", directive[1]))
    assert options["module"] == "fa2patch.cli.main" and options["command"] == "cli"
    assert options.get("list_subcommands") == "true"
    generated = "\n".join(
        mkdocs_click.make_command_docs(
            options.get("prog_name", "fa2patch"),
            cli,
            depth=int(options.get("depth", 0)),
            style=options.get("style", "plain"),
            list_subcommands=True,
        )
    )
    sections = re.findall(r"^#{3,} ([a-z-]+)$", generated, flags=re.M)  # below the group's own title
    assert sorted(sections) == sorted(cli.commands)
    assert len(sections) == len(set(sections))
    assert not re.search(r"^\| `fa2patch [a-z]", README, flags=re.M), "README.md has a hand-written CLI table again"
    # The page's longer descriptions, one per command.
    described = re.findall(r"^- `fa2patch ([a-z-]+)", page, flags=re.M)
    assert sorted(set(described)) == sorted(cli.commands)


def guide_pages() -> list:
    exclude = ("lab/20", "report/")
    return sorted(
        p
        for p in DOCS.rglob("*.md")
        if not str(p.relative_to(DOCS)).startswith(exclude) and "__pycache__" not in p.parts
    )


def test_no_guide_page_is_too_long():
    long = {str(p.relative_to(REPO)): n for p in guide_pages() if (n := p.read_text().count("\n")) > MAX_PAGE_LINES}
    assert long == {}, f"pages over {MAX_PAGE_LINES} lines: {long}"


def test_guide_navigation_lists_every_page():
    nav = re.findall(r":\s+([\w./-]+\.md)\s*$", (REPO / "mkdocs.yml").read_text(), flags=re.M)
    assert sorted(nav) == sorted(str(p.relative_to(DOCS)) for p in guide_pages())
    assert len(nav) == len(set(nav))


def test_lab_readme_indexes_every_run_folder():
    lab = DOCS / "lab"
    index = (lab / "README.md").read_text()
    folders = sorted(p.name for p in lab.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders and all(re.match(r"\d{4}-\d{2}-\d{2}-series-", f) for f in folders), folders
    listed = re.findall(r"^\| `([^`/]+)/` \|", index, flags=re.M)
    assert sorted(listed) == folders
