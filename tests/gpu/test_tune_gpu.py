# SPDX-License-Identifier: BSD-3-Clause
"""`fa2patch tune` on a GPU (the lab: H200 with the SM70 kernels forced; skipped without a GPU).

A tiny grid (6/1 heads of 256, chunks of 1024, prompts up to 4096; decode batches of 1 and 4
sequences) writes a profile that `tune --check` accepts for this GPU and this extension; where the
extension reads routing profiles (FA2PATCH_ROUTING_PROFILE), route_stats() shows the profile in use
and every measured point's call takes the route (and kernel) the profile decided for it.
"""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONFIG = {
    "architectures": ["TinyForCausalLM"],
    "num_attention_heads": 6,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "hidden_size": 1536,
    "max_position_embeddings": 4096,
}

CALLS = r"""
import json, os, sys, torch
torch.ops.load_library(sys.argv[1])
sys.path.insert(0, sys.argv[3])
from fa2patch_vllm import routing_profile
print(json.dumps(routing_profile.install()), file=sys.stderr)  # FA2PATCH_ROUTING_PROFILE, as the plugin does
ops = torch.ops._vllm_fa2_C
hq, hkv, d = 6, 1, 256
seen = []
for sq, sk, b in json.loads(sys.argv[2]):  # b sequences of sq queries and sk keys
    q = torch.randn(b * sq, hq, d, dtype=torch.float16, device="cuda")
    k = torch.randn(b * sk, hkv, d, dtype=torch.float16, device="cuda")
    v = torch.randn_like(k)
    out = torch.empty_like(q)
    cu_q = torch.arange(b + 1, dtype=torch.int32, device="cuda") * sq
    cu_k = torch.arange(b + 1, dtype=torch.int32, device="cuda") * sk
    before = json.loads(ops.route_stats()).get("devices", {}).get("0", {}).get("routes", {})
    ops.varlen_fwd(q, k, v, out, cu_q, cu_k, None, None, None, None, sq, sk, 0.0, d ** -0.5, False, True,
                   -1, -1, 0.0, False, 0, None)
    torch.cuda.synchronize()
    after = json.loads(ops.route_stats()).get("devices", {}).get("0", {}).get("routes", {})
    seen.append({k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)})
stats = json.loads(ops.route_stats())
print(json.dumps({"routes": seen, "profile": stats.get("profile", "absent"), "stats": stats}))
"""


def fa2patch(*args):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "tools"), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.run([sys.executable, "-m", "fa2patch", *args], capture_output=True, text=True, cwd=REPO, env=env)


@pytest.fixture(scope="module")
def tuned(gpu_build, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tune")
    config = folder / "config.json"
    config.write_text(json.dumps(CONFIG))
    path = folder / "profile.json"
    proc = fa2patch(
        "tune",
        "--model-config",
        str(config),
        "--tp",
        "1",
        "--max-num-batched-tokens",
        "1024",
        "--max-model-len",
        "4096",
        "--warmup",
        "1",
        "--reps",
        "3",
        "--splits",
        "2",
        "--decode-batches",
        "1,4",
        "--artifact",
        str(gpu_build),
        "--out",
        str(path),
        "--json",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout), json.loads(path.read_text()), path


def test_tune_writes_a_profile_for_this_gpu_and_extension(gpu_build, tuned):
    import torch

    result, doc, path = tuned
    p = torch.cuda.get_device_properties(0)
    assert doc["device"] == {"name": p.name, "sms": p.multi_processor_count, "capability": [p.major, p.minor]}
    assert doc["extension_sha256"] == hashlib.sha256(gpu_build.read_bytes()).hexdigest()
    if (p.major, p.minor) != (7, 0):
        assert "not V100 timings" in doc["software"]["notes"]
    points = {point(r) for r in doc["measured"]}
    prefill = {(1024, 1024, 1), (1024, 2048, 1), (1024, 3072, 1), (1024, 4096, 1)}
    decode = {(1, kv, b) for b in (1, 4) for kv in (256, 512, 1024, 2048, 4096)}
    assert points == prefill | decode
    for p in points:
        routes = {r["name"] for r in doc["measured"] if point(r) == p and r.get("times_ms")}
        expected = {"sm70-dense", "sm70-decode"} if p in decode else {"sm70-dense", "sm70-gqa-prefill"}
        assert expected <= routes, (p, routes)
        # every measured point has a decision, the first match
        matches = [d for d in doc["decisions"] if matches_point(d, p)]
        assert matches and matches[0]["group"] == 6 and matches[0]["head_dim"] == 256
    assert not result["numerics_failures"], result["numerics_failures"]
    proc = fa2patch("tune", "--check", str(path), "--artifact", str(gpu_build), "--this-gpu", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["checked"] == ["format", "extension sha256", "device"]


def point(row: dict) -> tuple[int, int, int]:
    """A measured row's call: (Q, KV, sequences)."""
    return row["q"], row["kv"], row.get("batch", 1)


def matches_point(d: dict, p: tuple[int, int, int]) -> bool:
    q, kv, b = p
    lo, hi = d.get("batch", [1, 1 << 62])
    return d["q"][0] <= q < d["q"][1] and d["kv"][0] <= kv < d["kv"][1] and lo <= b < hi


def test_the_extension_follows_the_tuned_profile(gpu_build, tuned):
    _, doc, path = tuned
    points = sorted({point(r) for r in doc["measured"]})
    env = {**os.environ, "FA2PATCH_FORCE_SM70": "1", "FA2PATCH_ROUTING_PROFILE": str(path)}
    env.pop("VLLM_FLASH_V100_PREFILL_D256_GQA_ARCH_128K_EXPERIMENTAL", None)
    env.pop("FA2PATCH_SM70_DECODE", None)  # the profile, not the switch, picks the decode points' kernel
    proc = subprocess.run(
        [sys.executable, "-c", CALLS, str(gpu_build), json.dumps(points), str(REPO / "packaging")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["profile"]["status"] == "in use" and got["profile"]["path"] == str(path), got["profile"]
    assert got["profile"]["decisions"] == len(doc["decisions"])
    for p, counted in zip(points, got["routes"], strict=True):
        d = next(d for d in doc["decisions"] if matches_point(d, p))
        expected = "sm70-dense-splitkv" if d.get("splits", 1) > 1 else d["route"]
        assert counted == {expected: 1}, (p, d, counted)
