# SPDX-License-Identifier: BSD-3-Clause
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
# The smallest shape in the long-prefill range (routing.h: max_seqlen_q >= 1024, max_seqlen_k >= 16384):
# the built-in rule takes every call the long-prefill op takes there. The split-KV rule depends on the
# SM count: routing_cases.py sets one (sms="no_split" by default) under which it never splits these
# grids, so that a call the long-prefill route cannot take stays on the unsplit exact route on any GPU.
BASE = {"seqlens": [[1024, 16384]], "hq": 4, "hkv": 1, "d": 256, "causal": True, "page_size": 16}


def run(gpu_build, scenario, spec, env=None, timeout=600, override=None, vllm_cache=False, sms="no_split", **extra):
    """extra: routing_cases' other keys (prefill_splits, profile, decide)."""
    raw = {
        "scenario": scenario,
        "spec": spec,
        "override": override or {},
        "vllm_cache": vllm_cache,
        "sms": sms,
        **extra,
    }
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(gpu_build), json.dumps(raw)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "FA2PATCH_FORCE_SM70": "1", **(env or {})},
    )
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
    change = dict(change)
    sms = change.pop("sms", "no_split")
    r = run(gpu_build, "route", {**BASE, **change, "seed": 7}, env, sms=sms)
    route = PREFILL if (group, key) == ("routes", PREFILL) else EXACT
    assert r["routes"] == {route: 1}, r
    if group != "routes":
        assert r[group] == {key: 1}, r
    assert r["ok"], r  # the numerics contract against FP32, on whichever route ran


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
    assert len(r["log_lines"]) == 1 and "cuda:0" in r["log_lines"][0], r  # logged once per device and reason
    assert r["without_hook"]["routes"] == {PREFILL: 1}, r  # the same call routes normally again
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
    assert all(b > 0 for b in r["workspace_bytes"].values()), r  # one workspace per device


def test_routing_tensor_parallel_ranks_route_alike(gpu_build):
    r = run(gpu_build, "tp_pair", BASE)
    if "skipped" in r:
        pytest.skip(r["skipped"])
    assert (
        r["per_device"]["0"] == r["per_device"]["1"] == {"routes": {PREFILL: 1}, "fallbacks": {}, "exact_reasons": {}}
    ), r


# A small paged batch inside a captured graph, then block_table and seqused_k corrupted in place.
CORRUPT = {"seqlens": [[1, 40], [1, 300], [1, 17]], "hq": 8, "hkv": 2, "d": 128, "causal": True, "page_size": 16}


@pytest.mark.parametrize("decode_kernel", [False, True], ids=["exact", "decode-kernel"])
def test_routing_corrupted_graph_inputs_set_the_error_flag(gpu_build, decode_kernel):
    r = run(gpu_build, "corrupt_graph", {**CORRUPT, "decode_kernel": decode_kernel})
    assert r["replayed_finite"], r
    assert r["raised"] == "IndexError" and "previous call" in r["message"], r
    assert r["device_ok"] and r["next_call_clean"], r  # reported once, then cleared


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


# --- Split-KV on the exact route (issue 17 item 4; the numerics: test_sm70_numerics' split_prefill) ---

SPLIT = "sm70-dense-splitkv"
SPLIT_SPEC = {
    "seqlens": [[300, 2049], [1, 17], [1, 300]],
    "hq": 6,
    "hkv": 1,
    "d": 256,
    "causal": True,
    "page_size": 16,
    "seed": 5,
}


def test_split_prefill_in_a_cuda_graph_replays_the_eager_result(gpu_build):
    """The split buffers come from torch's allocator, which serves graph capture from the graph's
    pool: a split call may be captured, and its replay is bitwise the eager call."""
    r = run(gpu_build, "split_graph", SPLIT_SPEC, prefill_splits=3)
    assert r["captured"]["routes"] == {SPLIT: 1} and r["captured"]["fallbacks"] == {}, r
    assert r["identical_to_eager"] and r["finite"], r


def test_split_prefill_out_of_memory_takes_the_unsplit_route_bitwise(gpu_build):
    r = run(gpu_build, "split_oom", SPLIT_SPEC, prefill_splits=3)
    assert r["oom"]["fallbacks"] == {"splitkv_oom": 2} and r["oom"]["routes"] == {EXACT: 2}, r
    assert len(r["log_lines"]) == 1 and "cuda:0" in r["log_lines"][0], r  # logged once per device and reason
    assert r["without_hook"]["routes"] == {SPLIT: 1}, r
    assert r["identical_to_unsplit"], r


def test_split_prefill_leaves_decode_calls_to_fas_decode_split(gpu_build):
    """The test hook splits calls with max_seqlen_q >= 2 only: a decode batch keeps the exact route."""
    spec = {"seqlens": [[1, 300], [1, 17]], "hq": 8, "hkv": 2, "d": 128, "causal": True, "page_size": 16, "seed": 3}
    r = run(gpu_build, "route", spec, prefill_splits=3)
    assert r["routes"] == {EXACT: 1} and r["ok"], r


@pytest.mark.parametrize("sms, kv, splits", [(100, 300, 10), (1000, 9000, 128)])
def test_decode_split_fills_one_wave_of_the_kernels_slots(gpu_build, sms, kv, splits):
    """Patch 0004's decode split (num_splits 0 in FA2's seqlen_q/ngroups swap): slots / CTAs, at most
    one split per 32-key block and 128. One sequence on one KV head (1 CTA) under a forced SM count
    of at least 100 (slots >= 100 whatever the kernel's CTAs per SM on this GPU): ceil(kv / 32) splits
    (10 at 300 keys), at most 128 (9,000 keys). The call is bitwise the same call with that split count
    given, and exact. (FA2's own heuristic gives 3 and 71 there on an H200's 132 SMs.)"""
    spec = {"seqlens": [[1, kv]], "hq": 8, "hkv": 1, "d": 128, "causal": True, "page_size": 16, "seed": 5}
    r = run(gpu_build, "decode_split", spec, sms=sms, splits=splits)
    assert r["ok"] and r["identical_to_given"], r


# --- The decode kernel's built-in rule (issue 24; patch 0004's routing::decode_kernel_rule) ----------

DECODE = "sm70-decode"
# (id, spec, call overrides, route): FA2PATCH_SM70_DECODE unset, routing's SM count forced to 80 (a
# V100-SXM2: the exact route holds 80 CTAs at once at head dims 128 and 256). K/V bytes per exact-route
# wave against the bound of the call's rows and head dim (fa2patch.model.decode_route.RULE_MIB).
DECODE_RULE = [
    # 3 sequences, 6/1 x 256, 4,000 keys at most: 12 MB in one wave, bound 32 MiB
    (
        "batch-6-1-d256-paged16",
        {"seqlens": [[1, 300], [1, 17], [1, 4000]], "hq": 6, "hkv": 1, "d": 256, "page_size": 16},
        {},
        DECODE,
    ),
    ("6-1-d256-40000-keys", {"seqlens": [[1, 40000]], "hq": 6, "hkv": 1, "d": 256}, {}, EXACT),  # 41 MB
    # the host-side max_seqlen_k decides (as in a captured graph), not the keys the sequence has
    ("max-seqlen-k-decides", {"seqlens": [[1, 300]], "hq": 6, "hkv": 1, "d": 256}, {"max_seqlen_k": 40000}, EXACT),
    (
        "window-6-rows-unswapped",
        {"seqlens": [[1, 3000], [1, 40]], "hq": 6, "hkv": 1, "d": 128, "window": [256, 0]},
        {},
        DECODE,
    ),
    ("mha-d128-4000-keys", {"seqlens": [[1, 4000]], "hq": 2, "hkv": 2, "d": 128}, {}, DECODE),  # 4.1 MB, bound 4 MiB
    ("mha-d128-5000-keys", {"seqlens": [[1, 5000]], "hq": 2, "hkv": 2, "d": 128}, {}, EXACT),
    # 64 sequences x 8 KV heads: 512 CTAs, 7 waves; 134 MB (19 MB a wave) in, 268 MB (38 MB a wave) out
    (
        "64-seqs-32-8-d128-512-keys",
        {"seqlens": [[1, 512]] * 64, "hq": 32, "hkv": 8, "d": 128, "page_size": 16},
        {},
        DECODE,
    ),
    (
        "64-seqs-32-8-d128-1024-keys",
        {"seqlens": [[1, 1024]] * 64, "hq": 32, "hkv": 8, "d": 128, "page_size": 16},
        {},
        EXACT,
    ),
    ("12-rows-row-blocks", {"seqlens": [[1, 300]], "hq": 12, "hkv": 1, "d": 128}, {}, EXACT),  # rule: 8 rows at most
    ("softcap-stays-exact", {"seqlens": [[1, 300], [1, 17]], "hq": 6, "hkv": 1, "d": 256, "softcap": 30.0}, {}, EXACT),
    ("speculative-q2", {"seqlens": [[2, 300]], "hq": 4, "hkv": 2, "d": 64}, {}, EXACT),  # rule: one query row
]


@pytest.mark.parametrize("name,spec,override,route", DECODE_RULE, ids=[t[0] for t in DECODE_RULE])
def test_decode_rule_sends_small_decode_calls_to_the_decode_kernel(gpu_build, name, spec, override, route):
    """With its switch unset the decode kernel takes exactly the calls the rule admits: route_stats
    counts the route, the call meets the contract, and out and LSE are bitwise the same call's with the
    switch at "1" (decode kernel) or "0" (exact route), whichever the rule chose."""
    r = run(gpu_build, "decode_rule", {**spec, "causal": True, "seed": 13}, override=override, sms=80)
    assert r["routes"] == {route: 1} and r["ok"], r
    assert r["identical_to_1" if route == DECODE else "identical_to_0"], r


# --- Routing profiles (issue 17 item 5; spec: the routing profile format 1) --------------------------

PROFILE_ENV = "FA2PATCH_ROUTING_PROFILE"
# BASE: hq 4 / hkv 1 (group 4), head dim 256, max_seqlen_q 1024, max_seqlen_k 16384.
AT_BASE = {"group": 4, "head_dim": 256, "q": [1024, 1025], "kv": [16384, 16385]}
# One decode sequence of 6/1 x 256 (paged, 16-token pages), and a decision covering its shape.
DECODE_300 = {"seqlens": [[1, 300]], "hq": 6, "hkv": 1, "d": 256, "page_size": 16}
DECODE_40K = {**DECODE_300, "seqlens": [[1, 40000]]}
AT_DECODE = {"group": 6, "head_dim": 256, "q": [1, 2], "kv": [0, 1 << 20]}
DECIDE_BASE = {"heads_q": 4, "heads_k": 1, "head_dim": 256, "max_seqlen_q": 1024, "max_seqlen_k": 16384}

# (id, spec changes, sms, decisions, expected counter changes): each direction a profile can send a
# call, shown by route_stats; every call also meets the numerics contract.
PROFILE_TABLE = [
    # The built-in rule would take the long-prefill route; the profile says exact.
    (
        "exact",
        {},
        "no_split",
        [{**AT_BASE, "route": EXACT}],
        {"routes": {EXACT: 1}, "exact_reasons": {"profile": 1}, "fallbacks": {}},
    ),
    (
        "exact-splitkv",
        {},
        "no_split",
        [{**AT_BASE, "route": EXACT, "splits": 3}],
        {"routes": {SPLIT: 1}, "exact_reasons": {"profile": 1}, "fallbacks": {}},
    ),
    # The built-in rule would keep the exact route (max_seqlen_k below the range); the profile says
    # long-prefill.
    (
        "long-prefill",
        {"seqlens": [[1024, 16000]]},
        "no_split",
        [{**AT_BASE, "kv": [16000, 16001], "route": PREFILL}],
        {"routes": {PREFILL: 1}, "exact_reasons": {}, "fallbacks": {}},
    ),
    # Below the built-in rule's range ("short").
    (
        "long-prefill-short-call",
        {"seqlens": [[512, 4096]]},
        "no_split",
        [{"group": 4, "head_dim": 256, "q": [0, 1024], "kv": [0, 16384], "route": PREFILL}],
        {"routes": {PREFILL: 1}, "exact_reasons": {}, "fallbacks": {}},
    ),
    # The first matching decision wins.
    (
        "first-match-wins",
        {},
        "no_split",
        [
            {"group": 4, "head_dim": 256, "q": [0, 1 << 20], "kv": [0, 1 << 30], "route": EXACT, "splits": 2},
            {**AT_BASE, "route": PREFILL},
        ],
        {"routes": {SPLIT: 1}, "exact_reasons": {"profile": 1}, "fallbacks": {}},
    ),
    # Half-open ranges: q = [0, 1024) does not hold 1024; no decision matches, the built-in rule applies.
    (
        "no-match-half-open",
        {},
        "no_split",
        [{"group": 4, "head_dim": 256, "q": [0, 1024], "kv": [0, 1 << 30], "route": EXACT}],
        {"routes": {PREFILL: 1}, "exact_reasons": {}, "fallbacks": {}},
    ),
    (
        "no-match-other-group",
        {},
        "no_split",
        [{**AT_BASE, "group": 8, "route": EXACT}],
        {"routes": {PREFILL: 1}, "exact_reasons": {}, "fallbacks": {}},
    ),
    # A decision whose route the call cannot take: ignored, the built-in rule applies.
    (
        "ineligible-long-prefill-for-a-batch",
        {"seqlens": [[1024, 16384], [1, 300]]},
        "no_split",
        [{**AT_BASE, "route": PREFILL}],
        {"routes": {EXACT: 1}, "exact_reasons": {"batch": 1}, "fallbacks": {"profile_route_ineligible": 1}},
    ),
    (
        "ineligible-splits-for-decode",
        {"seqlens": [[1, 300]], "hq": 8, "hkv": 2, "d": 128},
        "no_split",
        [{"group": 4, "head_dim": 128, "q": [1, 2], "kv": [0, 1 << 20], "route": EXACT, "splits": 3}],
        {"routes": {EXACT: 1}, "exact_reasons": {"head_dim": 1}, "fallbacks": {"profile_route_ineligible": 1}},
    ),
    # A sliding window: tune measures full causal calls only, so every decision is ineligible for a
    # windowed call (spec: "Sliding-window calls"), a split-KV one included.
    (
        "ineligible-splits-for-a-window",
        {"window": [512, 0]},
        "no_split",
        [{**AT_BASE, "route": EXACT, "splits": 3}],
        {"routes": {EXACT: 1}, "exact_reasons": {"window": 1}, "fallbacks": {"profile_route_ineligible": 1}},
    ),
    (
        "ineligible-exact-for-a-window",
        {"window": [512, 0]},
        "no_split",
        [{**AT_BASE, "route": EXACT}],
        {"routes": {EXACT: 1}, "exact_reasons": {"window": 1}, "fallbacks": {"profile_route_ineligible": 1}},
    ),
    # The decode kernel (issue 24), its switch unset: a decision's route is its kernel. 6/1 x 256 over
    # 40,000 keys is 41 MB, beyond the rule's 32 MiB (exact); 300 keys are far inside it (decode).
    (
        "decode-kernel-beyond-the-rule",
        {**DECODE_40K, "decode_kernel": None},
        "no_split",
        [{**AT_DECODE, "route": DECODE}],
        {"routes": {DECODE: 1}, "exact_reasons": {"profile": 1}, "fallbacks": {}},
    ),
    (
        "exact-kernel-inside-the-rule",
        {**DECODE_300, "decode_kernel": None},
        "no_split",
        [{**AT_DECODE, "route": EXACT}],
        {"routes": {EXACT: 1}, "exact_reasons": {"profile": 1}, "fallbacks": {}},
    ),
    # batch [1, 3) does not hold the call's 3 sequences; [3, 4) does
    (
        "decode-by-batch",
        {**DECODE_40K, "seqlens": [[1, 40000], [1, 300], [1, 17]], "decode_kernel": None},
        "no_split",
        [{**AT_DECODE, "batch": [1, 3], "route": EXACT}, {**AT_DECODE, "batch": [3, 4], "route": DECODE}],
        {"routes": {DECODE: 1}, "exact_reasons": {"profile": 1}, "fallbacks": {}},
    ),
    # no decision matches: the rule (41 MB: exact)
    (
        "decode-no-match-batch",
        {**DECODE_40K, "decode_kernel": None},
        "no_split",
        [{**AT_DECODE, "batch": [2, 64], "route": DECODE}],
        {"routes": {EXACT: 1}, "fallbacks": {}},
    ),
    # 17 rows per KV head: no decode-kernel instantiation (16 at most); ignored, the rule keeps it exact
    (
        "ineligible-decode-kernel-for-17-rows",
        {"seqlens": [[1, 300]], "hq": 17, "hkv": 1, "d": 128, "decode_kernel": None},
        "no_split",
        [{"group": 17, "head_dim": 128, "q": [1, 2], "kv": [0, 1 << 20], "route": DECODE}],
        {"routes": {EXACT: 1}, "fallbacks": {"profile_route_ineligible": 1}},
    ),
    # softcap: tune times the plain key loop only; ignored, the rule keeps it exact
    (
        "ineligible-decode-for-softcap",
        {**DECODE_300, "softcap": 30.0, "decode_kernel": None},
        "no_split",
        [{**AT_DECODE, "route": DECODE}],
        {"routes": {EXACT: 1}, "fallbacks": {"profile_route_ineligible": 1}},
    ),
    # a window: ignored, then the rule takes the small windowed call to the decode kernel
    (
        "ineligible-decode-for-a-window-then-the-rule",
        {**DECODE_300, "window": [128, 0], "decode_kernel": None},
        "no_split",
        [{**AT_DECODE, "route": EXACT}],
        {"routes": {DECODE: 1}, "fallbacks": {"profile_route_ineligible": 1}},
    ),
    # FA2PATCH_SM70_DECODE=0, where set, wins over a decision for the decode kernel
    (
        "decode-switch-off-wins",
        {**DECODE_40K, "decode_kernel": False},
        "no_split",
        [{**AT_DECODE, "route": DECODE}],
        {"routes": {EXACT: 1}, "exact_reasons": {"profile": 1}, "fallbacks": {}},
    ),
]


@pytest.mark.parametrize("name,change,sms,decisions,expected", PROFILE_TABLE, ids=[t[0] for t in PROFILE_TABLE])
def test_profile_routes_the_call(gpu_build, name, change, sms, decisions, expected):
    r = run(gpu_build, "route", {**BASE, **change, "seed": 21}, sms=sms, profile={"decisions": decisions})
    written = r["profile_written"]
    assert r["profile"] == {
        "path": written["path"],
        "status": "in use",
        "device": written["device"]["name"],
        "decisions": len(decisions),
    }, r
    assert {g: r[g] for g in expected} == expected, r
    assert r["ok"], r  # the numerics contract, on whichever route ran
    assert not [line for line in r["log_lines"] if "refused" in line], r


def test_profile_decisions_without_running_attention(gpu_build):
    """_routing_decide_for_testing under a profile: first match, half-open bounds, eligibility, and
    the built-in rule where nothing matches."""
    decisions = [
        {"group": 6, "head_dim": 256, "q": [2048, 8192], "kv": [32768, 1 << 20], "route": EXACT, "splits": 3},
        {"group": 6, "head_dim": 256, "q": [1024, 2048], "kv": [16384, 1 << 20], "route": PREFILL},
        {"group": 4, "head_dim": 128, "q": [0, 1 << 20], "kv": [0, 1 << 20], "route": EXACT, "splits": 2},
    ]
    g6 = {"heads_q": 6, "heads_k": 1, "head_dim": 256}
    asked = [
        {**g6, "max_seqlen_q": 4096, "max_seqlen_k": 32768},  # decision 0
        {**g6, "max_seqlen_q": 8192, "max_seqlen_k": 32768},  # q == hi: no match
        {**g6, "max_seqlen_q": 4096, "max_seqlen_k": 32767},  # kv < lo: no match
        {**g6, "max_seqlen_q": 1024, "max_seqlen_k": 16384},  # decision 1
        {**g6, "max_seqlen_q": 1024, "max_seqlen_k": 16384, "batch": 2},  # decision 1, ineligible
        {**g6, "max_seqlen_q": 1024, "max_seqlen_k": 16384, "causal": False},  # ineligible
        {"heads_q": 32, "heads_k": 8, "head_dim": 128, "max_seqlen_q": 77, "max_seqlen_k": 5000},  # decision 2
        {"heads_q": 32, "heads_k": 8, "head_dim": 128, "max_seqlen_q": 1, "max_seqlen_k": 5000},  # decode
        {"heads_q": 32, "heads_k": 8, "head_dim": 128, "max_seqlen_q": 77, "max_seqlen_k": 0},  # no keys
        {**g6, "max_seqlen_q": 4096, "max_seqlen_k": 32768, "window_size_left": 1024},  # decision 0, window
        {**g6, "max_seqlen_q": 1024, "max_seqlen_k": 16384, "window_size_right": 64},  # decision 1, window
        {
            "heads_q": 32,
            "heads_k": 8,
            "head_dim": 128,
            "max_seqlen_q": 77,
            "max_seqlen_k": 5000,
            "window_size_left": 0,
        },  # decision 2, window
        {**g6, "max_seqlen_q": 4096, "max_seqlen_k": 32768, "window_size_right": 0},  # causal: decision 0
    ]
    r = run(gpu_build, "decide", BASE, sms="device", profile={"decisions": decisions}, decide=asked)
    got = [(d["route"], d["splits"], d["by"], d["profile_ineligible"]) for d in r["decided"]]
    assert got[0] == (SPLIT, 3, "profile", None), r
    assert got[1][2] == got[2][2] == "builtin" and got[1][3] is got[2][3] is None, r
    assert got[3] == (PREFILL, 1, "profile", None), r
    assert got[4] == (EXACT, 1, "builtin", "batch") and r["decided"][4]["reason"] == "batch", r
    assert got[5] == (EXACT, 1, "builtin", "not_causal"), r
    assert got[6] == (SPLIT, 2, "profile", None), r
    assert got[7] == (EXACT, 1, "builtin", "decode") and got[8] == (EXACT, 1, "builtin", "no_keys"), r
    # A window (left >= 0, or right > 0: right = 0 is the causal default) makes every decision ineligible.
    assert got[9:12] == [(EXACT, 1, "builtin", "window")] * 3, r
    assert [d["reason"] for d in r["decided"][9:12]] == ["window", "window", "head_dim"], r  # the first unfit
    assert got[12] == (SPLIT, 3, "profile", None), r
    assert r["profile"]["status"] == "in use" and r["profile"]["decisions"] == 3, r


def test_profile_decode_decisions_name_the_kernel_without_running_attention(gpu_build):
    """_routing_decide_for_testing's "runs" under decode decisions (FA2PATCH_SM70_DECODE unset):
    the decision's kernel where it matches (batch included), the rule's where none does, and the
    rule's after a decision the decode kernel cannot take."""
    decisions = [
        {**AT_DECODE, "batch": [1, 2], "route": DECODE},
        {**AT_DECODE, "batch": [2, 1 << 20], "route": EXACT},
        {"group": 17, "head_dim": 128, "q": [1, 2], "kv": [0, 1 << 20], "route": DECODE},
    ]
    g6 = {"heads_q": 6, "heads_k": 1, "head_dim": 256, "max_seqlen_q": 1}
    asked = [
        {**g6, "max_seqlen_k": 40000},  # decision 0: the decode kernel beyond the rule
        {**g6, "max_seqlen_k": 300, "batch": 2},  # decision 1: the exact kernel inside the rule
        {**g6, "max_seqlen_k": 300, "batch": 2, "window_size_left": 64},  # a window: the rule
        {**g6, "max_seqlen_k": 1 << 20},  # kv == hi: no match, the rule (exact)
        {"heads_q": 17, "heads_k": 1, "head_dim": 128, "max_seqlen_q": 1, "max_seqlen_k": 300},  # 17 rows
        {**g6, "max_seqlen_k": 40000, "softcap": 30.0},  # decision 0's kernel, but softcap: the rule
        {**g6, "max_seqlen_k": 40000, "alibi": True},  # ALiBi: the rule
    ]
    r = run(
        gpu_build,
        "decide",
        {**DECODE_300, "decode_kernel": None},
        sms="device",
        profile={"decisions": decisions},
        decide=asked,
    )
    got = [(d["route"], d["runs"], d["by"], d["profile_ineligible"]) for d in r["decided"]]
    assert got[0] == (EXACT, DECODE, "profile", None), r
    assert got[1] == (EXACT, EXACT, "profile", None), r
    assert got[2] == (EXACT, DECODE, "builtin", "window"), r
    assert got[3] == (EXACT, EXACT, "builtin", None), r
    assert got[4] == (EXACT, EXACT, "builtin", "decode_kernel"), r
    assert got[5:] == [(EXACT, EXACT, "builtin", "softcap"), (EXACT, EXACT, "builtin", "alibi")], r


def test_decisions_of_the_builtin_rule_and_the_test_hook(gpu_build):
    """Without a profile: the built-in rule (at the SM count "no_split": never a split) and the
    split-KV test hook, which takes every call with max_seqlen_q >= 2 and keys."""
    asked = [
        DECIDE_BASE,
        {**DECIDE_BASE, "batch": 2},
        {**DECIDE_BASE, "head_dim": 128},
        {**DECIDE_BASE, "max_seqlen_q": 1023},
        {**DECIDE_BASE, "window_size_left": 100},
        {**DECIDE_BASE, "softcap": 30.0},
        {**DECIDE_BASE, "alibi": True},
    ]
    r = run(gpu_build, "decide", BASE, decide=asked)
    got = [(d["route"], d["by"], d["reason"]) for d in r["decided"]]
    assert got == [
        (PREFILL, "builtin", None),
        (EXACT, "builtin", "batch"),
        (EXACT, "builtin", "head_dim"),
        (EXACT, "builtin", "short"),
        (EXACT, "builtin", "window"),
        (EXACT, "builtin", "softcap"),
        (EXACT, "builtin", "alibi"),
    ], r
    assert r["profile"] is None, r
    hooked = [
        DECIDE_BASE,
        {**DECIDE_BASE, "max_seqlen_q": 2},
        {**DECIDE_BASE, "max_seqlen_q": 1},
        {**DECIDE_BASE, "max_seqlen_k": 0},
    ]
    r = run(gpu_build, "decide", BASE, decide=hooked, prefill_splits=4)
    got = [(d["route"], d["splits"], d["by"]) for d in r["decided"]]
    assert got == [(SPLIT, 4, "test_hook"), (SPLIT, 4, "test_hook"), (EXACT, 1, "builtin"), (EXACT, 1, "builtin")], r


def test_builtin_split_rule(gpu_build):
    """The built-in split-KV rule (routing.cpp builtin_prefill_splits): one causal sequence without a
    window on the exact route. With every grid in one wave (sms="split") the gain of s splits is
    (F + n) / (F + ceil(n / s)) for n = 512 key blocks of 32 and F = 32: 1.89, 2.68, 3.40 for
    s = 2, 3, 4, so 4; a batch, a window, a non-causal call and a decode call are never split; and
    with whole waves of one SM (sms="no_split") splitting only adds waves."""
    asked = [
        {**DECIDE_BASE, "head_dim": 128},
        {**DECIDE_BASE, "max_seqlen_q": 1023},
        # Head dim 256, so that the reason (the long-prefill op's first misfit, routing.cpp
        # prefill_unfit, which checks the head dim first) is the property under test.
        {**DECIDE_BASE, "batch": 2},
        {**DECIDE_BASE, "window_size_left": 100},
        {**DECIDE_BASE, "causal": False},
        {**DECIDE_BASE, "head_dim": 128, "max_seqlen_q": 1},
        DECIDE_BASE,
    ]
    split = run(gpu_build, "decide", BASE, sms="split", decide=asked)
    got = [(d["route"], d["splits"], d["by"], d["reason"]) for d in split["decided"]]
    assert got == [
        (SPLIT, 4, "builtin", "head_dim"),
        (SPLIT, 4, "builtin", "short"),
        (EXACT, 1, "builtin", "batch"),
        (EXACT, 1, "builtin", "window"),
        (EXACT, 1, "builtin", "not_causal"),
        (EXACT, 1, "builtin", "head_dim"),
        (PREFILL, 1, "builtin", None),
    ], split
    unsplit = run(gpu_build, "decide", BASE, sms="no_split", decide=asked[:2])
    assert [(d["route"], d["splits"]) for d in unsplit["decided"]] == [(EXACT, 1), (EXACT, 1)], unsplit
    # And a call that runs: the built-in split meets the numerics contract and is counted.
    r = run(gpu_build, "route", {**BASE, "d": 128, "seed": 5}, sms="split")
    assert r["routes"] == {SPLIT: 1} and r["exact_reasons"] == {"head_dim": 1}, r
    assert r["ok"], r


def test_profile_long_prefill_decision_during_graph_capture_is_ignored(gpu_build):
    """Graph capture is a call the long-prefill route cannot take: the decision is ignored
    (profile_route_ineligible), the built-in rule's long-prefill pick falls back (graph_capture),
    and the replay is the exact route's result."""
    r = run(gpu_build, "graph", BASE, profile={"decisions": [{**AT_BASE, "route": PREFILL}]})
    assert r["captured"]["fallbacks"] == {"profile_route_ineligible": 1, "graph_capture": 1}, r
    assert r["captured"]["routes"] == {EXACT: 1}, r
    assert r["identical_to_exact"], r


# Refused profiles: (corruption, substrings the reason must hold; "{name}", "{sms}", "{sha}", "{cap}"
# stand for the device's and the artifact's values).
# The file's own faults are found by fa2patch_vllm.routing_profile (Python), the device's by the
# extension at the device's first SM70 call; "not_installed": the variable set, nothing installed.
REFUSALS = [
    ("bad_json", ["invalid_json: ", "not valid JSON"]),
    ("wrong_format", ["wrong_format: ", "fa2patch-routing-profile/1", "fa2patch-routing-profile/2"]),
    ("unknown_key", ["unknown_key: ", "unknown key(s) decision"]),
    ("bad_range", ["bad_field: ", "decisions[0].q", "[2048, 1024]"]),
    ("unknown_route", ["unknown_route: ", "'sm70-fast'"]),
    ("other_device_name", ["device_mismatch: ", '"{name} (another card)"', '"{name}"']),
    ("other_sm_count", ["device_mismatch: device.sms is {sms_plus_1}", "this device has {sms}"]),
    (
        "other_capability",
        ["device_mismatch: device.capability is [{major}, {minor_plus_1}]", "this device has [{major}, {minor}]"],
    ),
    ("other_sha256", ["extension_mismatch: ", "0" * 64, "{sha}"]),
    ("unreadable", ["unreadable: ", "No such file"]),
    ("directory", ["unreadable: ", "Is a directory"]),
    ("not_installed", ["not_installed: FA2PATCH_ROUTING_PROFILE is set", "routing_profile.install()"]),
]


@pytest.mark.parametrize("corrupt,words", REFUSALS, ids=[t[0] for t in REFUSALS])
def test_refused_profile_is_logged_once_and_the_builtin_rule_applies(gpu_build, corrupt, words):
    r = run(
        gpu_build,
        "route",
        {**BASE, "seed": 31},
        profile={"decisions": [{**AT_BASE, "route": EXACT}], "corrupt": corrupt},
        decide=[DECIDE_BASE],
    )
    w = r["profile_written"]
    facts = {
        "name": w["device"]["name"],
        "sms": w["device"]["sms"],
        "sms_plus_1": w["device"]["sms"] + 1,
        "major": w["device"]["capability"][0],
        "minor": w["device"]["capability"][1],
        "minor_plus_1": w["device"]["capability"][1] + 1,
        "sha": w["extension_sha256"],
    }
    assert r["profile"]["status"] == "refused" and r["profile"]["path"] == w["path"], r
    reason = r["profile"]["reason"]
    for word in words:
        assert word.format(**facts) in reason, (word, r)
    refused = [line for line in r["log_lines"] if "routing profile" in line]
    assert len(refused) == 1 and w["path"] in refused[0] and reason in refused[0], r  # one line, the whole reason
    # The built-in rule: the long-prefill route for BASE (the decision said exact; it was not used).
    assert r["decided"][0]["by"] == "builtin" and r["decided"][0]["route"] == PREFILL, r
    assert r["routes"] == {PREFILL: 1} and r["fallbacks"] == {} and r["ok"], r
