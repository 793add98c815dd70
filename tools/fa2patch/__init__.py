# SPDX-License-Identifier: BSD-3-Clause
"""fa2patch: FlashAttention-2 forward kernels for V100 (SM70) as vLLM's `_vllm_fa2_C`."""

__version__ = "0.1.0"
