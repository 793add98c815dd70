# SPDX-License-Identifier: BSD-3-Clause
"""FlashAttention-2 forward kernels for V100 (compute capability 7.0) as vLLM's `_vllm_fa2_C`,
built by fa2patch, and the vLLM plugin that makes vLLM use them (``fa2patch_vllm.plugin``).

``from fa2patch_vllm import _vllm_fa2_C`` loads the extension the way vLLM's
flash_attn_interface.py does; its operators live in ``torch.ops._vllm_fa2_C``.
"""

import json
from pathlib import Path

# The extension links torch's libraries without a search path of its own (it carries none):
# torch must be loaded first, as vLLM's interface does before it imports the extension.
import torch  # noqa: F401


def build_record() -> dict:
    """What the extension was built against (torch, CUDA, arch) and its sha256, from the wheel."""
    return json.loads((Path(__file__).with_name("build.json")).read_text())
