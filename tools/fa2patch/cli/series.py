# SPDX-License-Identifier: BSD-3-Clause
"""`fa2patch fetch`, `replay`, `export` and `check`: the locked baseline and the patch series."""

from dataclasses import asdict
from pathlib import Path

import click

from fa2patch.cli.common import cli, finish, json_option, pass_ctx, workspace_option
from fa2patch.common.tables import table


@cli.command()
@click.option(
    "--sdist",
    type=click.Path(dir_okay=False, path_type=Path),
    help="use this local archive (offline); it is verified and replaces the cached one",
)
@click.option("--index-url", help="package index to use instead of pip's configured ones")
@click.option("--force", is_flag=True, help="download again even if the cache holds the archive")
@json_option
@pass_ctx
def fetch(ctx, sdist, index_url, force, as_json):
    """Download the pristine baseline archive, verify its sha256 and cache it."""
    from fa2patch.series.fetch import fetch as do_fetch

    lock = ctx.lock()
    path = do_fetch(lock, sdist=sdist, index_url=index_url, force=force, quiet=as_json)
    return finish(
        as_json,
        {"ok": True, "archive": str(path), "sha256": lock.baseline.sha256},
        lambda: f"{path}: sha256 {lock.baseline.sha256} verified",
    )


@cli.command()
@workspace_option
@click.option("--force", is_flag=True, help="discard a dirty or diverging workspace")
@click.option(
    "--sdist",
    type=click.Path(dir_okay=False, path_type=Path),
    help="use this local archive (offline); it is verified and replaces the cached one",
)
@json_option
@pass_ctx
def replay(ctx, workspace, force, sdist, as_json):
    """Import the pristine tree and apply every patch as one deterministic commit each."""
    from fa2patch.series import gitws
    from fa2patch.series.replay import replay as do_replay

    lock, ws = ctx.lock(), ctx.workspace(workspace)
    outcome = do_replay(
        lock, ctx.project.patches_dir, ws, force=force, sdist=sdist, echo=(lambda m: None) if as_json else click.echo
    )
    commits = [c.hexsha for c in gitws.series_commits(gitws.open_repo(ws))]
    return finish(
        as_json,
        {"ok": True, "workspace": str(ws), "outcome": outcome, "commits": commits, "tree_digest": lock.final_digest()},
        lambda: (
            f"{ws}: {outcome}; {len(commits) - 1} patch(es) on the pristine import; "
            f"HEAD {commits[-1][:12]}, tree {lock.final_digest()}"
        ),
    )


@cli.command()
@workspace_option
@json_option
@pass_ctx
def export(ctx, workspace, as_json):
    """Write the workspace commits back to patches/ and update baseline.lock."""
    from fa2patch.series.export import export as do_export

    lock, ws = ctx.lock(), ctx.workspace(workspace)
    changed = do_export(lock, ws, ctx.project.patches_dir)
    return finish(
        as_json,
        {"ok": True, "changed": changed, "patches": [asdict(p) for p in lock.patches]},
        lambda: f"exported {len(lock.patches)} patch(es); changed: {', '.join(changed) or 'nothing'}",
    )


@cli.command()
@workspace_option
@json_option
@pass_ctx
def check(ctx, workspace, as_json):
    """Verify that the lock, patches/, pyproject.toml's pins, the cached archive and the workspace agree."""
    from fa2patch.series.check import check as do_check

    findings = do_check(ctx.lock(), ctx.project.patches_dir, ctx.workspace(workspace), ctx.project.pyproject_path)
    return finish(
        as_json,
        {"ok": all(f.ok for f in findings), "findings": [asdict(f) for f in findings]},
        lambda: table([[f.item, "ok" if f.ok else "FAIL", f.detail] for f in findings], ["item", "status", "detail"]),
    )
