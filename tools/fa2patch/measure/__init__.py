# SPDX-License-Identifier: BSD-3-Clause
"""Measurement on a GPU: the FP32 reference, smoke, bench (with the card's clocks from
NVML), tune and the routing profiles it writes.

Imports every stage above it except fa2patch.cli and fa2patch.lab.
"""
