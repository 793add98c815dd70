# SPDX-License-Identifier: BSD-3-Clause
"""Ask vLLM's real gate functions whether FlashAttention-2 is usable, in a process that looks
like a vLLM process on a GPU of a given compute capability (run by tests/test_vllm_packaging.py).

    python vllm_gate_probe.py VLLM_SRC CAPABILITY[,CAPABILITY...] [--plugins]

Real: vLLM's source files of the tested release (VLLM_SRC), its plugin loader
(``load_general_plugins``, which finds the installed wheel's entry point), ``_is_fa2_supported``,
``get_flash_attn_version``, ``FlashAttentionBackend.supports_compute_capability``; torch and the
extension. Stubbed (tests/vllm/vllm_stubs.py says what and why): vLLM's heavy subpackages and the GPU
query. Prints one JSON object: per capability, the three gates' answers, and the file that
``vllm.vllm_flash_attn._vllm_fa2_C`` came from.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import vllm_stubs


def main() -> None:
    vllm_src, capabilities, plugins = sys.argv[1], sys.argv[2].split(","), "--plugins" in sys.argv
    caps = [tuple(map(int, c.split("."))) for c in capabilities]
    current = [caps[0]]  # plugins see the first one (vLLM loads them once per process)
    vllm_stubs.install(vllm_src, lambda: current[0], torch_cuda=True)
    from vllm.logger import _configure_vllm_root_logger

    _configure_vllm_root_logger()  # what vLLM's engine does at start (its LoggingConfig is stubbed)
    if plugins:
        from vllm.plugins import load_general_plugins

        load_general_plugins()
    import vllm
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends import fa_utils
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    from vllm.vllm_flash_attn import flash_attn_interface

    result = {}
    for cap in caps:
        current[0] = cap
        result[f"{cap[0]}.{cap[1]}"] = {
            "is_fa2_supported": list(flash_attn_interface._is_fa2_supported()),
            "get_flash_attn_version": fa_utils.get_flash_attn_version(),
            "supports_compute_capability": FlashAttentionBackend.supports_compute_capability(DeviceCapability(*cap)),
        }
    extension = sys.modules.get("vllm.vllm_flash_attn._vllm_fa2_C")
    print(
        json.dumps(
            {
                "gates": result,
                "extension": getattr(extension, "__file__", None),
                "fa2_available": flash_attn_interface.FA2_AVAILABLE,
                "vllm": vllm.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
