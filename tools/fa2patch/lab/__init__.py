# SPDX-License-Identifier: BSD-3-Clause
"""The logic of the CI and GPU lab scripts (ci/*.sh): `python -m fa2patch.lab.labtools`.

Imports any stage except fa2patch.cli.
"""
