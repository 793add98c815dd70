# SPDX-License-Identifier: BSD-3-Clause
"""The V100 model: loop mixes read from the sm_70 SASS, the phase timing of one CTA
iteration, the memory side (DRAM latency and ceiling), the routes' launch plans, the calibration
against published V100 anchors, and `report`. No GPU and no torch: estimates, not measurements.

Imports fa2patch.common and fa2patch.compile (the built extension's SASS and build_info).
"""
