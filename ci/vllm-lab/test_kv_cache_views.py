# SPDX-License-Identifier: BSD-3-Clause
"""vLLM's KV-cache layout through vLLM's interface, as the release under test lays it out
(vllm/v1/attention/backends/flash_attn.py):

- vLLM 0.20 and newer keep one cache tensor per layer, (num_blocks, num_kv_heads, block_size,
  2 * head_size), and FlashAttentionImpl.forward hands FA2 ``kv_cache.transpose(1, 2).split(head_size,
  dim=-1)`` then ``canonicalize_singleton_dim_strides``: token stride 2·D, head stride block_size·2·D.
- Earlier releases (0.16.0, 0.19.1) keep ``FlashAttentionBackend.get_kv_cache_shape``'s (2, num_blocks,
  block_size, num_kv_heads, head_size) and hand FA2 ``kv_cache.unbind(0)``; with the HND layout
  (``get_kv_cache_stride_order``) those views are not contiguous: token stride D, head stride block_size·D.

Checked against vLLM's own ``ref_paged_attn`` (from its test file) on contiguous copies, with vLLM's
tolerances."""

import pytest
import torch
from test_flash_attn import ref_paged_attn
from vllm.utils import torch_utils
from vllm.utils.torch_utils import set_random_seed
from vllm.vllm_flash_attn import flash_attn_varlen_func

HND = (0, 1, 3, 2, 4)  # get_kv_cache_stride_order() for the HND layout (before 0.20), its own inverse


def vllm_views(num_blocks: int, num_kv_heads: int, block_size: int, head_size: int):
    """The key and value caches as this release's FlashAttentionImpl.forward hands them to FA2, with
    (token stride, head stride)."""
    if hasattr(torch_utils, "canonicalize_singleton_dim_strides"):  # 0.20 and newer
        kv = torch.randn(num_blocks, num_kv_heads, block_size, 2 * head_size, dtype=torch.float16)
        k, v = kv.transpose(1, 2).split(head_size, dim=-1)
        views = [torch_utils.canonicalize_singleton_dim_strides(t) for t in (k, v)]
        return views, (2 * head_size, block_size * 2 * head_size)
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

    shape = FlashAttentionBackend.get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size)
    kv = torch.randn([shape[i] for i in HND], dtype=torch.float16).permute(HND)
    return list(kv.unbind(0)), (head_size, block_size * head_size)


@pytest.mark.parametrize("seq_lens", [[(1, 1328), (5, 18), (129, 463)], [(1, 523), (1, 37), (1, 2011)]])
@pytest.mark.parametrize("num_heads", [(4, 4), (8, 2), (6, 1)])
@pytest.mark.parametrize("head_size", [64, 128, 256])
@pytest.mark.parametrize("block_size", [16, 32])
@torch.inference_mode()
def test_vllm_kv_cache_views(seq_lens, num_heads, head_size, block_size):
    torch.set_default_device("cuda")
    set_random_seed(0)
    num_blocks = 2048
    query_lens, kv_lens = [s[0] for s in seq_lens], [s[1] for s in seq_lens]
    num_query_heads, num_kv_heads = num_heads
    scale = head_size**-0.5
    query = torch.randn(sum(query_lens), num_query_heads, head_size, dtype=torch.float16)
    (key_cache, value_cache), (token_stride, head_stride) = vllm_views(num_blocks, num_kv_heads, block_size, head_size)
    assert key_cache.stride(1) == token_stride
    if num_kv_heads > 1:  # with one KV head torch calls every one of these views contiguous
        assert not key_cache.is_contiguous() and key_cache.stride(2) == head_stride
    cu_query_lens = torch.tensor([0, *query_lens], dtype=torch.int32).cumsum(dim=0, dtype=torch.int32)
    seqused_k = torch.tensor(kv_lens, dtype=torch.int32)
    blocks_per_seq = (max(kv_lens) + block_size - 1) // block_size
    block_tables = torch.randint(0, num_blocks, (len(seq_lens), blocks_per_seq), dtype=torch.int32)
    out = torch.empty_like(query)
    flash_attn_varlen_func(
        q=query,
        k=key_cache,
        v=value_cache,
        out=out,
        cu_seqlens_q=cu_query_lens,
        seqused_k=seqused_k,
        max_seqlen_q=max(query_lens),
        max_seqlen_k=max(kv_lens),
        softmax_scale=scale,
        causal=True,
        window_size=[-1, -1],
        block_table=block_tables,
        softcap=0,
        fa_version=2,
    )
    ref = ref_paged_attn(
        query=query,
        key_cache=key_cache.contiguous(),
        value_cache=value_cache.contiguous(),
        query_lens=query_lens,
        kv_lens=seqused_k,
        block_tables=block_tables,
        scale=scale,
    )
    assert out.abs().max() > 0
    torch.testing.assert_close(out, ref, atol=1.5e-2, rtol=1e-2)
