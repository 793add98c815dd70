# SPDX-License-Identifier: BSD-3-Clause
"""What every `fa2patch` command shares: the click group, the project context, the common
options, the one way a result is printed (``finish``) and --splits' parsing."""

import json
from pathlib import Path

import click

from fa2patch import __version__
from fa2patch.common.errors import EXIT_CHECK_FAILED
from fa2patch.common.lockfile import Lock
from fa2patch.common.project import Project

ARCH_HELP = "target architecture declared by the tree's fa2patch-build.toml (sm_70; sm_90 = H200 lab)"


def finish(as_json: bool, result: dict, text) -> int:
    """Print the result (JSON, or ``text()``), and return the exit code its "ok" implies."""
    if as_json:
        click.echo(json.dumps(result, indent=1))
    else:
        click.echo(text())
    return 0 if result["ok"] else EXIT_CHECK_FAILED


class Context:
    def __init__(self):
        self._project = None

    @property
    def project(self) -> Project:
        if self._project is None:
            self._project = Project.find()
        return self._project

    def lock(self) -> Lock:
        return Lock.load(self.project.lock_path)

    def workspace(self, given: str | None) -> Path:
        return Path(given).resolve() if given else self.project.default_workspace


pass_ctx = click.make_pass_decorator(Context, ensure=True)
workspace_option = click.option(
    "--workspace",
    "workspace",
    type=click.Path(file_okay=False),
    help="the git workspace [default: <project>/work/flash-attn]",
)
json_option = click.option(
    "--json", "as_json", is_flag=True, help='print one JSON object (with an "ok" field) on stdout, errors included'
)
python_option = click.option(
    "--python",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="the Python interpreter whose torch to build against / load with "
    "(e.g. your vLLM venv's bin/python) [default: the one running fa2patch]",
)


def int_set(text: str, low: int, high: int, hint: str, example: str) -> tuple[int, ...]:
    """A comma-separated set of integers, each low..high (empty: none), sorted."""
    try:
        values = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise click.BadParameter(f"expected integers like {example}, got {text!r}", param_hint=hint) from None
    if any(not low <= x <= high for x in values):
        raise click.BadParameter(f"each must be {low}..{high}, got {text!r}", param_hint=hint)
    return values


def split_counts(text: str) -> tuple[int, ...]:
    """--splits: comma-separated split counts, each 2..16 (empty: none)."""
    return int_set(text, 2, 16, "--splits", "2,3,4")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fa2patch")
def cli():
    """Build vLLM's `_vllm_fa2_C` for V100 (sm_70) from a locked FlashAttention release and
    an ordered patch series.

    Pipeline: fetch -> replay -> build -> verify -> smoke; export writes workspace commits
    back to patches/. Exit codes: 0 ok, 1 a check or build step failed, 2 usage or
    environment error, 3 nothing to launch on this machine (smoke, bench, tune). With --json, every
    command prints one JSON object with an "ok" field, errors included.
    """
