# SPDX-License-Identifier: BSD-3-Clause
"""The GPU fuzz (tests/gpu/fuzz_calls.py) on the CPU, through sm70_cases' exact stand-in op: with the
real op's input checks in front it must find nothing; without them it must flag the invalid calls; with
1% off in `out` it must flag the checked ones. So the fuzz can fail on the lab."""

import itertools

import pytest
import torch

from helpers import REPO, load_script

GPU_TESTS = REPO / "tests" / "gpu"


@pytest.fixture(scope="module")
def fuzz():
    return load_script(GPU_TESTS / "fuzz_calls.py", "fuzz_calls")


def checked(reference):
    """``reference`` behind the checks varlen_fwd makes of its inputs, each a typed error."""

    def op(q, k, v, out, cu_q, cu_k, seqused_k, leftpad_k, block_table, *rest):
        for t in (q, k):
            if t.data_ptr() % 16 or any(s % 8 for s in t.stride()[:-1]):
                raise ValueError("q and k rows must start on 16-byte boundaries")
        cq = cu_q.tolist()
        if cq[0] < 0 or cq[-1] > q.shape[0] or any(b < a for a, b in itertools.pairwise(cq)):
            raise IndexError("cu_seqlens_q is negative, decreases, or ends beyond the rows of q")
        if block_table is None:
            ck = cu_k.tolist()
            if ck[0] < 0 or ck[-1] > k.shape[0] or any(b < a for a, b in itertools.pairwise(ck)):
                raise IndexError("cu_seqlens_k is negative, decreases, or ends beyond the rows of k")
        else:
            page, capacity = k.shape[1], block_table.shape[1] * k.shape[1]
            for b, n in enumerate(seqused_k.tolist()):
                if n < 0 or n > capacity:
                    raise IndexError("seqused_k is negative or exceeds its KV cache")
                used = block_table[b, : -(-n // page)]
                if bool(((used < 0) | (used >= k.shape[0])).any()):
                    raise IndexError("block_table holds an entry outside the cache")
        return reference(q, k, v, out, cu_q, cu_k, seqused_k, leftpad_k, block_table, *rest)

    return op


def run(fuzz, monkeypatch, op, count=150, seed=3):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    kinds, failures = {}, []
    valid = 0
    for spec in fuzz.generate(seed, count):
        check = not spec.get("expect_error") and valid % 3 == 0
        valid += not spec.get("expect_error")
        r = fuzz.outcome(op, spec, "cpu", check)
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
        if r["why"]:
            failures.append(r)
    return kinds, failures


def test_an_exact_op_with_the_real_checks_passes_the_fuzz(fuzz, monkeypatch):
    kinds, failures = run(fuzz, monkeypatch, checked(fuzz.sm70_cases._reference_op))
    assert failures == []
    assert kinds["invalid"] >= 20 and kinds["checked"] >= 20 and kinds["run"] >= 40


def test_an_op_without_input_checks_fails_the_fuzz(fuzz, monkeypatch):
    _, failures = run(fuzz, monkeypatch, fuzz.sm70_cases._reference_op)
    assert failures and {f["kind"] for f in failures} == {"invalid"}


def test_an_op_one_percent_off_fails_the_fuzz(fuzz, monkeypatch):
    exact = checked(fuzz.sm70_cases._reference_op)

    def wrong(*args):
        result = exact(*args)
        args[3].mul_(1.01)
        return result

    _, failures = run(fuzz, monkeypatch, wrong)
    assert failures and {f["kind"] for f in failures} == {"checked"}


def test_the_specs_are_reproducible_and_mixed(fuzz):
    specs = fuzz.generate(7, 400)
    assert specs == fuzz.generate(7, 400)
    invalid = [s for s in specs if s.get("expect_error")]
    assert 80 <= len(invalid) <= 160  # about 30%
    assert {k for s in invalid for k in fuzz.INVALID if s.get(k) is not None} == set(fuzz.INVALID)
    assert {s["d"] for s in specs} == set(fuzz.HEAD_DIMS)
    assert {s["page_size"] for s in specs} == {None, 16, 32, 64}
