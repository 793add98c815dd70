# SPDX-License-Identifier: BSD-3-Clause
"""Peers modelled from their own compiled SASS with the same model (vLLM's TRITON_ATTN, uncalibrated;
1Cat-vLLM's #628 long prefill and its q=1 decode graph, calibrated like our routes): the offline
compile and extraction, and the launches they make per shape.

Imports fa2patch.common, fa2patch.compile, fa2patch.vllm (the pinned vLLM sources) and fa2patch.model.
"""
