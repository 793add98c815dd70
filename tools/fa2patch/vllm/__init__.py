# SPDX-License-Identifier: BSD-3-Clause
"""vLLM integration: the pinned vLLM release's sources, the wheel and the source tree that
vLLM builds (package), vLLM's own CMake, and `doctor --vllm` (what a vLLM environment needs).

Imports fa2patch.common, fa2patch.series and fa2patch.compile.
"""
