# SPDX-License-Identifier: BSD-3-Clause
"""The patch series: fetch and verify the pristine FA2 sdist, extract it safely, replay the
patches into a git workspace, export workspace commits back to patches/, and check that lock,
patches, pins and workspace agree.

Imports fa2patch.common only.
"""
