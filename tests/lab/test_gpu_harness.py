# SPDX-License-Identifier: BSD-3-Clause
"""The GPU numerics harness itself, on the CPU: through an exact stand-in op it must pass;
through a slightly wrong op it must fail (so the GPU suite can fail)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import REPO, load_script

SCRIPT = REPO / "tests" / "gpu" / "sm70_cases.py"
CASES = [
    {"seqlens": [[1, 1], [9, 21], [0, 4], [4, 0]], "hq": 4, "hkv": 2, "d": 32, "causal": True},
    {"seqlens": [[1, 19], [3, 40]], "hq": 6, "hkv": 1, "d": 64, "page_size": 16, "alibi": True},
    # vLLM's cache views (row stride 2 d); the split-KV hook key is the op's concern, ignored here.
    {
        "seqlens": [[5, 40], [1, 17]],
        "hq": 6,
        "hkv": 1,
        "d": 64,
        "page_size": 16,
        "causal": True,
        "vllm_cache": True,
        "prefill_splits": 3,
    },
]


@pytest.mark.parametrize("spec", CASES)
def test_exact_op_passes_the_harness(spec):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "reference-op", json.dumps(spec)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "tools")},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["finite"] and result["guard_ok"] and result["returns_out"]
    assert result["max_abs"] <= result["bar"] and result["lse_max_err"] <= 1e-3


def test_a_slightly_wrong_op_fails_the_harness(monkeypatch):
    cases = load_script(SCRIPT, "sm70_cases")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)

    def wrong_op(*args):
        result = cases._reference_op(*args)
        args[3].mul_(1.01)  # 1% off in `out`
        return result

    spec = cases._spec(CASES[0])
    result = cases.run_numerics(wrong_op, spec, cases.build_inputs(spec, "cpu"))
    assert not result["ok"] and result["max_abs"] > result["bar"]
