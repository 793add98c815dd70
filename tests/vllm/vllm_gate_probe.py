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
    backend = backend_facts(caps[0]) if "--backend" in sys.argv else None
    extension = sys.modules.get("vllm.vllm_flash_attn._vllm_fa2_C")
    print(
        json.dumps(
            {
                "gates": result,
                "extension": getattr(extension, "__file__", None),
                "fa2_available": flash_attn_interface.FA2_AVAILABLE,
                "vllm": vllm.__version__,
                "backend": backend,
            }
        )
    )


def backend_facts(cap) -> dict:
    """FLASH_ATTN's class as vLLM's registry resolves it, and, for fa2patch's backend, one batch's
    segments restricted on this release's own FlashAttentionMetadata (CPU tensors)."""
    import dataclasses
    import inspect
    from types import SimpleNamespace

    import torch
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadata
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    cls = AttentionBackendEnum.FLASH_ATTN.get_class()
    facts = {
        "path": f"{cls.__module__}.{cls.__qualname__}",
        "supports_capability": cls.supports_compute_capability(DeviceCapability(*cap)),
        "cudagraph_support": cls.get_builder_cls()._cudagraph_support.name,
        "reorder_batch_threshold": cls.get_builder_cls().reorder_batch_threshold,
    }
    if not facts["path"].startswith("fa2patch_vllm."):
        return facts
    from fa2patch_vllm import backend, segments

    # The builder plans a split only for heads the long-prefill route serves, from the attributes
    # this release's own builder sets in __init__ (num_heads_q; kv_cache_spec from its base class).
    builder = cls.get_builder_cls()
    inits = "".join(
        inspect.getsource(f) for c in builder.__mro__[1:] if inspect.isfunction(f := vars(c).get("__init__"))
    )
    facts["builder_sets"] = {name: f"self.{name} =" in inits for name in ("num_heads_q", "kv_cache_spec")}
    facts["long_prefill_group"] = {
        f"{hq}/{hkv}x{d}": builder.long_prefill_group(
            SimpleNamespace(num_heads_q=hq, kv_cache_spec=SimpleNamespace(head_size=d, num_kv_heads=hkv))
        )
        for hq, hkv, d in ((6, 1, 256), (32, 8, 128), (17, 1, 256), (48, 4, 256))
    }

    keys = [300, 20000, 65536]  # two decodes and a chunk of 4096 rows
    starts = [0, 1, 2, 4098]
    values = {
        "num_actual_tokens": 4098,
        "max_query_len": 4096,
        "query_start_loc": torch.tensor(starts, dtype=torch.int32),
        "max_seq_len": 65536,
        "seq_lens": torch.tensor(keys, dtype=torch.int32),
        "block_table": torch.arange(3 * 4096, dtype=torch.int32).reshape(3, 4096),
        "slot_mapping": torch.arange(4098, dtype=torch.int64),
        "use_cascade": False,
        "common_prefix_len": 0,
        "cu_prefix_query_lens": None,
        "prefix_kv_lens": None,
        "suffix_kv_lens": None,
    }
    fields = [f.name for f in dataclasses.fields(FlashAttentionMetadata)]
    md = FlashAttentionMetadata(**{k: v for k, v in values.items() if k in fields})
    plan = segments.plan(starts, keys, segments.Thresholds(1024, 16384))
    facts["segments"] = [
        {
            "kind": seg.kind,
            "num_actual_tokens": r.num_actual_tokens,
            "query_start_loc": r.query_start_loc.tolist(),
            "seq_lens": r.seq_lens.tolist(),
            "block_rows": r.block_table[:, 0].tolist(),
            "slots": [int(r.slot_mapping[0]), int(r.slot_mapping[-1])],
            "max_seqlen": [r.max_query_len, r.max_seq_len],
        }
        for seg in plan
        for r in [backend.restricted(md, seg)]
    ]
    facts["profile_run"] = profile_run_facts(backend)
    return facts


def profile_run_facts(backend) -> dict:
    """vLLM's profiling run (attn_metadata None) through the impl and this release's own
    FlashAttentionImpl.forward, with an extension stand-in whose workspace is 1,000 bytes per row plus
    the query heads: what the impl reserves for which layer and batch."""
    import json
    from types import SimpleNamespace

    import torch
    from vllm.v1.attention.backends import flash_attn

    limits = {"enabled": True, "min_seqlen_q": 1024, "min_seqlen_k": 16384, "max_group": 16}
    limits["workspace_cap_bytes"] = 10_000_000  # the stand-in's 16,384 rows exceed it
    backend.extension_ops = lambda: SimpleNamespace(
        route_stats=lambda: json.dumps({"long_prefill": limits}),
        gqa_prefill_workspace_bytes=lambda q, k, hq, hk: 1000 * q + hq,
    )
    ran = []
    layers = ((4096, 12, 2, 256), (4096, 12, 2, 256), (512, 12, 2, 256), (4096, 32, 8, 128), (16384, 12, 2, 256))
    for rows, hq, hkv, d in layers:
        impl = object.__new__(backend.V100FlashAttentionImpl)
        impl.__dict__.update(
            num_heads=hq, num_kv_heads=hkv, head_size=d, attn_type=flash_attn.AttentionType.DECODER,
            sliding_window=None, logits_soft_cap=None, alibi_slopes=None, vllm_flash_attn_version=2,
        )  # fmt: skip
        query = torch.ones(rows, hq, d, dtype=torch.float16)
        out = impl.forward(None, query, query, query, None, None, output=torch.ones_like(query))
        ran.append({"rows": rows, "heads": f"{hq}/{hkv}x{d}", "output_zeroed": not out.any().item()})
    return {"calls": ran, "reserved": [[*key, size] for key, size in backend.RESERVED.items()]}


if __name__ == "__main__":
    main()
