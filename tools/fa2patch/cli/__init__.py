# SPDX-License-Identifier: BSD-3-Clause
"""The `fa2patch` command line: one click group, the commands of each stage, one way to
print a result and exit.

Imports every stage but fa2patch.lab.
"""
