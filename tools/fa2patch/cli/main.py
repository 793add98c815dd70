# SPDX-License-Identifier: BSD-3-Clause
"""The `fa2patch` command line. Exit codes: 0 ok, 1 a check or build step failed,
2 usage or environment error, 3 nothing to launch on this machine (see README.md).

With --json every command writes exactly one JSON object to stdout, with an "ok" field, also
when it fails ({"ok": false, "error": ..., "exit_code": ...}); progress and compiler output go
to stderr. The exit code is the same with and without --json.

The commands live in cli/series.py (fetch, replay, export, check), cli/build.py (doctor, build,
verify, package, smoke) and cli/perf.py (report, bench, tune), each registered on the group of
cli/common.py when imported here.
"""

import json
import sys

import click

from fa2patch.cli import build, perf, series  # noqa: F401  (importing them registers their commands)
from fa2patch.cli.common import cli
from fa2patch.common.errors import EXIT_USAGE, Fa2PatchError

__all__ = ["cli", "main"]


def main(argv: list[str] | None = None):
    args = sys.argv[1:] if argv is None else argv
    as_json = "--json" in args
    try:
        code = cli.main(args=args, prog_name="fa2patch", standalone_mode=False)
    except click.exceptions.Exit as exc:  # --help, --version
        code = exc.exit_code
    except click.ClickException as exc:
        code = _error(as_json, exc.format_message(), EXIT_USAGE, exc.show)
    except click.exceptions.Abort:
        code = _error(as_json, "aborted", EXIT_USAGE)
    except Fa2PatchError as exc:
        code = _error(as_json, str(exc), exc.exit_code)
    sys.exit(code or 0)


def _error(as_json: bool, message: str, code: int, show=None) -> int:
    """Report a failure on stderr (click's usage message where it has one), and with --json as
    the command's one JSON object on stdout too."""
    if show is not None:
        show()
    else:
        click.echo(f"fa2patch: error: {message}", err=True)
    if as_json:
        click.echo(json.dumps({"ok": False, "error": message, "exit_code": code}, indent=1))
    return code
