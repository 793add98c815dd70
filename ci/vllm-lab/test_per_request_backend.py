# SPDX-License-Identifier: BSD-3-Clause
"""fa2patch's V100 backend (packaging/fa2patch_vllm/backend.py) on the GPU lab, per supported vLLM
release: the release's own FlashAttentionMetadata and KV-cache layout, its own
FlashAttentionImpl.forward once per segment, scheduler-like batches of 6/1 heads of 256:

- decodes (4K..64K keys) with one, two or four long prefill chunks: every chunk on the long-prefill
  route (route_stats() per call), the decode rows on the exact route in one call; every request
  within the numerics contract against an FP32 reference; each segment's rows bitwise equal to
  the same segment run alone;
- a batch whose chunks are below the long-prefill range, and a layer with a sliding window or a
  softcap: one call, as vLLM makes it.
"""

import dataclasses
import inspect
import json
import math
from types import SimpleNamespace

import pytest
import torch
import vllm.distributed.parallel_state as parallel_state
from vllm.v1.attention.backends import flash_attn as fa
from vllm.vllm_flash_attn import flash_attn_varlen_func  # noqa: F401 - vLLM's interface loads the extension

from fa2patch.measure.reference import attention_ref_chunked, compare
from fa2patch_vllm import backend

HQ, HKV, D, SCALE, BLOCK = 6, 1, 256, 1 / 16, 16
PREFILL, EXACT = "sm70-gqa-prefill", "sm70-dense"


def _not_initialised():
    raise AssertionError("no context-parallel group in this test")  # what vLLM's AttentionImpl expects then


parallel_state.get_dcp_group = parallel_state.get_pcp_group = _not_initialised
parallel_state.get_dcp_world_size_and_rank = lambda *args: (1, 0)  # 0.20 and newer: no decode context parallelism
if hasattr(fa, "is_quantized_kv_cache"):  # 0.20 and newer: the stubbed kv_cache_interface cannot answer it
    fa.is_quantized_kv_cache = lambda *args, **kwargs: False


def make_impl(window=None, softcap=None):
    params = inspect.signature(backend.V100FlashAttentionImpl.__init__).parameters
    kw = {
        "num_heads": HQ,
        "head_size": D,
        "scale": SCALE,
        "num_kv_heads": HKV,
        "alibi_slopes": None,
        "sliding_window": window,
        "kv_cache_dtype": "auto",
        "logits_soft_cap": softcap,
        "attn_type": fa.AttentionType.DECODER,
    }
    impl = backend.V100FlashAttentionImpl(**{k: v for k, v in kw.items() if k in params})
    impl.vllm_flash_attn_version = 2  # the stubbed platform answers with the lab GPU's capability
    return impl


def layer():
    """The attention layer's scales that vLLM's forward reads (1: no quantization)."""
    return SimpleNamespace(**{f"_{n}_scale": torch.ones((), device="cuda") for n in ("q", "k", "v")})


def cache_shape(blocks: int) -> tuple:
    """This release's KV-cache tensor for one layer."""
    if hasattr(fa.FlashAttentionBackend, "get_kv_cache_shape"):  # before 0.20: (2, blocks, block size, heads, D)
        return tuple(fa.FlashAttentionBackend.get_kv_cache_shape(blocks, BLOCK, HKV, D))
    return (blocks, HKV, BLOCK, 2 * D)  # 0.20 and newer: K and V are the halves of the last dimension


def cache_views(kv_cache):
    """The key and value caches as this release's forward takes them from its cache tensor."""
    if kv_cache.dim() == 5:
        return kv_cache.unbind(0)
    return kv_cache.transpose(1, 2).split(D, dim=-1)


def batch(requests, seed):
    """Inputs for requests [(query rows, keys)]: q, a paged cache in the release's layout, the
    metadata, and vLLM's host view (query_start_loc_cpu, the host sequence lengths)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    rows = [r for r, _ in requests]
    keys = [k for _, k in requests]
    starts = [0]
    for r in rows:
        starts.append(starts[-1] + r)
    pages = [math.ceil(k / BLOCK) for k in keys]
    kv_cache = torch.randn(cache_shape(sum(pages) + 1), generator=g, device="cuda", dtype=torch.float16)
    perm = torch.randperm(sum(pages), generator=g, device="cuda").to(torch.int32) + 1  # page 0 never used
    table = torch.zeros(len(requests), max(pages), dtype=torch.int32, device="cuda")
    at = 0
    for i, n in enumerate(pages):
        table[i, :n] = perm[at : at + n]
        at += n
    q = torch.randn(starts[-1], HQ, D, generator=g, device="cuda", dtype=torch.float16)
    values = {
        "num_actual_tokens": starts[-1],
        "max_query_len": max(rows),
        "query_start_loc": torch.tensor(starts, dtype=torch.int32, device="cuda"),
        "max_seq_len": max(keys),
        "seq_lens": torch.tensor(keys, dtype=torch.int32, device="cuda"),
        "block_table": table,
        "slot_mapping": torch.zeros(starts[-1], dtype=torch.int64, device="cuda"),
        "use_cascade": False,
        "common_prefix_len": 0,
        "cu_prefix_query_lens": None,
        "prefix_kv_lens": None,
        "suffix_kv_lens": None,
    }
    fields = {f.name for f in dataclasses.fields(fa.FlashAttentionMetadata)}
    md = fa.FlashAttentionMetadata(**{k: v for k, v in values.items() if k in fields})
    host = SimpleNamespace(
        query_start_loc_cpu=torch.tensor(starts, dtype=torch.int32),
        _seq_lens_cpu=torch.tensor(keys, dtype=torch.int32),
        seq_lens_cpu_upper_bound=torch.tensor(keys, dtype=torch.int32),
    )
    md.fa2patch_segments = backend.V100FlashAttentionMetadataBuilder.segments_of(md, host)
    return q, kv_cache, md, starts


def forward(impl, q, kv_cache, md):
    out = torch.full_like(q, float("nan"))
    impl.forward(layer(), q, torch.zeros_like(q[:, :HKV]), torch.zeros_like(q[:, :HKV]), kv_cache, md, out)
    torch.cuda.synchronize()
    return out


def routes():
    stats = json.loads(torch.ops._vllm_fa2_C.route_stats())["devices"]
    return stats[str(torch.cuda.current_device())]["routes"] if stats else {}


def delta(before, after):
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def reference(q, kv_cache, md, starts, i, window=(-1, -1), softcap=0.0):
    k_cache, v_cache = cache_views(kv_cache)
    n = int(md.seq_lens[i])
    pages = md.block_table[i, : math.ceil(n / BLOCK)].long()
    k = k_cache[pages].reshape(-1, HKV, D)[:n]
    v = v_cache[pages].reshape(-1, HKV, D)[:n]
    qi = q[starts[i] : starts[i + 1]]
    kw = {"causal": True, "window": window, "softcap": softcap}
    ref, _ = attention_ref_chunked(qi, k, v, SCALE, **kw)
    ref16, _ = attention_ref_chunked(qi, k, v, SCALE, compute_dtype=torch.float16, **kw)
    return ref, ref16


DECODES = [(1, 4096 + 1920 * i) for i in range(32)]  # 32 decodes over 4K..64K keys
BATCHES = {
    "decodes+1-chunk": [*DECODES, (4096, 65536)],
    "decodes+2-chunks": [*DECODES[:8], (2048, 40000), (4096, 65536)],
    "decodes+4-chunks": [*DECODES[:8], (1024, 16384), (3000, 30000), (2048, 20000), (4096, 65536)],
}


@pytest.mark.parametrize("name", sorted(BATCHES))
@torch.inference_mode()
def test_every_chunk_on_the_long_prefill_route(name):
    requests = BATCHES[name]
    chunks = sum(r >= 1024 for r, _ in requests)
    impl = make_impl()
    q, kv_cache, md, starts = batch(requests, seed=len(requests))
    assert md.fa2patch_segments is not None and len(md.fa2patch_segments) == chunks + 1
    before = routes()
    out = forward(impl, q, kv_cache, md)
    assert delta(before, routes()) == {PREFILL: chunks, EXACT: 1}
    for i in range(len(requests)):
        ref, ref16 = reference(q, kv_cache, md, starts, i)
        c = compare(out[starts[i] : starts[i + 1]], ref, ref16)
        assert c["ok"], (i, requests[i], c)
    for seg, seg_md in md.fa2patch_segments:  # each segment alone: the same bits
        t0, t1 = seg.first_token, seg.last_token
        alone = torch.full_like(q[t0:t1], float("nan"))
        impl.forward(layer(), q[t0:t1], q[t0:t1, :HKV], q[t0:t1, :HKV], kv_cache, seg_md, alone)
        torch.cuda.synchronize()
        assert torch.equal(alone.view(torch.int16), out[t0:t1].view(torch.int16)), seg
    again = forward(impl, q, kv_cache, md)  # repeatable
    assert torch.equal(again.view(torch.int16), out.view(torch.int16))


@pytest.mark.parametrize(
    "requests, layer",
    [
        ([*DECODES[:8], (1023, 65536), (4096, 16383)], {}),  # chunks below the range: one exact call
        ([*DECODES[:8], (4096, 65536)], {"window": 4096}),  # a windowed layer: vLLM's one call
        ([*DECODES[:8], (4096, 65536)], {"softcap": 30.0}),  # a softcap layer: vLLM's one call
    ],
    ids=["below-range", "window", "softcap"],
)
@torch.inference_mode()
def test_one_call_where_nothing_can_take_the_long_prefill_route(requests, layer):
    impl = make_impl(**layer)
    q, kv_cache, md, starts = batch(requests, seed=7)
    before = routes()
    out = forward(impl, q, kv_cache, md)
    assert delta(before, routes()) == {EXACT: 1}
    window = (layer["window"] - 1, 0) if "window" in layer else (-1, -1)
    for i in range(len(requests)):
        ref, ref16 = reference(q, kv_cache, md, starts, i, window, layer.get("softcap", 0.0))
        c = compare(out[starts[i] : starts[i + 1]], ref, ref16)
        assert c["ok"], (i, requests[i], c)
