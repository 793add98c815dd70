# SPDX-License-Identifier: BSD-3-Clause
"""FP32 reference attention, written here, for smoke tests and the GPU suite.

Semantics follow FA2's forward: causal masks are bottom-right aligned when seqlen_q differs
from seqlen_k; a sliding window (left, right) keeps key j for query i when
``i + sk - sq - left <= j <= i + sk - sq + right`` (negative means unbounded); softcap is
``cap * tanh(s / cap)`` applied to the scaled scores; ALiBi adds ``-slope * |i + sk - sq - j|``,
or, for causal attention, ``slope * j`` (FA2's kernels do this: the same softmax, since the two
differ by a per-row constant, but a different softmax_lse).
Rows whose keys are all masked give zeros and an LSE of +inf (FA2's convention).
"""

import torch

from fa2patch.common import numerics


def attention_ref(
    q, k, v, scale, causal=False, window=(-1, -1), softcap=0.0, alibi_slopes=None, compute_dtype=torch.float32
):
    """One sequence: q [sq, hq, d], k/v [sk, hk, d] -> (out [sq, hq, d], lse [hq, sq]).

    ``compute_dtype=torch.float16`` gives the "fp16 torch" result of FA2's criterion.
    """
    sq, hq, _d = q.shape
    sk, hk, _ = k.shape
    if hq % hk:
        raise ValueError(f"hq={hq} is not a multiple of hk={hk}")
    qf, kf, vf = (t.to(compute_dtype) for t in (q, k, v))
    kf = kf.repeat_interleave(hq // hk, dim=1)
    vf = vf.repeat_interleave(hq // hk, dim=1)
    s = torch.einsum("qhd,khd->hqk", qf, kf).float() * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq, device=q.device).view(-1, 1) + (sk - sq)
    j = torch.arange(sk, device=q.device).view(1, -1)
    if alibi_slopes is not None:
        slopes = alibi_slopes.float().view(-1, 1, 1)
        s = s + slopes * j.view(1, 1, sk) if causal else s - slopes * (i - j).abs().view(1, sq, sk)
    left, right = window
    if causal:
        right = 0
    allowed = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if right >= 0:
        allowed &= j <= i + right
    if left >= 0:
        allowed &= j >= i - left
    s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1)).to(compute_dtype)
    p = torch.nan_to_num(p, nan=0.0)  # all-masked rows: exp(-inf - (-inf))
    out = torch.einsum("hqk,khd->qhd", p, vf)
    lse = torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse)
    return out.float(), lse.float()


def attention_ref_chunked(
    q,
    k,
    v,
    scale,
    causal=False,
    window=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    compute_dtype=torch.float32,
    max_elems=1 << 28,
):
    """attention_ref in chunks of query rows, so that no score block exceeds ``max_elems``.

    Needs a right window of 0 (causal) when it chunks: rows [r0, r1) then see only the keys
    below r1 + sk - sq, and passing exactly those keys keeps every row's bottom-right alignment
    (the offset becomes r0 + sk - sq) and every key's index (ALiBi is unchanged)."""
    sq, hq, d = q.shape
    sk = k.shape[0]
    kw = {
        "causal": causal,
        "window": window,
        "softcap": softcap,
        "alibi_slopes": alibi_slopes,
        "compute_dtype": compute_dtype,
    }
    rows = max(1, max_elems // max(1, hq * sk))
    if rows >= sq:
        return attention_ref(q, k, v, scale, **kw)
    if (0 if causal else window[1]) != 0:
        raise ValueError("a chunked reference needs a right window of 0 (causal)")
    outs, lses = [], []
    for r0 in range(0, sq, rows):
        r1 = min(sq, r0 + rows)
        e = max(0, r1 + sk - sq)
        if e == 0:  # no row of the chunk sees a key
            outs.append(torch.zeros(r1 - r0, hq, d, device=q.device))
            lses.append(torch.full((hq, r1 - r0), float("inf"), device=q.device))
            continue
        o, lse = attention_ref(q[r0:r1], k[:e], v[:e], scale, **kw)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs, 0), torch.cat(lses, 1)


def compare(out, ref, out_fp16_torch) -> dict:
    """max abs and relative L2 error of ``out`` against ``ref``, FA2's bar computed from the fp16
    torch result, and the contract's verdict (``fa2patch.common.numerics``)."""
    diff = (out.float() - ref).abs()
    rel_l2 = (torch.linalg.vector_norm(out.float() - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-30)).item()
    fp16_err = (out_fp16_torch.float() - ref).abs()
    bar = numerics.fa2_bar(fp16_err.max().item() if fp16_err.numel() else 0.0)
    max_abs = diff.max().item() if diff.numel() else 0.0
    finite = bool(torch.isfinite(out.float()).all())
    return {
        "max_abs": max_abs,
        "rel_l2": rel_l2,
        "bar": bar,
        "finite": finite,
        "ok": numerics.meets_contract(max_abs, bar, rel_l2, finite),
    }
