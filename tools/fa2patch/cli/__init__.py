# SPDX-License-Identifier: BSD-3-Clause
"""The `fa2patch` command line: one click group, the commands of each stage, one way to
print a result and exit.

Imports any stage except fa2patch.lab.
"""
