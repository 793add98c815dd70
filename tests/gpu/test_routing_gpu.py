"""Routing inside varlen_fwd (patch 0004; docs/DESIGN.md §4, §8), with the SM70 kernels forced.

Each scenario runs ``routing_cases.py`` in its own subprocess (sm70_cases.py's inputs, FP32
reference and checks). The route counters (route_stats) say which route ran; every numerics case
also meets the contract against the FP32 reference. Select with ``-k routing``.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("routing_cases.py")
ENV = "VLLM_FLASH_V100_PREFILL_D256_GQA_ARCH_128K_EXPERIMENTAL"
PREFILL = "sm70-gqa-prefill"
EXACT = "sm70-dense"
# The smallest shape in the long-prefill range (routing.h: max_seqlen_q >= 1024, max_seqlen_k >= 16384);
# the routing takes every shape the long-prefill op takes (README "Routing": `fa2patch report` puts
# that route ahead of the exact one there), whatever the GPU's SM count.
BASE = {"seqlens": [[1024, 16384]], "hq": 4, "hkv": 1, "d": 256, "causal": True, "page_size": 16}


def run(gpu_build, scenario, spec, env=None, timeout=600, override=None, vllm_cache=False):
    raw = {"scenario": scenario, "spec": spec, "override": override or {}, "vllm_cache": vllm_cache}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(gpu_build), json.dumps(raw)],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "FA2PATCH_FORCE_SM70": "1", **(env or {})})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# (id, spec changes, env, expected counter group, expected key): each flips one condition of BASE.
TABLE = [
    ("eligible-paged16", {}, {}, "routes", PREFILL),
    ("eligible-contiguous", {"page_size": None}, {}, "routes", PREFILL),
    ("eligible-strided-views", {"strided": True}, {}, "routes", PREFILL),
    ("eligible-g16-kv-padded-table", {"hq": 16, "extra_blocks": 3, "cu_seqlens_k": "garbage"}, {}, "routes", PREFILL),
    ("head-dim-128", {"d": 128}, {}, "exact_reasons", "head_dim"),
    ("not-causal", {"causal": False}, {}, "exact_reasons", "not_causal"),
    ("window", {"window": [512, 0]}, {}, "exact_reasons", "window"),
    ("softcap", {"softcap": 30.0}, {}, "exact_reasons", "softcap"),
    ("alibi", {"alibi": True}, {}, "exact_reasons", "alibi"),
    ("two-sequences", {"seqlens": [[1024, 16384], [1, 300]]}, {}, "exact_reasons", "batch"),
    ("group-32", {"hq": 32}, {}, "exact_reasons", "group"),
    ("q-below-range", {"seqlens": [[1023, 16384]]}, {}, "exact_reasons", "short"),
    ("kv-below-range", {"seqlens": [[1024, 16383]]}, {}, "exact_reasons", "short"),
    ("env-rollback", {}, {ENV: "0"}, "fallbacks", "env_off"),
    ("env-explicit-on", {}, {ENV: "1"}, "routes", PREFILL),
    ("workspace-cap", {}, {"FA2PATCH_PREFILL_WORKSPACE_CAP_MIB": "1"}, "fallbacks", "workspace_cap"),
]


@pytest.mark.parametrize("name,change,env,group,key", TABLE, ids=[t[0] for t in TABLE])
def test_routing_table(gpu_build, name, change, env, group, key):
    r = run(gpu_build, "route", {**BASE, **change, "seed": 7}, env)
    route = PREFILL if (group, key) == ("routes", PREFILL) else EXACT
    assert r["routes"] == {route: 1}, r
    if group != "routes":
        assert r[group] == {key: 1}, r
    assert r["ok"], r   # the numerics contract against FP32, on whichever route ran


def test_routing_takes_vllms_cache_views(gpu_build):
    """What vLLM passes: paged k/v as views of one (num_blocks, hkv, 16, 2 d) cache, seqused_k, a
    block_table wider than the sequence needs, cu_seqlens_k left uninitialised."""
    spec = {**BASE, "hq": 6, "extra_blocks": 5, "cu_seqlens_k": "garbage", "seed": 11}
    r = run(gpu_build, "route", spec, vllm_cache=True)
    assert r["routes"] == {PREFILL: 1} and r["ok"], r


def test_routing_invalid_env_value_is_a_value_error(gpu_build):
    r = run(gpu_build, "error", BASE, {ENV: "yes"})
    assert r["raised"] == "ValueError" and ENV in r["message"] and r["out_untouched"], r


def test_routing_forced_oom_gives_the_exact_route_bitwise(gpu_build):
    r = run(gpu_build, "oom", BASE)
    assert r["oom"]["fallbacks"] == {"workspace_oom": 2} and r["oom"]["routes"] == {EXACT: 2}, r
    assert len(r["log_lines"]) == 1 and "cuda:0" in r["log_lines"][0], r   # logged once per device and reason
    assert r["without_hook"]["routes"] == {PREFILL: 1}, r   # the same call routes normally again
    assert r["identical_to_exact"], r


def test_routing_graph_capture_replays_the_exact_route(gpu_build):
    r = run(gpu_build, "graph", BASE)
    assert r["captured"]["fallbacks"] == {"graph_capture": 1}, r
    assert r["identical_to_exact"], r


def test_routing_two_streams_two_threads(gpu_build):
    r = run(gpu_build, "streams", {**BASE, "hq": 8, "hkv": 2})
    assert r["errors"] == [] and r["identical"], r
    assert r["routes"] == {"0": {PREFILL: 6}}, r


def test_routing_two_devices_two_threads(gpu_build):
    r = run(gpu_build, "devices", BASE)
    if "skipped" in r:
        pytest.skip(r["skipped"])
    assert r["errors"] == [] and r["identical"], r
    assert r["routes"] == {"0": {PREFILL: 3}, "1": {PREFILL: 3}}, r
    assert all(b > 0 for b in r["workspace_bytes"].values()), r   # one workspace per device


def test_routing_tensor_parallel_ranks_route_alike(gpu_build):
    r = run(gpu_build, "tp_pair", BASE)
    if "skipped" in r:
        pytest.skip(r["skipped"])
    assert r["per_device"]["0"] == r["per_device"]["1"] == {"routes": {PREFILL: 1}, "fallbacks": {},
                                                            "exact_reasons": {}}, r


# A small paged batch inside a captured graph, then block_table and seqused_k corrupted in place.
CORRUPT = {"seqlens": [[1, 40], [1, 300], [1, 17]], "hq": 8, "hkv": 2, "d": 128, "causal": True, "page_size": 16}


def test_routing_corrupted_graph_inputs_set_the_error_flag(gpu_build):
    r = run(gpu_build, "corrupt_graph", CORRUPT)
    assert r["replayed_finite"], r
    assert r["raised"] == "IndexError" and "previous call" in r["message"], r
    assert r["device_ok"] and r["next_call_clean"], r   # reported once, then cleared


# Host-side typed errors before any launch (issue 11 item 4): sequences longer than the max_seqlen
# the call declares, max_seqlen_q of 0 with tokens, a non-finite scale. The sequences are
# (8, 40), (4, 20): max_seqlen_q = 8 and max_seqlen_k = 40 would be right.
SMALL = {"seqlens": [[8, 40], [4, 20]], "hq": 4, "hkv": 2, "d": 64, "causal": True}
HOST_ERRORS = [
    ("max-seqlen-q-zero", SMALL, {"max_seqlen_q": 0}, "max_seqlen_q"),
    ("max-seqlen-q-below-a-sequence", SMALL, {"max_seqlen_q": 7}, "max_seqlen_q"),
    ("max-seqlen-k-below-a-sequence", SMALL, {"max_seqlen_k": 39}, "max_seqlen_k"),
    ("max-seqlen-k-below-seqused-k-paged", {**SMALL, "page_size": 16}, {"max_seqlen_k": 20}, "max_seqlen_k"),
    ("max-seqlen-k-below-long-prefill", BASE, {"max_seqlen_k": 16383}, "max_seqlen_k"),
    ("softmax-scale-nan", SMALL, {"scale": float("nan")}, "softmax_scale"),
    ("softmax-scale-inf", BASE, {"scale": float("inf")}, "softmax_scale"),
]


@pytest.mark.parametrize("name,spec,override,word", HOST_ERRORS, ids=[t[0] for t in HOST_ERRORS])
def test_routing_host_checks_raise_value_error_before_any_launch(gpu_build, name, spec, override, word):
    r = run(gpu_build, "error", spec, override=override)
    assert r["raised"] == "ValueError" and word in r["message"], r
    assert r["out_untouched"] and r["guard_ok"] and r["device_ok"], r
