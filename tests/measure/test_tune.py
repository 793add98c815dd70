# SPDX-License-Identifier: BSD-3-Clause
"""`fa2patch tune` on the CPU: config parsing, vLLM's tensor-parallel head split, the chunk plan
and grid, decisions merged from a synthetic measured table (expected ranges written by hand), the
profile validator against good files and every refusal case of the spec, route forcing with a
fake extension, the run-time estimate and the command line."""

import copy
import hashlib
import itertools
import json
import math
import os
import subprocess
import sys

import pytest

from fa2patch.common.errors import EnvironmentProblem
from fa2patch.common.routes import DECODE, DECODE_ENV, EXACT, GQA, SPLITKV
from fa2patch.measure import profile, tune, tune_plan, tune_worker
from fa2patch.measure.tune_plan import (
    ModelHeads,
    RankHeads,
    chunk_plan,
    decode_kv_points,
    decode_points,
    grid_points,
    kv_points,
    per_rank,
    q_points,
)
from helpers import REPO

# --- config.json ---------------------------------------------------------------------------------

LLAMA = {  # Llama-3.1-8B-like: no head_dim (hidden_size / heads), GQA 32/8
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}
GEMMA3 = {  # Gemma-3-27B-like: the language model nested under text_config, a vision tower beside it
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "mm_tokens_per_image": 256,
    "text_config": {
        "model_type": "gemma3_text",
        "hidden_size": 5376,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "head_dim": 128,
        "num_hidden_layers": 62,
        "sliding_window": 1024,
        "query_pre_attn_scalar": 168,
        "max_position_embeddings": 131072,
    },
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152, "num_attention_heads": 16},
}
QWEN35 = {  # Qwen3.5-27B-like (the production model): 24/4 heads of 256, nested, 256K context
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "text_config": {
        "model_type": "qwen3_5_text",
        "hidden_size": 5120,
        "num_attention_heads": 24,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 262144,
    },
}
MHA = {  # Llama-2-7B / GPT-NeoX style multi-head attention: no num_key_value_heads, no head_dim
    "architectures": ["GPTNeoXForCausalLM"],
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "max_position_embeddings": 2048,
}


@pytest.mark.parametrize(
    "doc, expected",
    [
        (LLAMA, (32, 8, 128, 131072)),
        (GEMMA3, (32, 16, 128, 131072)),
        (QWEN35, (24, 4, 256, 262144)),
        (MHA, (32, 32, 128, 2048)),
        ({**MHA, "num_key_value_heads": None, "head_dim": None}, (32, 32, 128, 2048)),
        ({"num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 80, "hidden_size": 1000}, (8, 2, 80, None)),
    ],
)
def test_model_config_heads(tmp_path, doc, expected):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    m = tune_plan.read_model_config(path)
    assert (m.heads, m.kv_heads, m.head_dim, m.max_position_embeddings) == expected
    assert m.source.endswith("text_config") == ("text_config" in doc)


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"hidden_size": 4096}, "num_attention_heads must be a positive integer"),
        ({"num_attention_heads": True, "hidden_size": 4096}, "num_attention_heads must be a positive integer"),
        ({"num_attention_heads": 24, "hidden_size": 1000}, "not a multiple of num_attention_heads"),
        (
            {"num_attention_heads": 24, "num_key_value_heads": 5, "head_dim": 64},
            "not a multiple of num_key_value_heads",
        ),
        ({"num_attention_heads": 8, "num_key_value_heads": 0, "head_dim": 64}, "num_key_value_heads must be"),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_bad_model_configs_are_refused(doc, message):
    with pytest.raises(EnvironmentProblem, match=message):
        tune_plan.parse_model_config(doc)


def test_unreadable_config_names_the_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(EnvironmentProblem, match=r"config\.json: cannot read it as JSON"):
        tune_plan.read_model_config(path)


# --- tensor parallelism (vLLM's QKVParallelLinear, expected values worked out by hand) ------------


@pytest.mark.parametrize(
    "heads, kv, tp, expected",
    [
        (24, 4, 1, (24, 4)),
        (24, 4, 4, (6, 1)),  # the production shape: 6/1 per rank
        (32, 8, 2, (16, 4)),
        (32, 8, 8, (4, 1)),
        (32, 8, 16, (2, 1)),  # fewer KV heads than ranks: one KV head per rank, replicated twice
        (32, 16, 4, (8, 4)),
        (32, 32, 4, (8, 8)),  # MHA
    ],
)
def test_tensor_parallel_heads_per_rank(heads, kv, tp, expected):
    r = per_rank(ModelHeads(heads, kv, 128, None, "t"), tp)
    assert (r.hq, r.hkv) == expected and r.d == 128 and r.group == expected[0] // expected[1]


@pytest.mark.parametrize(
    "heads, kv, tp, message",
    [
        (24, 4, 5, "24 is not a multiple of 5"),
        (24, 4, 3, "the 4 KV heads evenly"),  # 4 KV heads over 3 ranks
        (28, 4, 7, "replicates the 4 KV heads"),  # 7 ranks >= 4 KV heads, 7 not a multiple of 4
    ],
)
def test_tensor_parallel_splits_vllm_refuses(heads, kv, tp, message):
    with pytest.raises(EnvironmentProblem, match=message):
        per_rank(ModelHeads(heads, kv, 128, None, "t"), tp)


# --- chunked prefill and the grid -------------------------------------------------------------------


@pytest.mark.parametrize(
    "length, chunk, expected",
    [
        (10000, 4096, [(4096, 4096), (4096, 8192), (1808, 10000)]),
        (8192, 4096, [(4096, 4096), (4096, 8192)]),
        (100, 4096, [(100, 100)]),
        (5, 2, [(2, 2), (2, 4), (1, 5)]),
    ],
)
def test_chunk_plan(length, chunk, expected):
    assert chunk_plan(length, chunk) == expected


def test_chunk_plan_invariants():
    for length in (1, 4095, 4096, 4097, 131072, 131071):
        plan = chunk_plan(length, 4096)
        assert sum(q for q, _ in plan) == length and plan[-1][1] == length
        assert all(q == 4096 for q, _ in plan[:-1])
        assert all(kv == prev + q for (_, prev), (q, kv) in itertools.pairwise([(0, 0), *plan]))


def test_q_points():
    assert q_points(4096, 131072) == [4096, 2048, 1024]
    assert q_points(2048, 262144) == [2048, 1024]
    assert q_points(4096, 3000) == [3000, 1500]
    assert q_points(512, 100000) == [512]


def test_kv_points_of_the_production_chunk():
    # 4096 x sqrt(2)^j -> the nearest multiple of 4096 (the KV a chunk of 4096 can have): 4096, 5793
    # (-> 4096), 8192, 11585 (-> 12288), 16384, 23170 (-> 24576), 32768, 46341 (-> 45056), 65536,
    # 92682 (-> 94208), 131072.
    assert kv_points(4096, 4096, 131072) == [4096, 8192, 12288, 16384, 24576, 32768, 45056, 65536, 94208, 131072]


@pytest.mark.parametrize("chunk, max_len", [(4096, 131072), (2048, 262144), (1000, 9000), (8192, 100000)])
def test_every_grid_point_is_a_chunk_vllm_runs(chunk, max_len):
    points = grid_points(chunk, max_len)
    assert len(points) == len(set(points))
    for q, kv in points:
        # the last chunk of a prompt of kv tokens is exactly this call
        assert chunk_plan(kv, chunk)[-1] == (q, kv) and kv <= max_len
    for q in {q for q, _ in points}:
        kvs = sorted(kv for qq, kv in points if qq == q)
        assert kvs[0] == q and kvs[-1] > max_len - chunk
        # geometric: no gap wider than a factor sqrt(2) plus one chunk
        assert all(b <= a * math.sqrt(2) + chunk for a, b in itertools.pairwise(kvs))


def test_decode_kv_points_double_from_256_to_the_longest():
    assert decode_kv_points(131072) == [256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
    assert decode_kv_points(1000) == [256, 512, 1000]
    assert decode_kv_points(256) == [256]


def test_decode_points_stop_at_the_kv_budget():
    # 6/1 x 256: 1 KV head x 256 x 4 = 1 KiB per key and sequence; 4 GiB holds B x KV = 2^22.
    six = decode_points(RankHeads(6, 1, 256), 131072, (64, 1))
    assert [kv for kv, b in six if b == 1] == decode_kv_points(131072)
    assert [kv for kv, b in six if b == 64][-1] == 65536  # 64 x 65,536 = 2^22 exactly; 131,072 is over
    assert six == sorted(six, key=lambda p: (p[1], p[0]))  # by B, then KV
    # 32/8 x 128: 8 x 128 x 4 = 4 KiB; at B = 64 up to 2^22 / 4 = 16,384 keys
    assert max(kv for kv, b in decode_points(RankHeads(32, 8, 128), 32768, (64,))) == 16384
    assert decode_points(RankHeads(6, 1, 256), 131072, ()) == []
    # no decode kernel for head dim 96 or 17 rows per KV head: nothing to compare the exact kernel with
    assert decode_points(RankHeads(32, 8, 96), 4096, (1,)) == decode_points(RankHeads(17, 1, 128), 4096, (1,)) == []
    assert decode_points(RankHeads(16, 1, 64), 256, (1,)) == [(256, 1)]


# --- decisions from a synthetic measured table ------------------------------------------------------


def rounds(base: float, ratio: float, jitter: float) -> list[float]:
    """Seven rounds: base x ratio, with a relative jitter pattern whose range is 2 x jitter."""
    pattern = [0, 1, -1, 0.5, -0.5, 0.25, 0]
    return [base * ratio * (1 + jitter * p) for p in pattern]


def rows_at(q, kv, routes: dict) -> list[dict]:
    """routes: name -> (ratio to exact, jitter, ok); the exact route runs 10 ms x kv/4096 flat."""
    base = 10.0 * kv / 4096
    out = [
        {
            "q": q,
            "kv": kv,
            "group": 6,
            "head_dim": 256,
            "route": EXACT,
            "splits": 1,
            "times_ms": rounds(base, 1.0, 0.0),
            "ok": True,
        }
    ]
    for name, (ratio, jitter, ok) in routes.items():
        route, splits = (EXACT, int(name[5:])) if name.startswith("split") else (GQA, 1)
        out.append(
            {
                "q": q,
                "kv": kv,
                "group": 6,
                "head_dim": 256,
                "route": route,
                "splits": splits,
                "times_ms": rounds(base, ratio, jitter),
                "ok": ok,
            }
        )
    return out


def test_winner_needs_a_gain_larger_than_the_spread():
    # paired ratio 0.95 with a spread of 2 x 0.02 = 0.04 < 0.05: wins; 2 x 0.03 = 0.06 > 0.05: does not.
    assert profile.winner(rows_at(4096, 4096, {"split3": (0.95, 0.02, True)}))["splits"] == 3
    assert profile.winner(rows_at(4096, 4096, {"split3": (0.95, 0.03, True)}))["route"] == EXACT
    # two winners: the lower median ratio; a faster route that broke the numerics never wins
    w = profile.winner(
        rows_at(4096, 4096, {"split2": (0.97, 0.001, True), "gqa": (0.90, 0.001, True), "split4": (0.5, 0.001, False)})
    )
    assert (w["route"], w["splits"]) == (GQA, 1) and w["median_ratio"] == pytest.approx(0.90)


def test_decisions_merge_into_ranges():
    table = []
    table += rows_at(4096, 4096, {"split3": (1.10, 0.001, True), "gqa": (0.99, 0.015, True)})  # exact
    table += rows_at(4096, 8192, {"split3": (1.02, 0.001, True), "gqa": (0.95, 0.005, True)})  # gqa
    table += rows_at(4096, 16384, {"split3": (0.995, 0.005, True), "gqa": (1.01, 0.005, True)})  # exact (within spread)
    table += rows_at(4096, 32768, {"split3": (0.92, 0.002, True), "split2": (0.95, 0.002, True)})
    table += rows_at(4096, 65536, {"split3": (0.92, 0.002, True), "gqa": (0.5, 0.0, False)})
    table += rows_at(4096, 131072, {"split3": (0.93, 0.002, True)})
    table += rows_at(1024, 1024, {"gqa": (0.8, 0.001, True)})
    table += rows_at(1024, 5120, {"gqa": (0.8, 0.001, True)})
    got = profile.decisions(table, rows_per_cta=64, max_model_len=131072)
    q4096, q1024 = [4033, 4097], [961, 1025]
    expected = [
        # Q=4096: boundaries at the geometric means sqrt(4096 x 8192) = 5793, sqrt(8192 x 16384) = 11585,
        # sqrt(16384 x 32768) = 23170; the last range ends past --max-model-len (131073)
        {"group": 6, "head_dim": 256, "q": q4096, "kv": [0, 5793], "route": EXACT},
        {"group": 6, "head_dim": 256, "q": q4096, "kv": [5793, 11585], "route": GQA},
        {"group": 6, "head_dim": 256, "q": q4096, "kv": [11585, 23170], "route": EXACT},
        {"group": 6, "head_dim": 256, "q": q4096, "kv": [23170, 131073], "route": EXACT, "splits": 3},
        {"group": 6, "head_dim": 256, "q": q1024, "kv": [0, 131073], "route": GQA},
    ]
    assert got == expected
    doc = dict(GOOD, decisions=got)
    profile.validate(doc)


def decode_rows(kv, batch, ratio, jitter=0.001, ok=True) -> list[dict]:
    """A decode point: the exact kernel 1 ms x kv/4096 flat, the decode kernel at ``ratio``."""
    base = kv / 4096
    common = {"q": 1, "kv": kv, "batch": batch, "group": 6, "head_dim": 256, "splits": 1}
    return [
        {**common, "route": EXACT, "times_ms": rounds(base, 1.0, 0.0), "ok": True},
        {**common, "route": DECODE, "times_ms": rounds(base, ratio, jitter), "ok": ok},
    ]


def test_decode_decisions_per_batch_point_come_first():
    table = rows_at(1024, 1024, {"gqa": (0.8, 0.001, True)})
    table += decode_rows(256, 1, 0.5) + decode_rows(512, 1, 0.6) + decode_rows(1024, 1, 1.2)
    table += decode_rows(256, 8, 0.7) + decode_rows(512, 8, 0.7) + decode_rows(1024, 8, 0.7, ok=False)
    table += decode_rows(256, 64, 1.5) + decode_rows(512, 64, 0.99, jitter=0.01)  # within the spread: exact
    got = profile.decisions(table, rows_per_cta=64, max_model_len=1024)
    one, eight, many = [1, 3], [3, 23], [23, 1 << 62]  # B: 1, round(sqrt 8) = 3, round(sqrt 512) = 23
    d = {"group": 6, "head_dim": 256, "q": [1, 2]}
    assert got == [
        # B=1: the decode kernel to sqrt(512 x 1024) = 724, then the exact kernel past --max-model-len
        {**d, "kv": [0, 724], "batch": one, "route": DECODE},
        {**d, "kv": [724, 1025], "batch": one, "route": EXACT},
        # B=8: the decode kernel broke the numerics at 1024 keys: never a decision there
        {**d, "kv": [0, 724], "batch": eight, "route": DECODE},
        {**d, "kv": [724, 1025], "batch": eight, "route": EXACT},
        # B=64: measured to 512 keys only (the K/V budget): no decision past sqrt(512 x 1024)
        {**d, "kv": [0, 724], "batch": many, "route": EXACT},
        {"group": 6, "head_dim": 256, "q": [961, 1025], "kv": [0, 1025], "route": GQA},
    ]
    profile.validate(dict(GOOD, decisions=got))
    assert "B >= 23: sm70-dense" in profile.summary(dict(GOOD, decisions=got))
    assert "Q [1, 2), KV [0, 724), B [1, 3): sm70-decode" in profile.summary(dict(GOOD, decisions=got))


def test_q_range_is_the_exact_routes_row_block():
    assert profile.q_range(4096, 64) == (4033, 4097)
    assert profile.q_range(1000, 64) == (961, 1025)
    assert profile.q_range(1, 64) == (1, 65)
    assert profile.q_range(4096, 128) == (3969, 4097)


def test_a_point_without_an_exact_measurement_gives_no_decision():
    table = rows_at(4096, 4096, {"gqa": (0.8, 0.0, True)})
    table[0]["ok"] = False
    table += rows_at(4096, 8192, {"gqa": (0.8, 0.0, True)})
    got = profile.decisions(table, 64, 8192)
    assert got == [{"group": 6, "head_dim": 256, "q": [4033, 4097], "kv": [0, 8193], "route": GQA}]


# --- the validator: good files and every refusal case of the spec -----------------------------------

SHA = "ab" * 32
# The spec's own example (routing-profile-spec.md), its comments removed, the sha filled in.
GOOD = {
    "format": "fa2patch-routing-profile/1",
    "device": {"name": "Tesla V100-SXM2-32GB", "sms": 80, "capability": [7, 0]},
    "extension_sha256": SHA,
    "software": {"torch": "2.9.1+cu128", "cuda": "12.8", "driver": "570.86.15", "fa2patch": "0.1.0"},
    "clocks_seen": {},
    "measured": [],
    "decisions": [
        {"group": 6, "head_dim": 256, "q": [1024, 2048], "kv": [16384, 1048576], "route": GQA},
        {"group": 6, "head_dim": 256, "q": [2048, 8192], "kv": [32768, 1048576], "route": EXACT, "splits": 3},
        {"group": 6, "head_dim": 256, "q": [2048, 8192], "kv": [0, 32768], "route": EXACT},
    ],
}
V100 = {"name": "Tesla V100-SXM2-32GB", "sms": 80, "capability": [7, 0]}


def mutate(path_value):
    def apply(doc):
        *keys, last = path_value[0]
        target = doc
        for k in keys:
            target = target[k]
        if path_value[1] is DELETE:
            del target[last]
        else:
            target[last] = path_value[1]
        return doc

    return apply


DELETE = object()
REFUSALS = [
    ("wrong_format", (["format"], "fa2patch-routing-profile/2")),
    ("wrong_format", (["format"], DELETE)),
    ("unknown_key", (["decision"], [])),  # a typo of a top-level key
    ("unknown_key", (["device", "uuid"], "GPU-1")),
    ("unknown_key", (["decisions", 0, "spilts"], 3)),
    ("bad_field", (["decisions"], DELETE)),
    ("bad_field", (["device"], DELETE)),
    ("bad_field", (["extension_sha256"], DELETE)),
    ("bad_field", (["device"], "Tesla V100")),
    ("bad_field", (["device", "name"], "")),
    ("bad_field", (["device", "sms"], "80")),
    ("bad_field", (["device", "sms"], 0)),
    ("bad_field", (["device", "capability"], [7])),
    ("bad_field", (["device", "capability"], "7.0")),
    ("bad_field", (["extension_sha256"], "AB" * 32)),
    ("bad_field", (["extension_sha256"], "ab" * 31)),
    ("bad_field", (["software"], ["torch"])),
    ("bad_field", (["clocks_seen"], 3)),
    ("bad_field", (["measured"], {})),
    ("bad_field", (["decisions"], {})),
    ("bad_field", (["decisions", 0], EXACT)),
    ("bad_field", (["decisions", 0, "group"], 0)),
    ("bad_field", (["decisions", 0, "group"], True)),
    ("bad_field", (["decisions", 0, "head_dim"], 256.0)),
    ("bad_field", (["decisions", 0, "head_dim"], 512)),  # the extension's reader: head dims up to 256
    ("bad_field", (["decisions", 0, "kv"], [0, 2**63])),
    ("bad_field", (["device", "sms"], 2**21)),
    ("bad_field", (["decisions", 0, "q"], [2048, 2048])),
    ("bad_field", (["decisions", 0, "q"], [2048, 1024])),
    ("bad_field", (["decisions", 0, "kv"], [-1, 5])),
    ("bad_field", (["decisions", 0, "kv"], [0, 5, 9])),
    ("bad_field", (["decisions", 0, "q"], DELETE)),
    ("bad_field", (["decisions", 0, "route"], 5)),
    ("bad_field", (["decisions", 0, "splits"], 2)),  # splits only with sm70-dense
    ("bad_field", (["decisions", 1, "splits"], 17)),
    ("bad_field", (["decisions", 1, "splits"], 0)),
    ("unknown_route", (["decisions", 1, "route"], SPLITKV)),  # a table name, not a route name
    ("unknown_route", (["decisions", 2, "route"], "sm80-fast")),
]


def test_good_profiles_pass(tmp_path):
    profile.validate(copy.deepcopy(GOOD), device=V100, sha256=SHA)
    minimal = {k: GOOD[k] for k in profile.reader().REQUIRED}
    profile.validate(copy.deepcopy(minimal), device=V100, sha256=SHA)
    profile.validate(dict(copy.deepcopy(GOOD), decisions=[]))
    path = tmp_path / "p.json"
    path.write_text(json.dumps(GOOD))
    assert profile.check_file(path, V100, SHA)["decisions"] == GOOD["decisions"]


@pytest.mark.parametrize("reason, change", REFUSALS, ids=[f"{r}-{'.'.join(map(str, c[0]))}" for r, c in REFUSALS])
def test_every_refusal_of_the_spec(reason, change):
    doc = mutate(change)(copy.deepcopy(GOOD))
    with pytest.raises(profile.ProfileRefused) as exc:
        profile.validate(doc, "p.json")
    assert exc.value.reason == reason and "p.json" in str(exc.value)


@pytest.mark.parametrize("key, value", [("name", "Tesla V100-PCIE-16GB"), ("sms", 72), ("capability", [9, 0])])
def test_another_device_is_refused_with_expected_and_actual(key, value):
    with pytest.raises(profile.ProfileRefused) as exc:
        profile.validate(copy.deepcopy(GOOD), "p.json", device={**V100, key: value})
    assert exc.value.reason == "device_mismatch"
    assert f"expected {value!r} (this GPU), actual {V100[key]!r}" in str(exc.value)


def test_another_extension_is_refused():
    with pytest.raises(profile.ProfileRefused) as exc:
        profile.validate(copy.deepcopy(GOOD), "p.json", sha256="cd" * 32)
    assert exc.value.reason == "extension_mismatch" and "cd" * 32 in str(exc.value) and SHA in str(exc.value)


def test_unreadable_and_invalid_files(tmp_path):
    with pytest.raises(profile.ProfileRefused) as exc:
        profile.check_file(tmp_path / "missing.json")
    assert exc.value.reason == "unreadable"
    with pytest.raises(profile.ProfileRefused) as exc:
        profile.check_file(tmp_path)  # a folder
    assert exc.value.reason == "unreadable"
    bad = tmp_path / "bad.json"
    for text in ('{"format": "fa2patch-routing-profile/1",}', "// comment\n{}", ""):
        bad.write_text(text)
        with pytest.raises(profile.ProfileRefused) as exc:
            profile.check_file(bad)
        assert exc.value.reason == "invalid_json"
    bad.write_bytes(b"\xff\xfe{}")  # not UTF-8, which JSON requires (RFC 8259)
    with pytest.raises(profile.ProfileRefused) as exc:
        profile.check_file(bad)
    assert exc.value.reason == "invalid_json"
    bad.write_text("[]")
    with pytest.raises(profile.ProfileRefused) as exc:
        profile.check_file(bad)
    assert exc.value.reason == "bad_field"


# --- building the profile from the worker's events ------------------------------------------------


def _start(capability=(7, 0)):
    return {
        "event": "start",
        "device": {"name": "Tesla V100-SXM2-32GB", "sms": 80, "capability": list(capability)},
        "software": {"torch": "2.9.1+cu128", "cuda": "12.8", "driver": "570.86.15"},
        "extension": {"path": "/x/_vllm_fa2_C.abi3.so", "sha256": SHA},
        "split_hook": True,
        "gqa": {"head_dim": 256, "max_group": 16},
        "rows_per_cta": 64,
        "nvml": {"available": False, "note": "NVML not sampled: test"},
    }


def _points():
    out = []
    for kv, split_ratio in ((4096, 1.1), (8192, 0.9)):
        rows = [
            {
                "route": r["route"],
                "splits": r["splits"],
                "times_ms": r["times_ms"],
                "median_ms": sorted(r["times_ms"])[3],
                "min_ms": min(r["times_ms"]),
                "max_ms": max(r["times_ms"]),
                "ok": True,
                "numerics": {"ok": True},
            }
            for r in rows_at(4096, kv, {"split2": (split_ratio, 0.001, True)})
        ]
        out.append({"event": "point", "q": 4096, "kv": kv, "rows": rows, "clocks": None})
    return out


PLAN = tune.Plan(RankHeads(6, 1, 256), chunk=4096, max_model_len=8192)


def test_profile_from_measurements_is_valid_and_decides():
    rows = tune.measured_rows(PLAN, _points())
    doc = tune.build_profile(PLAN, _start(), rows)
    assert doc["decisions"] == [
        {"group": 6, "head_dim": 256, "q": [4033, 4097], "kv": [0, 5793], "route": EXACT},
        {"group": 6, "head_dim": 256, "q": [4033, 4097], "kv": [5793, 8193], "route": EXACT, "splits": 2},
    ]
    split = next(r for r in rows if r["kv"] == 8192 and r["splits"] == 2)
    assert split["name"] == SPLITKV and split["ratio_to_exact"]["median"] == pytest.approx(0.9)
    assert "notes" not in doc["software"] and doc["software"]["fa2patch"]
    profile.validate(json.loads(json.dumps(doc)), device=_start()["device"], sha256=SHA)
    text = tune.render({"measured": rows, "profile": doc})
    assert "0.900 (" in text and "sm70-dense-splitkv x2" in text


def test_a_lab_profile_says_its_timings_are_not_v100_timings():
    doc = tune.build_profile(PLAN, _start((9, 0)), tune.measured_rows(PLAN, _points()))
    assert "not V100 timings" in doc["software"]["notes"] and "FA2PATCH_FORCE_SM70=1" in doc["software"]["notes"]


def test_default_file_name_is_device_keyed():
    assert (
        tune.default_name("Tesla V100-SXM2-32GB", RankHeads(6, 1, 256))
        == "routing-profile,device_name=Tesla_V100-SXM2-32GB,hq=6,hkv=1,d=256.json"
    )


def test_routes_at_a_point():
    gqa = {"head_dim": 256, "max_group": 16}
    assert PLAN.routes_at(4096, 8192, gqa) == [(EXACT, 1), (EXACT, 2), (EXACT, 3), (EXACT, 4), (GQA, 1)]
    assert (GQA, 1) not in tune.Plan(RankHeads(8, 4, 128), 4096, 8192).routes_at(4096, 8192, gqa)
    assert (GQA, 1) not in tune.Plan(RankHeads(32, 1, 256), 4096, 8192).routes_at(4096, 8192, gqa)
    assert (GQA, 1) not in PLAN.routes_at(4096, 8192, None)


# --- forcing routes (a fake extension) ---------------------------------------------------------------


class FakeOps:
    def __init__(self, hook=True):
        self.log = []
        if hook:
            self._routing_prefill_splits_for_testing = lambda n: self.log.append(("hook", n))


class FakeCall:
    def __init__(self, log, fail=False):
        self.log, self.fail = log, fail

    def varlen(self):
        self.log.append(("varlen", os.environ.get(tune_worker.ENV_EXACT), os.environ.get(DECODE_ENV)))
        if self.fail:
            raise RuntimeError("refused")

    def gqa(self):
        self.log.append(("gqa", None))


def test_run_route_forces_each_route():
    ops = FakeOps()
    tune_worker.run_route(ops, EXACT, 1, FakeCall(ops.log))
    tune_worker.run_route(ops, EXACT, 3, FakeCall(ops.log))
    tune_worker.run_route(ops, GQA, 1, FakeCall(ops.log))
    tune_worker.run_route(ops, DECODE, 1, FakeCall(ops.log))
    tune_worker.run_route(ops, EXACT, 1, FakeCall(ops.log))
    # the exact kernel with the decode kernel's switch at 0 (its rule must not take a decode call)
    assert ops.log == [
        ("hook", 1),
        ("varlen", "0", "0"),
        ("hook", 0),
        ("hook", 3),
        ("varlen", "0", "0"),
        ("hook", 0),
        ("gqa", None),
        ("hook", 1),
        ("varlen", "0", "1"),
        ("hook", 0),
        ("hook", 1),
        ("varlen", "0", "0"),
        ("hook", 0),
    ]
    bare = FakeOps(hook=False)
    tune_worker.run_route(bare, EXACT, 1, FakeCall(bare.log))
    assert bare.log == [("varlen", "0", "0")]


def test_run_route_restores_the_split_hook_when_the_call_fails():
    ops = FakeOps()
    with pytest.raises(RuntimeError, match="refused"):
        tune_worker.run_route(ops, EXACT, 2, FakeCall(ops.log, fail=True))
    assert ops.log[-1] == ("hook", 0)


def test_split_kv_without_the_hook_is_not_measured():
    ops = FakeOps(hook=False)
    with pytest.raises(tune_worker.RouteNotForced, match="_routing_prefill_splits_for_testing"):
        tune_worker.run_route(ops, EXACT, 2, FakeCall(ops.log))
    assert ops.log == []


# --- the estimate --------------------------------------------------------------------------------------


def test_estimate_charges_each_route_calls_times_reports_time(monkeypatch):
    """Each route at each point is charged report's estimate for that route (split-KV at its own
    split count), warm-up + timed + 1 numerics calls; a route report does not estimate is charged
    the exact route's time and the note says which."""
    import fa2patch.model.report as report
    from fa2patch.model.v100model import Card

    asked = []

    def fake(artifact, arch, launch, shapes, card, splits=(2, 3, 4), anchors=()):
        asked.append(tuple(splits))
        return {
            "predictions": [
                p
                for s in shapes
                for p in (
                    {"label": s.label, "route": EXACT, "plan": {"splits": 1}, "calibrated_ms": s.kv / 1000},
                    {"label": s.label, "route": GQA, "plan": {"splits": 1}, "calibrated_ms": s.kv / 2000},
                    *(
                        {
                            "label": s.label,
                            "route": SPLITKV,
                            "plan": {"splits": n},
                            "calibrated_ms": s.kv / (1000 + 100 * n),
                        }
                        for n in splits
                        if n != 3
                    ),
                )
            ]
        }

    monkeypatch.setattr(report, "report", fake)
    plan = tune.Plan(RankHeads(6, 1, 256), 2048, 4096, warmup=2, reps=7, splits=(2, 3), decode_batches=())
    assert plan.points == [(2048, 2048), (2048, 4096), (1024, 1024), (1024, 3072)]
    est = tune.estimate(plan, "x.so", Card(80, 1530))
    assert asked == [(2, 3)]
    # per point, each 2 + 7 + 1 = 10 calls: exact kv/1000 ms, split x2 kv/1200 ms, split x3 (no
    # estimate) the exact route's kv/1000 ms, long-prefill kv/2000 ms.
    expected = sum(10 * (kv / 1000 + kv / 1200 + kv / 1000 + kv / 2000) for _, kv in plan.points) / 1000
    assert est["seconds"] == pytest.approx(expected) and "ESTIMATE" in est["note"]
    assert est["per_route_seconds"][SPLITKV] == pytest.approx(
        sum(10 * (kv / 1200 + kv / 1000) for _, kv in plan.points) / 1000
    )
    assert est["per_route_seconds"][GQA] == pytest.approx(sum(10 * kv / 2000 for _, kv in plan.points) / 1000)
    assert "sm70-dense-splitkv charged at the exact route's time where report has no estimate" in est["note"]


def test_estimate_charges_decode_points_at_both_kernels(monkeypatch):
    import fa2patch.model.report as report
    from fa2patch.model.v100model import Card

    def fake(artifact, arch, launch, shapes, card, splits=(2, 3, 4), anchors=()):
        return {
            "predictions": [
                p
                for s in shapes
                for p in (
                    {"label": s.label, "route": EXACT, "plan": {"splits": 1}, "calibrated_ms": s.b * s.kv / 1000},
                    {"label": s.label, "route": DECODE, "plan": {"splits": 1}, "calibrated_ms": s.b * s.kv / 4000},
                )
            ]
        }

    monkeypatch.setattr(report, "report", fake)
    plan = tune.Plan(RankHeads(6, 1, 256), 1024, 1024, warmup=2, reps=7, splits=(), decode_batches=(1, 8))
    assert plan.points == [(1024, 1024)] and plan.decode_points == [(kv, b) for b in (1, 8) for kv in (256, 512, 1024)]
    est = tune.estimate(plan, "x.so", Card(80, 1530))
    # 10 calls per route and point: the prefill point's exact route, and at each decode point both kernels
    decode_work = sum(b * kv for kv, b in plan.decode_points)
    assert est["per_route_seconds"][DECODE] == pytest.approx(10 * decode_work / 4000 / 1000)
    assert est["per_route_seconds"][EXACT] == pytest.approx(10 * (1024 + decode_work) / 1000 / 1000)
    assert "7 points" in est["note"]


def test_no_estimate_without_an_sm70_build():
    est = tune.estimate(PLAN, None, None)
    assert not est["available"] and "sm_70 build" in est["note"]


# --- the command line ---------------------------------------------------------------------------------


def fa2patch(*args, cwd=REPO):
    return subprocess.run(
        [sys.executable, "-m", "fa2patch", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "FA2PATCH_ROOT": str(REPO)},
    )


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN35))
    return path


def test_tune_check_good_and_refused(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(GOOD))
    proc = fa2patch("tune", "--check", str(good))
    assert proc.returncode == 0 and "ok (format)" in proc.stdout and "sm70-dense-splitkv x3" in proc.stdout
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**GOOD, "decisions": [{**GOOD["decisions"][0], "route": "fast"}]}))
    proc = fa2patch("tune", "--check", str(bad), "--json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and doc["ok"] is False and doc["reason"] == "unknown_route"
    proc = fa2patch("tune", "--check", str(bad))  # the text form names the file and the reason
    assert proc.returncode == 1 and proc.stdout.startswith(f"{bad}: REFUSED (") and doc["error"] in proc.stdout
    so = tmp_path / "ext.so"
    so.write_bytes(b"extension")
    proc = fa2patch("tune", "--check", str(good), "--artifact", str(so), "--json")
    assert proc.returncode == 1 and json.loads(proc.stdout)["reason"] == "extension_mismatch"
    good.write_text(json.dumps({**GOOD, "extension_sha256": hashlib.sha256(b"extension").hexdigest()}))
    proc = fa2patch("tune", "--check", str(good), "--artifact", str(so), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["checked"] == ["format", "extension sha256"]


def test_tune_estimate_only_prints_the_plan(config):
    proc = fa2patch(
        "tune",
        "--model-config",
        str(config),
        "--tp",
        "4",
        "--max-num-batched-tokens",
        "4096",
        "--max-model-len",
        "131072",
        "--estimate-only",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["plan"]["heads"] == {"hq": 6, "hkv": 1, "d": 256}
    assert [tuple(p) for p in doc["plan"]["points"]] == grid_points(4096, 131072)
    assert [tuple(p) for p in doc["plan"]["decode_points"]] == decode_points(RankHeads(6, 1, 256), 131072, (1, 8, 64))
    assert "estimate" in doc


def test_tune_usage_errors(config, tmp_path):
    assert fa2patch("tune").returncode == 2
    assert fa2patch("tune", "--model-config", str(config), "--tp", "5", "--estimate-only").returncode == 2
    assert fa2patch("tune", "--model-config", str(config), "--splits", "1,2", "--estimate-only").returncode == 2
    assert fa2patch("tune", "--model-config", str(config), "--reps", "2", "--estimate-only").returncode == 2
    bad = fa2patch("tune", "--model-config", str(config), "--decode-batches", "0,8", "--estimate-only")
    assert bad.returncode == 2 and "--decode-batches" in bad.stderr and "'0,8'" in bad.stderr


def test_tune_without_gpu_exits_3(config):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: tests/gpu/test_tune_gpu.py covers tune there")
    proc = fa2patch("tune", "--model-config", str(config), "--max-model-len", "4096")
    assert proc.returncode == 3 and "no CUDA GPU" in proc.stderr


# --- one point measured through a fake extension on the CPU -----------------------------------------


class CpuTorch:
    """torch with the "cuda" device mapped to the CPU and fake CUDA events (the worker's logic
    runs unchanged; no timing means anything here)."""

    def __init__(self):
        import time as _time

        import torch as real

        self.real = real
        clock = iter(range(1, 10**6))

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self):
                self.t = next(clock) + _time.perf_counter() * 0

            def elapsed_time(self, other):
                return float(other.t - self.t)

        self.cuda = type(
            "cuda",
            (),
            {"Event": Event, "synchronize": staticmethod(lambda: None), "current_device": staticmethod(lambda: 0)},
        )

    def __getattr__(self, name):
        attr = getattr(self.real, name)
        if name in ("randn", "randperm", "tensor", "arange", "empty", "full_like", "Generator"):

            def cpu(*args, **kw):
                kw.pop("device", None)
                return attr(*args, **kw)

            return cpu
        return attr


class CpuOps:
    """varlen_fwd and gqa_prefill_fwd writing q's values (gqa: slightly off, or far off when
    ``gqa_error``), route_stats counting varlen calls as the route the environment and the split
    hook select."""

    def __init__(self, gqa_error=5e-4, count_as=None):
        self.splits, self.counts, self.gqa_error, self.count_as, self.calls = 0, {}, gqa_error, count_as, []

    def _routing_prefill_splits_for_testing(self, n):
        self.splits = n

    def varlen_fwd(self, q, k, v, out, *args):
        assert os.environ[tune_worker.ENV_EXACT] == "0"
        decode = os.environ[DECODE_ENV] == "1"
        name = self.count_as or (DECODE if decode else SPLITKV if self.splits > 1 else EXACT)
        self.calls.append((q.shape[0], tuple(args[4].shape) if decode else None))  # q rows, block table
        self.counts[name] = self.counts.get(name, 0) + 1
        out.copy_(q)

    def gqa_prefill_workspace_bytes(self, sq, sk, hq, hk):
        return 64

    def gqa_prefill_fwd(self, q, k, v, out, table, seqlen_k, scale, ws):
        assert ws.numel() == 64 and table.shape == (1, -(-seqlen_k // 16))
        out.copy_(q.float() * (1 + self.gqa_error))

    def route_stats(self):
        return json.dumps({"devices": {"0": {"routes": self.counts}}})


SPEC = {"heads": {"hq": 6, "hkv": 1, "d": 64}, "block_size": 16, "warmup": 2, "reps": 3}
ROUTES = [(EXACT, 1), (EXACT, 2), (GQA, 1)]


@pytest.fixture(autouse=True)
def restore_route_env(monkeypatch):
    """run_route sets the exact-route and decode-kernel switches in this process: restore them after each test."""
    monkeypatch.setenv(tune_worker.ENV_EXACT, "1")
    monkeypatch.setenv(DECODE_ENV, "0")


def test_measure_point_times_checks_and_compares():
    ops = CpuOps()
    event = tune_worker.measure_point(CpuTorch(), ops, SPEC, 40, 100, ROUTES, None, None)
    rows = {(r["route"], r["splits"]): r for r in event["rows"]}
    assert (event["q"], event["kv"], event["clocks"]) == (40, 100, None)
    assert all(len(r["times_ms"]) == 3 and r["ok"] for r in rows.values()), rows
    assert 0 < rows[(GQA, 1)]["numerics"]["rel_l2"] < 1e-3
    assert rows[(EXACT, 2)]["numerics"]["max_abs"] == 0
    # warm-up 2 + 3 rounds + 1 numerics call per varlen route
    assert ops.counts == {EXACT: 6, SPLITKV: 6} and ops.splits == 0


def test_a_decode_point_runs_batch_sequences_of_one_query_on_both_kernels(monkeypatch):
    monkeypatch.setenv(DECODE_ENV, "1")
    ops = CpuOps()
    event = tune_worker.measure_point(CpuTorch(), ops, SPEC, 1, 100, [(EXACT, 1), (DECODE, 1)], None, None, 8)
    assert (event["q"], event["kv"], event["batch"]) == (1, 100, 8)
    assert all(r["ok"] and len(r["times_ms"]) == 3 for r in event["rows"]), event["rows"]
    assert ops.counts == {EXACT: 6, DECODE: 6}
    # 8 query rows; 8 sequences' pages of 16 tokens: a block table of 8 rows x ceil(100 / 16)
    assert set(ops.calls) == {(8, None), (8, (8, 7))}
    assert "batch" not in tune_worker.measure_point(CpuTorch(), CpuOps(), SPEC, 40, 100, ROUTES, None, None)


def test_a_route_that_breaks_the_numerics_is_marked():
    ops = CpuOps(gqa_error=1e-2)
    rows = tune_worker.measure_point(CpuTorch(), ops, SPEC, 40, 100, ROUTES, None, None)["rows"]
    gqa = next(r for r in rows if r["route"] == GQA)
    assert gqa["ok"] is False and gqa["numerics"]["rel_l2"] > 1e-3


def test_a_route_that_was_not_forced_is_an_error_not_a_measurement():
    ops = CpuOps(count_as=GQA)  # the router took another route than the one forced
    rows = tune_worker.measure_point(CpuTorch(), ops, SPEC, 40, 100, ROUTES[:2], None, None)["rows"]
    assert all("RouteNotForced" in r["error"] and not r["times_ms"] for r in rows)


def test_the_loaded_library_is_found_in_the_process_maps():
    path = tune_worker.loaded_library("libc.so")  # any shared object this process mapped
    if path is None:
        pytest.skip("no /proc/self/maps here")
    assert os.path.isfile(path) and "libc.so" in os.path.basename(path)
    assert tune_worker.loaded_library("no-such-library-name") is None


def test_tune_command_end_to_end_with_a_fake_gpu(monkeypatch, tmp_path, config):
    """The command's wiring (plan, estimate, progress, profile file, text) with the GPU probe and
    the worker replaced: an H200 whose measurements are _points()."""
    from click.testing import CliRunner

    import fa2patch.compile.extension as extension
    from fa2patch.cli.main import cli

    monkeypatch.setattr(
        extension,
        "probe_gpu",
        lambda: {"cuda": True, "name": "NVIDIA H200", "capability": "sm_90", "major": 9, "minor": 0, "sms": 132},
    )
    seen = {}

    def fake_run(artifact, plan, progress=None):
        seen.update(artifact=artifact, plan=plan)
        points = _points()
        for p in points:
            progress and progress(p)
        return {"start": _start((9, 0)), "points": points, "stderr": ""}

    monkeypatch.setattr(tune, "run", fake_run)
    monkeypatch.setenv("FA2PATCH_ROOT", str(REPO))
    so = tmp_path / "ext.so"
    so.write_bytes(b"x")
    out = tmp_path / "p.json"
    result = CliRunner().invoke(
        cli,
        [
            "tune",
            "--model-config",
            str(config),
            "--tp",
            "4",
            "--max-num-batched-tokens",
            "4096",
            "--max-model-len",
            "8192",
            "--artifact",
            str(so),
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert seen["artifact"] == so and seen["plan"].heads == RankHeads(6, 1, 256)
    doc = profile.check_file(out)
    assert doc["device"]["name"] == "Tesla V100-SXM2-32GB"  # the (fake) worker's device
    assert f"export FA2PATCH_ROUTING_PROFILE={out}" in result.output
    assert "not a V100" in result.output and "not V100 timings" in result.output
    assert "Q=4096: KV 4096, 8192" in result.output  # the plan, printed before measuring
