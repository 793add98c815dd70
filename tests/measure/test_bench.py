# SPDX-License-Identifier: BSD-3-Clause
"""bench: argument handling, FLOP counting, numerics verdicts and the table, on the CPU."""

import json

import pytest

from fa2patch.common.errors import EnvironmentProblem
from fa2patch.common.shapes import Shape, attended_pairs, parse_shapes, useful_flops
from fa2patch.measure.bench import DEFAULT_SHAPES, judge
from fa2patch.measure.bench_text import WARNING, render


def test_default_shapes_are_the_reference_family():
    shapes = parse_shapes(DEFAULT_SHAPES)
    assert [s.kv for s in shapes] == list(range(40000, 128001, 8000))
    assert {(s.q, s.hq, s.hkv, s.d, s.causal, s.scale) for s in shapes} == {(8000, 6, 1, 256, True, 1 / 16)}


def test_shape_groups_sweeps_and_default_scale():
    shapes = parse_shapes("q=16:48:16,kv=64,hq=4,hkv=2,d=64,causal=0; q=1,kv=100,hq=8,hkv=8,d=128")
    assert [(s.q, s.causal) for s in shapes[:3]] == [(16, False), (32, False), (48, False)]
    assert shapes[3] == Shape(1, 100, 8, 8, 128, True, 128**-0.5)


@pytest.mark.parametrize(
    "bad, message",
    [
        ("q=8,kv=x,hq=1,hkv=1,d=64", "not N or START:END:STEP"),
        ("q=8,kv=8,hq=6,hkv=4,d=64", "not a multiple"),
        ("q=8,kv=8,hq=1,d=64", "lacks hkv"),
        ("q=8,kv=8,hq=1,hkv=1,d=64,heads=3", "expected key=value"),
        ("q=8:4:0,kv=8,hq=1,hkv=1,d=64", "not N or START:END:STEP"),
    ],
)
def test_bad_shapes_are_refused(bad, message):
    with pytest.raises(EnvironmentProblem, match=message):
        parse_shapes(bad)


@pytest.mark.parametrize("q, kv, causal", [(5, 9, True), (9, 5, True), (7, 7, True), (4, 6, False), (1, 1, True)])
def test_attended_pairs_counts_the_bottom_right_causal_mask(q, kv, causal):
    brute = sum(1 for i in range(q) for j in range(kv) if not causal or j <= i + kv - q)
    assert attended_pairs(q, kv, causal) == brute


def test_useful_flops_of_the_reference_endpoint():
    s = Shape(8000, 128000, 6, 1, 256, True, 1 / 16)
    assert useful_flops(s) == 4 * 6 * 256 * (8000 * 120000 + 8000 * 8001 // 2)


def test_judge_envelope_and_contract():
    good = {"max_abs": 5e-4, "rel_l2": 3e-4, "bar": 1e-3, "finite": True}
    assert judge(good) == {"envelope_ok": True, "contract_ok": True}
    # Inside the loose envelope, outside the contract (relative L2 above 1e-3).
    assert judge({**good, "rel_l2": 5e-3}) == {"envelope_ok": True, "contract_ok": False}
    assert judge({**good, "max_abs": 2e-3, "bar": 5e-3}) == {"envelope_ok": False, "contract_ok": True}
    assert judge({**good, "finite": False}) == {"envelope_ok": False, "contract_ok": False}


def test_table_has_speedup_latency_reduction_and_the_warning():
    def res(route, ms, spread=0.1, label="Q=8 KV=16"):
        return {
            "route": route,
            "label": label,
            "median_ms": ms,
            "min_ms": ms - spread,
            "max_ms": ms + spread,
            "tflops": 1.0,
            "sm_clock_after": "1980 MHz",
            "envelope_ok": True,
            "contract_ok": route == "a",
        }

    result = {
        "gpu": "NVIDIA H200",
        "capability": "sm_90",
        "sm_clock_idle": "345 MHz",
        "sm_clock_max": "1980 MHz",
        "driver": "580",
        "manifest_sha256": "ab" * 32,
        "routes": ["a", "b"],
        "is_v100": False,
        "results": [res("a", 4.0), res("b", 1.0), res("a", 2.0, 0.5, "Q=9"), res("b", 1.8, 0.5, "Q=9")],
    }
    text = render(result)
    assert WARNING in text and "4.00x" in text and "75%" in text and "ok/FAIL" in text
    # Each median with its range over the repetitions; separated where the ranges do not overlap.
    first, second = (line for line in text.splitlines() if line.startswith(("Q=8 ", "Q=9 ")))
    assert "4.00 (3.90-4.10)" in first and "1.00 (0.90-1.10)" in first and " separated" in first
    assert "2.00 (1.50-2.50)" in second and "not separated" in second
    assert "345 MHz idle, 1980 MHz max, 1980 MHz right after the timed calls" in text
    assert WARNING not in render({**result, "is_v100": True})


def test_bench_without_gpu_exits_3(mini):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    proc = mini.run("bench", check_rc=3)
    assert "no CUDA GPU" in proc.stderr


def test_batch_and_page_shapes():
    (s,) = parse_shapes("q=1,kv=100,hq=8,hkv=2,d=128,b=4,page=16")
    assert (s.b, s.page) == (4, 16) and s.label == "B=4 Q=1 KV=100 Hq=8 Hkv=2 D=128 causal page=16"
    assert parse_shapes("q=1,kv=100,hq=8,hkv=2,d=128")[0].page == 0
    with pytest.raises(EnvironmentProblem, match="page=20 is not a multiple of 16"):
        parse_shapes("q=1,kv=100,hq=8,hkv=2,d=128,page=20")


def test_route_entries_carry_their_switches():
    from fa2patch.compile.extension import route_entry

    force = {"FA2PATCH_FORCE_SM70": "1"}
    exact = {"name": "sm70-dense", "op": "varlen_fwd", "env": {**force, "FA2PATCH_SM70_DECODE": "0"}, "pin_splits": 1}
    assert route_entry("sm70-dense") == exact  # the decode kernel's switch off, whatever the shell says
    decode = {"name": "sm70-decode", "op": "varlen_fwd", "env": {"FA2PATCH_SM70_DECODE": "1"}}
    assert route_entry(decode) == {**decode, "env": {**force, "FA2PATCH_SM70_DECODE": "1"}}
    gqa = {"name": "sm70-gqa-prefill", "op": "gqa_prefill_fwd", "env": {}}
    assert route_entry(gqa) == gqa


BUILD_INFO = {
    "routes": [
        "sm70-dense",
        {"name": "sm70-gqa-prefill", "op": "gqa_prefill_fwd", "env": {}},
        {"name": "sm70-decode", "op": "varlen_fwd", "env": {"FA2PATCH_SM70_DECODE": "1"}},
    ]
}


def fake_bench(monkeypatch, counted: dict):
    """bench() with build_info and the subprocess replaced: every case took 1 ms with good numerics,
    and route_stats() counted ``counted[route]``; returns the calls' (spec, env)."""
    from fa2patch.measure import bench

    calls = []

    def worker(code, artifact, spec, env=None):
        spec = json.loads(spec)
        calls.append((spec, env))
        numbers = {"max_abs": 1e-4, "rel_l2": 1e-4, "bar": 1e-3, "finite": True}
        ran = next(c["routes"] for c in counted.values() if c["env"] == env)
        return {"median_ms": 1.0, "numerics": numbers, "routes_counted": ran}

    monkeypatch.setattr(bench, "require_build_info", lambda artifact: BUILD_INFO)
    monkeypatch.setattr(bench, "python_json", worker)
    monkeypatch.setattr(bench, "smi", lambda query: "1530,1530,550")
    return calls


def test_bench_refuses_batches_on_an_own_op_route(monkeypatch):
    from pathlib import Path

    from fa2patch.measure.bench import bench

    fake_bench(monkeypatch, {})
    gpu = {"name": "x", "capability": "sm_70"}
    shape = Shape(1, 4096, 6, 1, 256, True, 0.0625, b=2)
    with pytest.raises(EnvironmentProblem, match="sm70-gqa-prefill takes one contiguous sequence"):
        bench(gpu, Path("x.so"), "0" * 64, ["sm70-dense", "sm70-gqa-prefill"], [shape], 1, 1)
    with pytest.raises(EnvironmentProblem, match=r"decode \(rows batched with a chunk\) is for `report` only"):
        bench(gpu, Path("x.so"), "0" * 64, None, [Shape(64, 4096, 6, 1, 256, True, 0.0625, decode=3)], 1, 1)


def test_bench_times_the_decode_kernel_only_where_it_took_the_call(monkeypatch):
    """A varlen_fwd route's case counts only if route_stats() counted that route for its calls: the
    decode kernel's switch on a shape it does not take (here the exact kernel ran) is an error."""
    from pathlib import Path

    from fa2patch.measure.bench import bench

    force = {"FA2PATCH_FORCE_SM70": "1"}
    counted = {
        "dense": {"env": {**force, "FA2PATCH_SM70_DECODE": "0"}, "routes": {"sm70-dense": 3}},
        "decode": {"env": {**force, "FA2PATCH_SM70_DECODE": "1"}, "routes": {"sm70-decode": 3}},
    }
    calls = fake_bench(monkeypatch, counted)
    gpu = {"name": "x", "capability": "sm_70"}
    shape = Shape(1, 4096, 32, 8, 128, True, 0.09, b=64, page=16)
    result = bench(gpu, Path("x.so"), "0" * 64, ["sm70-dense", "sm70-decode"], [shape], 1, 2)
    assert [r.get("error") for r in result["results"]] == [None, None]
    assert [spec["pin_splits"] for spec, _ in calls] == [1, None]  # the decode route keeps its own split
    assert calls[0][0]["b"] == 64 and calls[0][0]["page"] == 16
    counted["decode"]["routes"] = {"sm70-dense": 3}
    result = bench(gpu, Path("x.so"), "0" * 64, ["sm70-dense", "sm70-decode"], [shape], 1, 2)
    dense, decode = result["results"]
    assert "error" not in dense and "median_ms" not in decode
    assert decode["error"] == "sm70-decode did not take this call: route_stats() counted {'sm70-dense': 3}"
