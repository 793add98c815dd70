# SPDX-License-Identifier: BSD-3-Clause
"""Run ONE case of the long-prefill kernels' guards (the error-flag contract) and print one JSON line.

    python tests/gpu/prefill_guard_cases.py <artifact.so> '<json spec>'

A CUDA graph captures ``gqa_prefill_fwd`` on a valid paged cache (during capture the op skips its
device-side block_table check), then the block_table is corrupted in place and the graph is
replayed, as a server replays a captured graph whose table went bad. The contract (sm70/guard.h):
a page id outside [0, num_blocks) is never dereferenced, its keys read as zeros and get no
weight; the results are finite, and rows left without keys give out = 0 and lse = +inf.

Spec: ``seqlens`` [seqlen_q, seqlen_k], ``hq``, ``hkv``, ``page_size``, ``seed``, ``bad``: the
block-table positions to corrupt (values cycle through -1, num_blocks, 2**30, -2**31), or "all".
Output: ``finite``; against an FP32 reference computed here that drops the corrupted pages' keys,
``rel_l2``, ``max_abs``, ``lse_err`` (rows with keys), ``empty_rows`` and whether they hold out = 0
and lse = +inf; ``eager_rel_l2``: the eager call on the valid table against the full reference.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sm70_cases

BAD_VALUES = (-1, "num_blocks", 1 << 30, -(1 << 31))


def reference(q, kc, vc, ids, good_page, seqlen_k, page, scale):
    """FP32 attention, bottom-right causal, keys of pages with good_page False dropped: (out, lse)."""
    import torch

    sq, hq, d = q.shape
    hkv = kc.shape[2]
    keys = torch.arange(seqlen_k, device=q.device)
    rows, k = ids[keys // page].long(), keys % page
    kf, vf = kc[rows, k].float(), vc[rows, k].float()  # [seqlen_k, hkv, d]
    keep = good_page[keys // page]
    visible = keys[None, :] <= torch.arange(sq, device=q.device)[:, None] + (seqlen_k - sq)
    mask = visible & keep[None, :]
    out = torch.zeros(sq, hq, d, device=q.device)
    lse = torch.full((hq, sq), float("inf"), device=q.device)
    for h in range(hq):
        s = q[:, h].float() @ kf[:, h // (hq // hkv)].T * scale
        s = s.masked_fill(~mask, float("-inf"))
        has = mask.any(1)
        lse_h = torch.logsumexp(s[has], 1)
        out[has, h] = torch.softmax(s[has], 1) @ vf[:, h // (hq // hkv)]
        lse[h, has] = lse_h
    return out, lse


def run(ops, spec: dict) -> dict:
    import torch

    sq, sk = spec["seqlens"]
    hq, hkv, page, d, scale = spec.get("hq", 6), spec.get("hkv", 1), spec["page_size"], 256, 1 / 16
    gen = torch.Generator(device="cpu").manual_seed(spec.get("seed", 7))
    pages = -(-sk // page)
    num_blocks = pages + 3
    q = torch.randn(sq, hq, d, generator=gen).half().cuda()
    kc = torch.randn(num_blocks, page, hkv, d, generator=gen).half().cuda()
    vc = torch.randn(num_blocks, page, hkv, d, generator=gen).half().cuda()
    ids = torch.randperm(num_blocks, generator=gen)[:pages].int().cuda()
    table = ids.clone().view(1, pages)
    out = torch.empty_like(q)
    ws = torch.empty(ops.gqa_prefill_workspace_bytes(sq, sk, hq, hkv), dtype=torch.uint8, device="cuda")

    def call():
        return ops.gqa_prefill_fwd(q, kc, vc, out, table, sk, scale, ws)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()  # eager, valid table
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    full_out, _ = reference(q, kc, vc, ids, torch.ones(pages, dtype=torch.bool, device="cuda"), sk, page, scale)
    eager_rel_l2 = float((out.float() - full_out).norm() / full_out.norm())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lse = call()[1]
    bad = list(range(pages)) if spec["bad"] == "all" else spec["bad"]
    good = torch.ones(pages, dtype=torch.bool, device="cuda")
    for n, pos in enumerate(bad):
        value = BAD_VALUES[n % len(BAD_VALUES)]
        table[0, pos] = num_blocks if value == "num_blocks" else value
        good[pos] = False
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()  # a fault would surface here
    if os.environ.get("FA2PATCH_OP_ONLY") == "1":  # racecheck: our kernels only, no reference GEMMs
        return {"finite": bool(torch.isfinite(out).all())}
    ref_out, ref_lse = reference(q, kc, vc, ids, good, sk, page, scale)
    empty = torch.isinf(ref_lse).T  # [sq, hq]: rows without keys
    got, glse = out.float(), lse.clone()
    norm = ref_out.norm()
    return {
        "finite": bool(torch.isfinite(got).all()),
        "rel_l2": float((got - ref_out).norm() / norm) if norm > 0 else float(got.norm()),
        "max_abs": float((got - ref_out).abs().max()),
        "lse_err": float((glse - ref_lse)[~empty.T].abs().max()) if (~empty).any() else 0.0,
        "empty_rows": int(empty.sum()),
        "empty_rows_ok": bool(
            (got[empty] == 0).all() and torch.isinf(glse.T[empty]).all() and (glse.T[empty] > 0).all()
        ),
        "eager_rel_l2": eager_rel_l2,
    }


def main(argv) -> int:
    return sm70_cases.harness_main(argv, __doc__, run)


if __name__ == "__main__":
    sm70_cases.run_script(main)
