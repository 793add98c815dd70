# SPDX-License-Identifier: BSD-3-Clause
"""The FP32 reference against a per-query loop written from the definitions in its docstring."""

import math

import pytest
import torch

from fa2patch.measure.reference import attention_ref, compare


def naive(q, k, v, scale, causal, window, softcap, slopes):
    sq, hq, d = q.shape
    sk, hk, _ = k.shape
    out = torch.zeros(sq, hq, d, dtype=torch.float64)
    lse = torch.zeros(hq, sq, dtype=torch.float64)
    left, right = window
    if causal:
        right = 0
    for h in range(hq):
        kh = h // (hq // hk)
        for i in range(sq):
            row = i + sk - sq
            scores, keys = [], []
            for j in range(sk):
                if right >= 0 and j > row + right:
                    continue
                if left >= 0 and j < row - left:
                    continue
                s = float(q[i, h].double() @ k[j, kh].double()) * scale
                if softcap > 0:
                    s = softcap * math.tanh(s / softcap)
                if slopes is not None and causal:
                    s += float(slopes[h]) * j  # FA2's causal ALiBi: a row-independent bias
                elif slopes is not None:
                    s -= float(slopes[h]) * abs(row - j)
                scores.append(s)
                keys.append(j)
            if not scores:
                lse[h, i] = math.inf
                continue
            m = max(scores)
            total = sum(math.exp(s - m) for s in scores)
            lse[h, i] = m + math.log(total)
            for s, j in zip(scores, keys, strict=True):
                out[i, h] += math.exp(s - m) / total * v[j, kh].double()
    return out, lse


@pytest.mark.parametrize(
    "sq, sk, hq, hk, causal, window, softcap, alibi",
    [
        (5, 5, 2, 1, False, (-1, -1), 0.0, False),
        (3, 9, 4, 2, True, (-1, -1), 0.0, False),  # bottom-right causal
        (9, 3, 2, 2, True, (-1, -1), 0.0, False),  # first rows fully masked
        (7, 11, 3, 1, False, (2, 1), 0.0, False),  # sliding window
        (4, 6, 2, 1, True, (-1, -1), 5.0, True),  # softcap and ALiBi
    ],
)
def test_reference_matches_naive_definition(sq, sk, hq, hk, causal, window, softcap, alibi):
    g = torch.Generator().manual_seed(sq * 100 + sk)
    q, k, v = (torch.randn(n, h, 16, generator=g).half() for n, h in ((sq, hq), (sk, hk), (sk, hk)))
    slopes = torch.rand(hq, generator=g) if alibi else None
    out, lse = attention_ref(q, k, v, 0.25, causal, window, softcap, slopes)
    exp_out, exp_lse = naive(q, k, v, 0.25, causal, window, softcap, slopes)
    assert torch.allclose(out.double(), exp_out, atol=1e-5)
    finite = torch.isfinite(exp_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert torch.allclose(lse.double()[finite], exp_lse[finite], atol=1e-5)
    if causal and sq > sk:
        assert torch.all(out[: sq - sk] == 0) and torch.all(torch.isinf(lse[:, : sq - sk]))


def test_compare_applies_the_numerics_contract():
    ref = torch.ones(4, 2, 8)
    fp16 = ref + 5e-4
    assert compare(ref + 5e-4, ref, fp16)["ok"]
    assert not compare(ref + 1e-2, ref, fp16)["ok"]  # beyond 2x the fp16 error
    bad = ref.clone()
    bad[0, 0, 0] = float("nan")
    assert not compare(bad, ref, fp16)["ok"]


@pytest.mark.parametrize("sq, sk, alibi", [(40, 100, False), (40, 30, True), (33, 33, False)])
def test_chunked_reference_equals_the_whole(sq, sk, alibi):
    from fa2patch.measure.reference import attention_ref_chunked

    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(n, h, 16, generator=g).half() for n, h in ((sq, 4), (sk, 2), (sk, 2)))
    slopes = torch.rand(4, generator=g) if alibi else None
    whole = attention_ref(q, k, v, 0.25, True, alibi_slopes=slopes)
    chunked = attention_ref_chunked(q, k, v, 0.25, True, alibi_slopes=slopes, max_elems=4 * sk * 7)
    assert torch.allclose(whole[0], chunked[0], atol=1e-6)
    assert torch.equal(torch.isinf(whole[1]), torch.isinf(chunked[1]))
    assert torch.allclose(whole[1][torch.isfinite(whole[1])], chunked[1][torch.isfinite(chunked[1])], atol=1e-5)
    with pytest.raises(ValueError, match="right window of 0"):
        attention_ref_chunked(q, k, v, 0.25, False, max_elems=4 * sk * 7)


def test_the_contract_judges_as_it_says():
    """compare's verdict (thresholds from fa2patch.common.numerics, their one home): an output as far from
    the FP32 reference as torch's own fp16 result meets FA2's bar, one three times as far does not;
    the relative L2 bound decides alone where the bar is wide; a non-finite output never passes;
    bench's envelope is looser than the contract in relative L2."""
    from fa2patch.common import numerics

    g = torch.Generator().manual_seed(3)
    ref = torch.randn(64, 4, 32, generator=g)
    fp16 = ref + 1e-4 * torch.randn(ref.shape, generator=g)  # torch's fp16 result, say
    assert compare(fp16, ref, fp16)["ok"]
    far = compare(ref + 3 * (fp16 - ref), ref, fp16)
    assert not far["ok"] and far["max_abs"] > far["bar"] and far["rel_l2"] <= numerics.REL_L2_MAX
    wide = ref + 100 * (fp16 - ref)  # a bar wide enough for anything below
    for scale, ok in ((0.5, True), (2.0, False)):
        noise = torch.randn(ref.shape, generator=g)
        out = ref + noise * (scale * numerics.REL_L2_MAX * ref.norm() / noise.norm())
        got = compare(out, ref, wide)
        assert got["max_abs"] <= got["bar"] and got["ok"] == ok, (scale, got)
    nan = fp16.clone()
    nan[0, 0, 0] = float("nan")
    assert not compare(nan, ref, fp16)["ok"] and not numerics.within_envelope(0.0, 0.0, False)
    assert numerics.BENCH_ENVELOPE["rel_l2"] > numerics.REL_L2_MAX


def test_no_module_restates_a_threshold():
    """The thresholds live in fa2patch.common.numerics only: the harnesses, bench, smoke and the
    reference import them."""
    import re

    from helpers import REPO

    files = [REPO / "tools" / "fa2patch" / "measure" / n for n in ("reference.py", "bench.py", "smoke.py")]
    files += [REPO / "tests" / "gpu" / n for n in ("sm70_cases.py", "kvcache_cases.py", "test_sm70_numerics.py")]
    for f in files:
        text = f.read_text()
        assert not re.search(r"[<>]=?\s*1e-[235]\b|\b1e-[35]\s*[<>]|\+ 1e-5", text), f
