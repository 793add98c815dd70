# SPDX-License-Identifier: BSD-3-Clause
"""The git workspace: deterministic commits, isolated from the user's git configuration."""

import os
from pathlib import Path

import git

from fa2patch.common.errors import EnvironmentProblem
from fa2patch.common.lockfile import Identity

# Ignore the user's and the system's git configuration: hooks, signing, autocrlf, global
# excludes or a different diff algorithm would change commits and exported patches.
ISOLATION = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
}
CONFIG = {
    "core.autocrlf": "false",
    "core.filemode": "true",
    "core.excludesFile": os.devnull,
    "core.hooksPath": os.devnull,
    "commit.gpgSign": "false",
    "gc.auto": "0",
}
PRISTINE_TRAILER = "Fa2patch-Pristine: yes"
LOCK_KEY = "fa2patch.series.patches"  # "<lock series fingerprint> <HEAD>" at the last replay/export


def _env(identity: Identity | None = None) -> dict:
    env = dict(ISOLATION)
    if identity is not None:
        for role in ("AUTHOR", "COMMITTER"):
            env[f"GIT_{role}_NAME"] = identity.name
            env[f"GIT_{role}_EMAIL"] = identity.email
            env[f"GIT_{role}_DATE"] = identity.date
    return env


def open_repo(path: Path) -> git.Repo:
    try:
        repo = git.Repo(path)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
        raise EnvironmentProblem(f"{path}: not a fa2patch workspace (no git repository)") from exc
    repo.git.update_environment(**_env())
    return repo


def init_repo(path: Path) -> git.Repo:
    repo = git.Repo.init(path, initial_branch="fa2patch")
    repo.git.update_environment(**_env())
    with repo.config_writer() as cw:
        for key, value in CONFIG.items():
            section, option = key.rsplit(".", 1)
            cw.set_value(section, option, value)
    return repo


def commit_all(repo: git.Repo, message: str, identity: Identity) -> str:
    """Stage the whole work tree (ignore rules off) and commit it with the fixed identity."""
    repo.git.add("-A", "-f", ".")
    message_file = Path(repo.git_dir) / "FA2PATCH_MSG"
    message_file.write_text(message)
    with repo.git.custom_environment(**_env(identity)):
        repo.git.commit("-q", "--no-verify", "--cleanup=verbatim", "-F", str(message_file))
    message_file.unlink()
    return repo.head.commit.hexsha


def uncommitted_paths(repo: git.Repo) -> list[str]:
    """Lines of `git status --porcelain` (untracked files included): empty when the tree is clean."""
    out = repo.git.status("--porcelain", "--untracked-files=all", "--ignored=no")
    return out.splitlines()


def commit_message(commit: git.Commit) -> str:
    """The commit's message (GitPython gives bytes where it cannot decode it: kept byte for byte)."""
    message = commit.message
    return message if isinstance(message, str) else message.decode("utf-8", "surrogateescape")


def series_commits(repo: git.Repo) -> list[git.Commit]:
    """The first-parent chain from the pristine root to HEAD, oldest first."""
    commits = list(repo.iter_commits("HEAD", first_parent=True))
    commits.reverse()
    if not commits or PRISTINE_TRAILER not in commit_message(commits[0]):
        raise EnvironmentProblem(f"{repo.working_dir}: the root commit is not a fa2patch pristine import")
    for c in commits[1:]:
        if len(c.parents) != 1:
            raise EnvironmentProblem(
                f"{repo.working_dir}: commit {c.hexsha[:12]} is a merge; the series must be linear"
            )
    return commits


def diff(repo: git.Repo, parent: str, child: str) -> str:
    """The diff of one series commit, with every option that affects its text fixed."""
    out = repo.git.diff(
        "--no-color",
        "--no-ext-diff",
        "--no-renames",
        "--full-index",
        "--binary",
        "--diff-algorithm=myers",
        "-U3",
        "--src-prefix=a/",
        "--dst-prefix=b/",
        parent,
        child,
        stdout_as_string=False,
        strip_newline_in_stdout=False,
    )
    return out.decode("utf-8", "surrogateescape")


def recorded_series(repo: git.Repo) -> tuple[str, str] | None:
    """(lock fingerprint, HEAD) recorded by the last replay or export, or None."""
    try:
        fingerprint, head = repo.git.config("--local", "--get", LOCK_KEY).split()
    except (git.GitCommandError, ValueError):
        return None
    return fingerprint, head


def record_series(repo: git.Repo, fingerprint: str) -> None:
    repo.git.config("--local", LOCK_KEY, f"{fingerprint} {repo.head.commit.hexsha}")
