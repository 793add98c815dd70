# SPDX-License-Identifier: BSD-3-Clause
"""Measurement on a GPU: the FP32 reference, smoke, bench (with the card's clocks from
NVML), tune and the routing profiles it writes.

Imports fa2patch.common, fa2patch.compile and fa2patch.model.
"""
