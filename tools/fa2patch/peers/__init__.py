# SPDX-License-Identifier: BSD-3-Clause
"""Peers modelled from their own compiled SASS with the same model (today vLLM's
TRITON_ATTN): the offline compile and extraction, and the launches they make per shape.

Imports fa2patch.common, fa2patch.compile, fa2patch.vllm (the pinned vLLM sources) and fa2patch.model.
"""
