# SPDX-License-Identifier: BSD-3-Clause
"""The op surface of patch 0001 on a real GPU: what the build declares, what the SM70 route
accepts, and typed errors (no crash, nothing written) for what it refuses."""

import json
import os
import subprocess
import sys

import pytest

FORCE = {"FA2PATCH_FORCE_SM70": "1"}


def test_build_info_describes_the_build(build_info):
    assert build_info["library"] == "_vllm_fa2_C" and build_info["fa2_version"] == "2.8.3"
    assert build_info["sm70_kernels"] is True and "sm70-dense" in build_info["routes"]


def test_bf16_on_the_sm70_route_is_a_type_error(call_op):
    r = call_op(env=FORCE, dtype="bfloat16")
    assert r["raised"] == "TypeError" and "bf16" in r["message"] and r["out_untouched"]


def test_invalid_lab_switch_value_is_an_error(call_op):
    r = call_op(env={"FA2PATCH_FORCE_SM70": "yes"})
    assert r["raised"] == "RuntimeError" and "FA2PATCH_FORCE_SM70" in r["message"]


def test_page_size_16_is_accepted_on_the_sm70_route_and_8_is_not(call_op):
    r16 = call_op(env=FORCE, page=16, shape=[8, 40, 2, 1, 64])
    assert r16["raised"] is None, r16
    assert not r16["out_untouched"] and r16["out_finite"], f"out was not written: {r16}"
    r8 = call_op(env=FORCE, page=8, shape=[8, 40, 2, 1, 64])
    assert r8["raised"] == "RuntimeError" and "multiple of 16" in r8["message"] and r8["out_untouched"]


def test_dropout_and_generator_are_refused(call_op):
    r = call_op(env=FORCE, p_dropout=0.1)
    assert r["raised"] == "NotImplementedError" and "dropout" in r["message"]
    r = call_op(env=FORCE, gen=True)
    assert r["raised"] in ("ValueError", "RuntimeError") and "gen" in r["message"]


def test_unforced_route_without_sm80_kernels_is_refused(call_op, build_info):
    import torch

    if torch.cuda.get_device_capability(0) == (7, 0) or build_info["sm80_kernels"]:
        pytest.skip("needs a GPU newer than V100 and a build without SM80 kernels")
    r = call_op()
    assert r["raised"] == "NotImplementedError" and "no SM80 kernels" in r["message"]


def test_smoke_launches_every_declared_route(gpu_build, build_info):
    arch = gpu_build.parent.name
    proc = subprocess.run(
        [sys.executable, "-m", "fa2patch", "smoke", "--arch", arch, "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "FA2PATCH_ROOT": str(gpu_build.parents[2])},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["ok"] is True
    routes = [r if isinstance(r, str) else r["name"] for r in build_info["routes"]]
    assert sorted(r["route"] for r in result["results"]) == sorted(routes)
    assert all(r["ok"] and r["cases"] for r in result["results"]), result


def test_bench_times_the_decode_kernel_only_where_it_takes_the_call(gpu_build):
    """bench's sm70-decode route (varlen_fwd with the decode kernel's switch): a batch of one query
    row per sequence over a shuffled paged cache, 16 rows of one KV head (two row blocks) and a
    speculative verification (4 query rows x group 2 = 8 rows) are timed and meet the contract, on
    both routes; a prefill shape (24 x 2 = 48 rows, past the kernel's 16), which the decode kernel
    does not take, is an error row, not the exact kernel's time under the decode kernel's name
    (exit 1)."""
    arch = gpu_build.parent.name
    shapes = (
        "q=1,kv=300,hq=6,hkv=1,d=256,b=3,page=16;q=1,kv=1000,hq=16,hkv=1,d=128;"
        "q=4,kv=64,hq=4,hkv=2,d=64;q=24,kv=64,hq=4,hkv=2,d=64"
    )
    args = ["--arch", arch, "--routes", "sm70-dense,sm70-decode", "--shapes", shapes, "--warmup", "1", "--reps", "2"]
    proc = subprocess.run(
        [sys.executable, "-m", "fa2patch", "bench", *args, "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "FA2PATCH_ROOT": str(gpu_build.parents[2])},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    rows = {(r["label"], r["route"]): r for r in json.loads(proc.stdout)["results"]}
    assert len(rows) == 8
    for (label, route), r in rows.items():
        if label.startswith("Q=24") and route == "sm70-decode":
            assert r["error"].startswith("sm70-decode did not take this call"), r
        else:
            assert r["contract_ok"] and r["routes_counted"] == {route: 3}, r
