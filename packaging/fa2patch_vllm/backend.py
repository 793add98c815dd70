# SPDX-License-Identifier: BSD-3-Clause
"""fa2patch's V100 attention backend: vLLM's FLASH_ATTN backend, with each long prefill chunk of a
scheduler batch in a call of its own, so that fa2patch's router can send it to the long-prefill
route while the batch's other rows (decodes, short chunks) take the exact route in one call.

Registered by the plugin over FLASH_ATTN on compute capability 7.0 only (vLLM's own registry,
``register_backend``; FA2PATCH_VLLM_BACKEND=0 keeps vLLM's class). Everything else is vLLM's: the
subclasses below only add the host-side split (``segments.plan``, from the host copies vLLM keeps:
``query_start_loc_cpu`` and the sequence lengths) to the metadata builder, and call vLLM's own
``FlashAttentionImpl.forward`` once per segment, on views of the query, key, value and output rows
and on a copy of the metadata restricted to the segment's requests. Nothing is copied on the device
but each segment's query offsets; nothing is read back from it. A batch without a qualifying chunk,
a layer the long-prefill route cannot serve (head dim, group, window, softcap, ALiBi, not causal,
encoder or cross attention, context parallelism), cascade attention or metadata this module does not
know how to restrict is one call, as in vLLM. Uniform decode batches (vLLM's full CUDA graphs) never
split: AttentionCGSupport stays vLLM's UNIFORM_BATCH.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging

import torch
from vllm.v1.attention.backends import flash_attn
from vllm.v1.attention.backends.flash_attn import (
    FlashAttentionBackend,
    FlashAttentionImpl,
    FlashAttentionMetadataBuilder,
)

from . import segments

logger = logging.getLogger("vllm.fa2patch_vllm")
LONG_PREFILL_HEAD_DIM = 256
# Per-request metadata of some releases that a segment would have to restrict too: set, no split.
UNKNOWN_PER_REQUEST = ("mm_prefix_query_range_tensor", "rswa_prefix_lens", "dcp_context_kv_lens")


def long_prefill_limits() -> dict:
    """The extension's long-prefill range and switch (route_stats()["long_prefill"]; the switch,
    VLLM_FLASH_V100_PREFILL_D256_GQA_ARCH_128K_EXPERIMENTAL, is read anew on every build)."""
    return json.loads(extension_ops().route_stats())["long_prefill"]


def extension_ops():
    return torch.ops._vllm_fa2_C


# Bytes reserved in vLLM's profiling run, per (device, query rows, query heads, KV heads).
RESERVED: dict[tuple, int] = {}


def reserve_long_prefill_workspace(rows: int, heads_q: int, heads_k: int, device) -> int:
    """Allocate, and free at once, what a long prefill chunk of ``rows`` query rows needs: the route's
    workspace (gqa_prefill_workspace_bytes; it does not grow with the keys) and the router's transient
    buffers (an LSE of 8 bytes per query row and head). vLLM sizes its KV cache from the peak of torch's
    allocations in a profiling run whose batch (max_num_batched_tokens rows, attn_metadata None) never
    reaches the long-prefill route; the workspace, allocated later through torch's allocator, would
    come out of the headroom vLLM left for everything else (0.87 GiB for 4,096 rows of 12/2 x 256).
    Allocated here, it is in the profile's peak, and vLLM leaves room for it. Nothing for batches no
    chunk of which could qualify, when the route is off, or when the workspace would exceed the route's
    cap (FA2PATCH_PREFILL_WORKSPACE_CAP_MIB: such chunks take the exact route). Returns the bytes reserved."""
    limits = long_prefill_limits()
    if not limits["enabled"] or rows < int(limits["min_seqlen_q"]):
        return 0
    key = (str(device), rows, heads_q, heads_k)
    if key not in RESERVED:
        workspace = int(extension_ops().gqa_prefill_workspace_bytes(rows, rows, heads_q, heads_k))
        if workspace > int(limits["workspace_cap_bytes"]):
            return 0
        size = workspace + 8 * rows * heads_q
        torch.empty(size, dtype=torch.uint8, device=device)
        RESERVED[key] = size
        logger.info(
            "fa2patch-vllm: %d bytes for the long-prefill route (workspace and buffers of a chunk of %d rows, "
            "%d/%d heads) in vLLM's profiling run, so that its KV cache leaves room for them",
            size,
            rows,
            heads_q,
            heads_k,
        )
    return RESERVED[key]


@functools.cache
def max_group() -> int:
    return int(long_prefill_limits()["max_group"])


def long_prefill_heads(head_size: int, num_heads: int, num_kv_heads: int) -> bool:
    """Heads the long-prefill route serves: head dim 256, whole groups of at most max_group()."""
    group, rest = divmod(num_heads, num_kv_heads)
    return head_size == LONG_PREFILL_HEAD_DIM and rest == 0 and group <= max_group()


def host_seq_lens(common) -> list[int] | None:
    """Keys per request, from vLLM's host copy: ``seq_lens_cpu_upper_bound`` (0.20 and newer) or
    ``_seq_lens_cpu`` (earlier; None under async speculative decoding, where reading the
    ``seq_lens_cpu`` property would copy from the device: then no split)."""
    for name in ("seq_lens_cpu_upper_bound", "_seq_lens_cpu"):
        host = getattr(common, name, None)
        if host is not None:
            return [int(x) for x in host.tolist()]
    return None


def restricted(md, seg: segments.Segment):
    """A copy of the batch's metadata for one segment's requests and query rows."""
    r0, r1, t0, t1 = seg.first_request, seg.last_request, seg.first_token, seg.last_token
    return dataclasses.replace(
        md,
        num_actual_tokens=t1 - t0,
        max_query_len=seg.max_seqlen_q,
        query_start_loc=md.query_start_loc[r0 : r1 + 1] - t0,
        max_seq_len=seg.max_seqlen_k,
        seq_lens=md.seq_lens[r0:r1],
        block_table=md.block_table[r0:r1],
        slot_mapping=md.slot_mapping[t0:t1],
        scheduler_metadata=None,
    )


class V100FlashAttentionMetadataBuilder(FlashAttentionMetadataBuilder):
    # Decode requests first in the batch (vLLM's reorder): their rows form one run.
    reorder_batch_threshold: int | None = 1

    def build(self, common_prefix_len, common_attn_metadata, *args, **kwargs):
        md = super().build(common_prefix_len, common_attn_metadata, *args, **kwargs)
        try:
            md.fa2patch_segments = self.segments_of(md, common_attn_metadata) if self.long_prefill_group() else None
        except Exception as exc:  # metadata of an unforeseen kind: vLLM's one call, said loudly
            md.fa2patch_segments = None
            if not getattr(self, "_fa2patch_warned", False):
                self._fa2patch_warned = True
                logger.warning("fa2patch-vllm: this batch runs as one call (no per-request split): %r", exc)
        return md

    def long_prefill_group(self) -> bool:
        """This KV-cache group's layers can take the long-prefill route by their heads (the impl
        checks each layer's other properties): no split is planned for a model whose heads never
        can. ``num_heads_q`` is vLLM's builder's own attribute; without it, plan (the impl decides)."""
        spec = self.kv_cache_spec
        heads = getattr(self, "num_heads_q", None)
        return heads is None or long_prefill_heads(spec.head_size, heads, spec.num_kv_heads)

    @staticmethod
    def segments_of(md, common) -> list | None:
        """[(segment, its metadata)] where a chunk can take the long-prefill route alone, else None."""
        if getattr(md, "use_cascade", False) or any(getattr(md, f, None) is not None for f in UNKNOWN_PER_REQUEST):
            return None
        keys = host_seq_lens(common)
        limits = long_prefill_limits()
        if keys is None or not limits["enabled"]:
            return None
        plan = segments.plan(
            [int(x) for x in common.query_start_loc_cpu.tolist()],
            keys,
            segments.Thresholds(limits["min_seqlen_q"], limits["min_seqlen_k"]),
        )
        return [(s, restricted(md, s)) for s in plan] if segments.worth_splitting(plan) else None


class V100FlashAttentionImpl(FlashAttentionImpl):
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None, *args, **kwargs):
        if attn_metadata is None and self.long_prefill_layer():  # vLLM's profiling run
            reserve_long_prefill_workspace(query.shape[0], self.num_heads, self.num_kv_heads, query.device)
        parts = getattr(attn_metadata, "fa2patch_segments", None)
        if not parts or not self.long_prefill_layer():
            return super().forward(layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
        for seg, md in parts:
            t0, t1 = seg.first_token, seg.last_token
            super().forward(layer, query[t0:t1], key[t0:t1], value[t0:t1], kv_cache, md, output[t0:t1], *args, **kwargs)
        return output

    def long_prefill_layer(self) -> bool:
        """This layer's calls can take the long-prefill route (the extension decides per call)."""
        return (
            self.attn_type == flash_attn.AttentionType.DECODER
            and long_prefill_heads(self.head_size, self.num_heads, self.num_kv_heads)
            and self.sliding_window in (None, (-1, -1))
            and not self.logits_soft_cap
            and self.alibi_slopes is None
            and getattr(self, "dcp_world_size", 1) == 1
            and getattr(self, "sinks", None) is None
        )


class V100FlashAttentionBackend(FlashAttentionBackend):
    """vLLM's FLASH_ATTN with per-request segments on compute capability 7.0."""

    @staticmethod
    def get_impl_cls():
        return V100FlashAttentionImpl

    @staticmethod
    def get_builder_cls():
        return V100FlashAttentionMetadataBuilder

    @classmethod
    def supports_compute_capability(cls, capability) -> bool:
        from .plugin import V100, fa2patch_ops_loaded

        if (capability.major, capability.minor) == V100 and fa2patch_ops_loaded():
            return True
        return super().supports_compute_capability(capability)
