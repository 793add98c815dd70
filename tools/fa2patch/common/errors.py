# SPDX-License-Identifier: BSD-3-Clause
"""Typed failures and the CLI exit codes they map to (documented in README.md)."""

EXIT_CHECK_FAILED = 1  # a verification found a mismatch, a breach or tampering
EXIT_USAGE = 2  # bad arguments, a missing or unusable tool or file
EXIT_NOTHING_TO_LAUNCH = 3  # `smoke`, `bench`, `tune`: no GPU of a built architecture, or no route to launch


class Fa2PatchError(Exception):
    exit_code = EXIT_USAGE


class CheckFailed(Fa2PatchError):
    """A hash, digest, schema, budget or SASS check did not hold."""

    exit_code = EXIT_CHECK_FAILED


class EnvironmentProblem(Fa2PatchError):
    """Something the command needs is missing or unusable (tool, file, network)."""

    exit_code = EXIT_USAGE


class NothingToLaunch(Fa2PatchError):
    """`smoke` or `bench` found nothing to run here: no GPU, no build for it, or no route."""

    exit_code = EXIT_NOTHING_TO_LAUNCH


def mismatch(what: str, where: str, expected, actual) -> str:
    """The one message shape for every mismatch: what, which file, expected, actual."""
    return f"{where}: {what} mismatch\n  expected: {expected}\n  actual:   {actual}"
