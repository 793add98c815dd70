# SPDX-License-Identifier: BSD-3-Clause
"""The SM70 route inside a CUDA graph, as vLLM captures decode: capture once, change the inputs
in place (queries, keys per sequence, new k/v), replay, and compare with an eager call on the
same inputs: bitwise equal outputs (and caches, for fwd_kvcache's append), finite.

During capture the op skips its index checks (they synchronise); the inputs here are valid."""

import json
import os
import subprocess
import sys

import pytest

from fa2patch.common import routes

# Warm the call up on a side stream (as torch's graph capture wants), then a graph to capture it into.
CAPTURE = r"""
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    call()
torch.cuda.current_stream().wait_stream(side)
graph = torch.cuda.CUDAGraph()
"""

SCRIPT = (
    r"""
import json, sys, torch
torch.ops.load_library(sys.argv[1])
which = sys.argv[2]
torch.manual_seed(0)
dev, half = "cuda", torch.float16
B, hq, hkv, d, page, max_blocks = 4, 8, 2, 128, 16, 80
num_blocks = B * max_blocks + 5
kc = torch.randn(num_blocks, page, hkv, d, dtype=half, device=dev)
vc = torch.randn_like(kc)
table = torch.randperm(num_blocks, device=dev)[:B * max_blocks].view(B, max_blocks).int()
lens = torch.tensor([1, 17, 300, 1000], dtype=torch.int32, device=dev)
capacity = max_blocks * page

if which == "varlen_fwd":
    op = torch.ops._vllm_fa2_C.varlen_fwd
    q = torch.randn(B, hq, d, dtype=half, device=dev)
    cu_q = torch.arange(B + 1, dtype=torch.int32, device=dev)
    cu_k = torch.zeros(B + 1, dtype=torch.int32, device=dev)
    out = torch.empty_like(q)
    def call():
        op(q, kc, vc, out, cu_q, cu_k, lens, None, table, None, 1, capacity, 0.0, d ** -0.5, False,
           True, -1, -1, 0.0, False, 0, None)
    def new_inputs(t):
        q.copy_(torch.randn_like(q))
        lens.copy_(torch.randint(1, capacity + 1, (B,), dtype=torch.int32, device=dev))
    state = lambda: [out]
else:
    op = torch.ops._vllm_fa2_C.fwd_kvcache
    q = torch.randn(B, 1, hq, d, dtype=half, device=dev)
    knew = torch.randn(B, 1, hkv, d, dtype=half, device=dev)
    vnew = torch.randn_like(knew)
    inv_freq = 10000 ** (torch.arange(0, 64, 2, device=dev).float() / 64)
    angles = torch.arange(capacity, device=dev).float().view(-1, 1) / inv_freq
    cos, sin = angles.cos().to(half), angles.sin().to(half)
    out = torch.empty_like(q)
    def call():
        op(q, kc, vc, knew, vnew, lens, cos, sin, None, None, table, None, out, d ** -0.5, True, -1, -1,
           0.0, False, 0)
    def new_inputs(t):
        q.copy_(torch.randn_like(q)); knew.copy_(torch.randn_like(knew)); vnew.copy_(torch.randn_like(vnew))
        lens.copy_(torch.randint(0, capacity, (B,), dtype=torch.int32, device=dev))
    state = lambda: [out, kc, vc]

"""
    + CAPTURE
    + r"""with torch.cuda.graph(graph):
    call()
equal, finite = [], []
for t in range(3):
    new_inputs(t)
    before = [x.clone() for x in state()]
    graph.replay()
    torch.cuda.synchronize()
    replayed = [x.clone() for x in state()]
    for x, b in zip(state(), before):
        x.copy_(b)
    call()
    torch.cuda.synchronize()
    equal.append(all(torch.equal(a, b) for a, b in zip(replayed, state())))
    finite.append(bool(torch.isfinite(replayed[0]).all()))
stats = json.loads(torch.ops._vllm_fa2_C.route_stats())["devices"]["0"]["routes"]
print(json.dumps({"equal": equal, "finite": finite, "routes": stats}))
"""
)


@pytest.mark.parametrize("decode_kernel", [False, True], ids=["exact", "decode-kernel"])
@pytest.mark.parametrize("op", ["varlen_fwd", "fwd_kvcache"])
def test_replayed_graph_matches_eager_calls(gpu_build, op, decode_kernel):
    """With the decode kernel switched on (8 query heads on 2 KV heads, head dim 128: FA2's swap, 4 rows
    per KV head) varlen_fwd's calls are counted as sm70-decode; the split its launch geometry takes is
    a host-side value, the lengths are read on the device."""
    env = {**os.environ, "FA2PATCH_FORCE_SM70": "1", routes.DECODE_ENV: "1" if decode_kernel else "0"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(gpu_build), op], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["finite"] == [True] * 3, r
    assert r["equal"] == [True] * 3, f"replays differ from eager calls: {r}"
    if op == "varlen_fwd":
        assert (routes.DECODE in r["routes"]) == decode_kernel, r


RULE_SCRIPT = (
    r"""
import json, os, sys, torch
from fa2patch.measure.reference import attention_ref, compare
torch.ops.load_library(sys.argv[1])
ops = torch.ops._vllm_fa2_C
torch.manual_seed(0)
dev, half = "cuda", torch.float16
B, hq, hkv, d, page, capacity = 2, 6, 1, 256, 16, 40960
max_blocks = capacity // page
kc = torch.randn(B * max_blocks, page, hkv, d, dtype=half, device=dev)
vc = torch.randn_like(kc)
table = torch.randperm(B * max_blocks, device=dev).view(B, max_blocks).int()
lens = torch.full((B,), capacity, dtype=torch.int32, device=dev)
q = torch.randn(B, hq, d, dtype=half, device=dev)
cu_q = torch.arange(B + 1, dtype=torch.int32, device=dev)
cu_k = torch.zeros(B + 1, dtype=torch.int32, device=dev)
out = torch.empty_like(q)
def call():
    ops.varlen_fwd(q, kc, vc, out, cu_q, cu_k, lens, None, table, None, 1, capacity, 0.0, d ** -0.5, False,
                   True, -1, -1, 0.0, False, 0, None)
def routes():
    return json.loads(ops.route_stats())["devices"]["0"]["routes"]
eager_before = routes()
call()
eager = {k: v - eager_before.get(k, 0) for k, v in routes().items() if v != eager_before.get(k, 0)}
"""
    + CAPTURE
    + r"""before = routes()
with torch.cuda.graph(graph):
    call()
captured = {k: v - before.get(k, 0) for k, v in routes().items() if v != before.get(k, 0)}
results = []
for pair in ([1, capacity], [1000, 17], [8192, 300], [0, 5]):
    lens.copy_(torch.tensor(pair, dtype=torch.int32))
    q.copy_(torch.randn_like(q))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    outs, refs, refs16 = [], [], []
    for i, n in enumerate(pair):
        if n == 0:
            results.append({"lens": pair, "empty_row_zero": bool((out[i] == 0).all())})
            continue
        rows = table[i].long()
        k = kc[rows].reshape(-1, hkv, d)[:n]
        v = vc[rows].reshape(-1, hkv, d)[:n]
        refs.append(attention_ref(q[i : i + 1], k, v, d ** -0.5, True)[0])
        refs16.append(attention_ref(q[i : i + 1], k, v, d ** -0.5, True, compute_dtype=half)[0])
        outs.append(out[i : i + 1])
    results.append({"lens": pair, **compare(torch.cat(outs), torch.cat(refs), torch.cat(refs16))})
print(json.dumps({"eager": eager, "captured": captured, "results": results}))
"""
)


def test_graph_captured_at_a_long_max_seqlen_k_runs_the_decode_kernel(gpu_build):
    """vLLM captures its decode graphs at max_model_len: captured at 40,960 keys with the switch unset,
    the call takes the decode kernel (eagerly, the rule keeps 6/1 x 256 at 40,960 keys exact), and its
    replays at other lengths -- each sequence's own keys split on the device, an empty sequence among
    them -- meet the numerics contract against the FP32 reference."""
    env = {k: v for k, v in os.environ.items() if k != routes.DECODE_ENV}
    env["FA2PATCH_FORCE_SM70"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", RULE_SCRIPT, str(gpu_build)], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["eager"] == {routes.EXACT: 1}, r
    assert r["captured"] == {routes.DECODE: 1}, r
    for row in r["results"]:
        assert row.get("ok", True) and row.get("empty_row_zero", True), row
