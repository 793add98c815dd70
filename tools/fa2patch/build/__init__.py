# SPDX-License-Identifier: BSD-3-Clause
"""Building and checking the extension: the toolchain (clang 22 or nvcc with the CUDA 12.8
wheels), the build description of the patched tree, the ninja build and its manifest, the
built extension's probes (build_info, SASS), and verify (schemas, hygiene, register budgets).

Imports fa2patch.common and fa2patch.series.
"""
