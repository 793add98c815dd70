# SPDX-License-Identifier: BSD-3-Clause
"""The long-prefill GPU harness (tests/gpu/prefill_cases.py) on the CPU: an exact stand-in for
gqa_prefill_fwd passes it, a slightly wrong one fails it, and its adversarial inputs and vLLM
cache views are what they claim to be."""

import math
import sys

import pytest
import torch

from helpers import REPO, load_script

sys.path.insert(0, str(REPO / "tests" / "gpu"))


def _load():
    return load_script(REPO / "tests" / "gpu" / "prefill_cases.py", "prefill_cases")


@pytest.fixture
def pc(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    return _load()


def keys_of(k, v, block_table, seqlen_k):
    """The first seqlen_k keys of a contiguous or paged (block_table [1, pages]) cache."""
    if block_table is None:
        return k[:seqlen_k], v[:seqlen_k]
    page = k.shape[1]
    ids = block_table[0].tolist()
    idx = [(ids[j // page], j % page) for j in range(seqlen_k)]
    return torch.stack([k[a, b] for a, b in idx]), torch.stack([v[a, b] for a, b in idx])


def exact_op(q, k, v, out, block_table, seqlen_k, scale, workspace, error=0.0):
    from fa2patch.measure.reference import attention_ref

    kk, vv = keys_of(k, v, block_table, seqlen_k)
    o, lse = attention_ref(q, kk, vv, scale, causal=True)
    out.copy_((o * (1 + error)).half())
    return [out, lse]


def workspace_bytes(sq, sk, hq, hk):
    return 1024


def run(pc, raw, op=exact_op):
    spec, extra = pc.split_spec(raw)
    x = pc.sm70_cases.build_inputs(spec, "cpu")
    if extra["dominated"]:
        pc.adversarial(spec, extra, x)
    if extra["vllm_cache"]:
        pc.vllm_views(spec, x)
    return spec, x, pc.sm70_cases.run_numerics(pc.adapter(op, workspace_bytes, extra), spec, x)


@pytest.mark.parametrize(
    "raw",
    [
        {"seqlens": [[40, 100]]},
        {"seqlens": [[30, 70]], "hq": 8, "hkv": 2, "page_size": 16, "vllm_cache": True, "poison": True},
        {"seqlens": [[20, 10]], "hq": 4, "hkv": 1},
    ],
)
def test_exact_stand_in_passes(pc, raw):
    _, _, r = run(pc, raw)
    assert r["ok"] and r["finite"] and r["guard_ok"] and r["returns_out"] and r["lse_max_err"] <= 1e-3


def test_a_slightly_wrong_op_fails(pc):
    _, _, r = run(pc, {"seqlens": [[40, 100]]}, op=lambda *a: exact_op(*a, error=0.01))
    assert not r["ok"] and r["max_abs"] > r["bar"]


def test_vllm_cache_views_have_vllms_strides_and_the_same_keys(pc):
    spec, _extra = pc.split_spec({"seqlens": [[10, 50]], "hq": 8, "hkv": 2, "page_size": 16})
    x = pc.sm70_cases.build_inputs(spec, "cpu")
    before = keys_of(x["k"], x["v"], x["block_table"], 50)
    pc.vllm_views(spec, x)
    assert x["k"].stride() == (2 * 16 * 256 * 2, 2 * 256, 16 * 2 * 256, 1)  # row stride 2 d
    after = keys_of(x["k"], x["v"], x["block_table"], 50)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


@pytest.mark.parametrize("mode", ["first", "diagonal"])
def test_dominated_rows_are_dominated_by_one_key_with_scores_near_100(pc, mode):
    spec, extra = pc.split_spec({"seqlens": [[40, 200]], "dominated": mode})
    x = pc.sm70_cases.build_inputs(spec, "cpu")
    pc.adversarial(spec, extra, x)
    q, k = x["q"].float(), x["k"].float()
    s = torch.einsum("qhd,kd->hqk", q, k[:, 0]) * spec["scale"]  # hkv = 1
    mask = torch.arange(200).view(1, -1) <= torch.arange(40).view(-1, 1) + 160
    s = s.masked_fill(~mask, -math.inf)
    heads = range(6) if mode == "first" else [0]
    for h in heads:
        top = s[h].max(dim=-1)
        assert ((top.values > 80) & (top.values < 130)).all()
        p = torch.softmax(s[h], dim=-1)
        assert (p.max(dim=-1).values > 0.999).all()
        want = torch.zeros(40, dtype=torch.long) if mode == "first" else torch.arange(160, 200)
        assert torch.equal(top.indices, want)
