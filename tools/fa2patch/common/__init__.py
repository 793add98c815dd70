# SPDX-License-Identifier: BSD-3-Clause
"""The vocabulary every stage shares: errors and exit codes, digests, the project root and
baseline.lock, tables, call shapes, route names and the numerics contract's thresholds.

Imports nothing else of fa2patch.
"""
