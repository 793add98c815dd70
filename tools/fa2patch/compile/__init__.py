# SPDX-License-Identifier: BSD-3-Clause
"""Compiling and checking the extension (`fa2patch build`, `verify`): the toolchain (clang 22 or
nvcc with the CUDA 12.8 wheels), the build description of the patched tree, the ninja build and
its manifest (builder.py), the built extension's probes (build_info, SASS), and verify (schemas,
hygiene, register budgets).

Imports fa2patch.common only.
"""
