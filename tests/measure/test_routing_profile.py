# SPDX-License-Identifier: BSD-3-Clause
"""Routing profiles: the one reader (packaging/fa2patch_vllm/routing_profile.py, the standard
library's strict json and hashlib) against the format, with expected reasons written down here; and
its hand-over to the built extension without a GPU (set_routing_profile, refuse_routing_profile,
extension_path, route_stats()'s "profile"). The device check at a device's first SM70 call is
tests/gpu/test_routing_gpu.py's."""

import hashlib
import json
import math
import os
import random
import subprocess
import sys

import pytest

from fa2patch.measure import profile as pf
from helpers import REPO

reader = pf.reader()
FORMAT = "fa2patch-routing-profile/1"
DEVICE = {"name": "Tesla V100-SXM2-32GB", "sms": 80, "capability": [7, 0]}
SHA = "5e" * 32
DECISIONS = [
    {"group": 6, "head_dim": 256, "q": [1, 2], "kv": [0, 45000], "batch": [3, 23], "route": "sm70-decode"},
    {"group": 6, "head_dim": 256, "q": [1024, 2048], "kv": [16384, 1048576], "route": "sm70-gqa-prefill"},
    {"group": 6, "head_dim": 256, "q": [2048, 8192], "kv": [32768, 1048576], "route": "sm70-dense", "splits": 3},
    {"group": 6, "head_dim": 256, "q": [2048, 8192], "kv": [0, 32768], "route": "sm70-dense"},
]
REASONS = {
    "unreadable",
    "invalid_json",
    "wrong_format",
    "unknown_key",
    "bad_field",
    "unknown_route",
    "device_mismatch",
    "extension_mismatch",
}


def document(sha: str = SHA, **changes) -> dict:
    doc = {
        "format": FORMAT,
        "device": dict(DEVICE),
        "extension_sha256": sha,
        "software": {"torch": "2.9.1+cu128", "cuda": "12.8", "driver": "570.86.15", "fa2patch": "0.1.0"},
        "clocks_seen": {"sm_mhz": [1312, 1530]},
        "measured": [{"route": "sm70-dense", "ms": 1.5}],
        "decisions": [dict(d) for d in DECISIONS],
    }
    doc.update(changes)
    return doc


def edited(edit) -> str:
    doc = document()
    edit(doc)
    return json.dumps(doc)


def d0(f):
    return lambda doc: f(doc["decisions"][1])  # the long-prefill decision


def d_decode(f):
    return lambda doc: f(doc["decisions"][0])


def test_the_reader_and_fa2patch_name_the_same_routes():
    from fa2patch.common.routes import DECODE, EXACT, GQA

    assert reader.ROUTES == (EXACT, DECODE, GQA) and reader.FORMAT == FORMAT


def test_decisions_are_handed_over_as_nine_integers_each():
    """set_routing_profile's order (profile.h): group, head_dim, q, kv, batch (absent: 1 to 2^62), splits."""
    ints, routes = reader.flat_decisions(document())
    assert routes == ["sm70-decode", "sm70-gqa-prefill", "sm70-dense", "sm70-dense"]
    assert ints == [
        *[6, 256, 1, 2, 0, 45000, 3, 23, 1],
        *[6, 256, 1024, 2048, 16384, 1048576, 1, 1 << 62, 1],
        *[6, 256, 2048, 8192, 32768, 1048576, 1, 1 << 62, 3],
        *[6, 256, 2048, 8192, 0, 32768, 1, 1 << 62, 1],
    ]


@pytest.mark.parametrize(
    "text",
    [
        json.dumps(document()),
        json.dumps(document(), indent=2),
        json.dumps(document(decisions=[])),
        json.dumps({k: v for k, v in document().items() if k not in ("software", "clocks_seen", "measured")}),
    ],
    ids=["full", "pretty", "no-decisions", "minimal"],
)
def test_a_good_profile_is_read_as_written(tmp_path, text):
    path = tmp_path / "p.json"
    path.write_text(text)
    assert reader.check_file(path, DEVICE, SHA) == json.loads(text)


# name -> (file content, reason, substrings of the message: the expected and the actual value where
# there are two). Written from the format (README "Tuning routing for your card"), not from output.
REFUSED = {
    "cut-off": (json.dumps(document())[:-1], "invalid_json", ["not valid JSON", "line 1"]),
    "trailing-comma": (json.dumps(document())[:-1] + ",}", "invalid_json", ["not valid JSON"]),
    "nan": (edited(d0(lambda d: d.update(group=float("nan")))), "invalid_json", ["NaN is not JSON"]),
    "infinity": (edited(d0(lambda d: d.update(group=float("inf")))), "invalid_json", ["Infinity is not JSON"]),
    "duplicate-key": (json.dumps(document())[:-1] + ', "format": "x"}', "invalid_json", ["duplicate key(s) 'format'"]),
    "not-utf8": (json.dumps(document()).encode().replace(b"Tesla", b"T\xffsla"), "invalid_json", ["'utf-8' codec"]),
    "bom": (b"\xef\xbb\xbf" + json.dumps(document()).encode(), "invalid_json", ["not valid JSON"]),
    "empty": ("", "invalid_json", ["not valid JSON"]),
    "deep": ("[" * 100_000 + "]" * 100_000, "invalid_json", ["not valid JSON"]),
    "not-an-object": (json.dumps([document()]), "bad_field", ["expected a JSON object, actual list"]),
    "wrong-format": (
        json.dumps(document(format="fa2patch-routing-profile/2")),
        "wrong_format",
        ["expected 'fa2patch-routing-profile/1', actual 'fa2patch-routing-profile/2'"],
    ),
    "missing-format": (edited(lambda doc: doc.pop("format")), "wrong_format", ["actual None"]),
    "unknown-key": (json.dumps(document(decision=[])), "unknown_key", ["unknown key(s) decision"]),
    "unknown-device-key": (
        edited(lambda doc: doc["device"].update(memory_gb=32)),
        "unknown_key",
        ["device: unknown key(s) memory_gb"],
    ),
    "unknown-decision-key": (
        edited(d0(lambda d: d.update(split=3))),
        "unknown_key",
        ["decisions[1]: unknown key(s) split"],
    ),
    "q-reversed": (edited(d0(lambda d: d.update(q=[2048, 1024]))), "bad_field", ["decisions[1].q", "[2048, 1024]"]),
    "q-empty": (edited(d0(lambda d: d.update(q=[5, 5]))), "bad_field", ["decisions[1].q", "[5, 5]"]),
    "q-float": (edited(d0(lambda d: d.update(q=[1024.0, 2048]))), "bad_field", ["decisions[1].q", "[1024.0, 2048]"]),
    "kv-negative": (edited(d0(lambda d: d.update(kv=[-1, 5]))), "bad_field", ["decisions[1].kv", "[-1, 5]"]),
    "kv-three": (edited(d0(lambda d: d.update(kv=[0, 5, 9]))), "bad_field", ["decisions[1].kv", "[0, 5, 9]"]),
    "kv-beyond-2^62": (edited(d0(lambda d: d.update(kv=[0, 1 << 63]))), "bad_field", ["2^62"]),
    "group-zero": (edited(d0(lambda d: d.update(group=0))), "bad_field", ["decisions[1].group", "actual 0"]),
    "group-bool": (edited(d0(lambda d: d.update(group=True))), "bad_field", ["decisions[1].group", "actual True"]),
    "head-dim-300": (
        edited(d0(lambda d: d.update(head_dim=300))),
        "bad_field",
        ["decisions[1].head_dim: expected an integer 1..256, actual 300"],
    ),
    "head-dim-string": (edited(d0(lambda d: d.update(head_dim="256"))), "bad_field", ["actual '256'"]),
    "splits-17": (
        edited(lambda doc: doc["decisions"][2].update(splits=17)),
        "bad_field",
        ["decisions[2].splits: expected an integer 1..16, actual 17"],
    ),
    "splits-0": (edited(lambda doc: doc["decisions"][2].update(splits=0)), "bad_field", ["actual 0"]),
    "splits-with-long-prefill": (
        edited(d0(lambda d: d.update(splits=2))),
        "bad_field",
        ["decisions[1].splits: allowed only with route 'sm70-dense'"],
    ),
    "splits-with-decode": (
        edited(d_decode(lambda d: d.update(splits=2))),
        "bad_field",
        ["decisions[0].splits: allowed only with route 'sm70-dense'", "not 'sm70-decode'"],
    ),
    "batch-from-0": (
        edited(d_decode(lambda d: d.update(batch=[0, 23]))),
        "bad_field",
        ["decisions[0].batch: expected [lo, hi] integers with 1 <= lo < hi", "actual [0, 23]"],
    ),
    "batch-reversed": (edited(d_decode(lambda d: d.update(batch=[23, 3]))), "bad_field", ["batch", "[23, 3]"]),
    "batch-number": (edited(d_decode(lambda d: d.update(batch=8))), "bad_field", ["decisions[0].batch", "actual 8"]),
    "unknown-route": (
        edited(d0(lambda d: d.update(route="sm70-fast"))),
        "unknown_route",
        ["'sm70-fast' is not one of sm70-dense, sm70-decode, sm70-gqa-prefill"],
    ),
    "decisions-not-array": (json.dumps(document(decisions={})), "bad_field", ["decisions: expected an array"]),
    "missing-decisions": (edited(lambda doc: doc.pop("decisions")), "bad_field", ["missing decisions"]),
    "software-not-object": (json.dumps(document(software="2.9.1")), "bad_field", ["software: expected a JSON object"]),
    "measured-not-array": (json.dumps(document(measured={})), "bad_field", ["measured: expected a JSON array"]),
    "sha-uppercase": (json.dumps(document(SHA.upper())), "bad_field", ["64 lowercase hex digits"]),
    "sha-short": (json.dumps(document(SHA[:-1])), "bad_field", ["64 lowercase hex digits"]),
    "device-no-name": (edited(lambda doc: doc["device"].update(name="")), "bad_field", ["device.name"]),
    "capability-three": (
        edited(lambda doc: doc["device"].update(capability=[7, 0, 0])),
        "bad_field",
        ["device.capability"],
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_bad_profile_is_refused_whole_with_its_reason(tmp_path, name):
    content, reason, words = REFUSED[name]
    path = tmp_path / f"{name}.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(reader.ProfileRefused) as refused:
        reader.check_file(path, DEVICE, SHA)
    assert refused.value.reason == reason and str(refused.value).startswith(f"{reason}: {path}")
    for word in words:
        assert word in str(refused.value), (word, str(refused.value))


def test_python_json_alone_would_take_what_the_reader_refuses():
    """The strictness is the reader's own: plain json.loads accepts NaN and duplicate keys."""
    assert json.loads(REFUSED["duplicate-key"][0])["format"] == "x"
    assert math.isnan(json.loads(REFUSED["nan"][0])["decisions"][1]["group"])


@pytest.mark.parametrize(
    "device,sha,reason,words",
    [
        ({**DEVICE, "name": "NVIDIA H200"}, SHA, "device_mismatch", ["expected 'NVIDIA H200'", "'Tesla V100-SXM2"]),
        ({**DEVICE, "sms": 72}, SHA, "device_mismatch", ["device sms: expected 72", "actual 80"]),
        ({**DEVICE, "capability": [9, 0]}, SHA, "device_mismatch", ["expected [9, 0]", "actual [7, 0]"]),
        (DEVICE, "ab" * 32, "extension_mismatch", ["expected " + "ab" * 32, "actual " + SHA]),
    ],
    ids=["name", "sms", "capability", "sha256"],
)
def test_a_profile_of_another_device_or_extension_is_refused(tmp_path, device, sha, reason, words):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(document()))
    with pytest.raises(reader.ProfileRefused) as refused:
        reader.check_file(path, device, sha)
    assert refused.value.reason == reason and all(w in str(refused.value) for w in words), str(refused.value)


@pytest.mark.parametrize("what", ["missing", "directory"])
def test_an_unreadable_path_is_refused(tmp_path, what):
    path = tmp_path / "missing.json" if what == "missing" else tmp_path
    with pytest.raises(reader.ProfileRefused) as refused:
        reader.check_file(path)
    assert refused.value.reason == "unreadable" and str(path) in str(refused.value)


def mutate(rng: random.Random, text: bytes) -> bytes:
    """One random edit of a good profile's bytes: delete, insert or replace a short run."""
    i = rng.randrange(len(text) + 1)
    n = rng.randrange(1, 9)
    junk = bytes(rng.choice(b'{}[]",:0123456789-.eE truefalsnul\\\xff\x00') for _ in range(rng.randrange(0, 9)))
    return [text[:i] + text[i + n :], text[:i] + junk + text[i:], text[:i] + junk + text[i + n :]][rng.randrange(3)]


def test_ten_thousand_generated_files_are_read_or_refused_with_a_reason(tmp_path):
    """Random edits of a good profile: each is read, and then the reader's own validation of what
    json parsed holds, or refused with one of the documented reasons; no other exception."""
    rng = random.Random(28)
    good = json.dumps(document(), indent=1).encode()
    outcomes = {"read": 0}
    path = tmp_path / "p.json"
    for _ in range(10_000):
        path.write_bytes(mutate(rng, good))
        try:
            doc = reader.check_file(path, DEVICE, SHA)
        except reader.ProfileRefused as exc:
            outcomes[exc.reason] = outcomes.get(exc.reason, 0) + 1
        else:
            assert doc["format"] == FORMAT and isinstance(doc["decisions"], list)
            outcomes["read"] += 1
    assert set(outcomes) <= {"read"} | REASONS and sum(outcomes.values()) == 10_000, outcomes
    assert len([r for r in REASONS if outcomes.get(r)]) >= 5, outcomes  # the edits reach most rules
    assert outcomes["invalid_json"] > 1000 and outcomes["read"] > 0, outcomes


# --- The hand-over to the built extension (no GPU) --------------------------------------------------

RUN = r"""
import json, sys, torch
torch.ops.load_library(sys.argv[1])
sys.path.insert(0, sys.argv[2])
from fa2patch_vllm import routing_profile
ops = torch.ops._vllm_fa2_C
out = {"path": ops.extension_path(), "before": json.loads(ops.route_stats())["profile"]}
for key, path in json.loads(sys.stdin.read()):
    out[key] = {"install": routing_profile.install(path or None), "stats": json.loads(ops.route_stats())["profile"]}
for key, args in [("short", [[6, 256, 0, 2, 0, 2, 1], ["sm70-dense"]]),
                  ("route", [[6, 256, 0, 2, 0, 2, 1, 2, 1], ["sm70-fast"]]),
                  ("splits", [[6, 256, 0, 2, 0, 2, 1, 2, 2], ["sm70-decode"]]),
                  ("batch", [[6, 256, 0, 2, 0, 2, 0, 2, 1], ["sm70-decode"]])]:
    try:
        ops.set_routing_profile("x.json", "V100", 80, 7, 0, *args)
        out[key] = "accepted"
    except Exception as exc:
        out[key] = type(exc).__name__ + ": " + str(exc).splitlines()[0]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def handed_over(built_sm70, tmp_path_factory):
    folder = tmp_path_factory.mktemp("profiles")
    artifact = built_sm70 / "_vllm_fa2_C.abi3.so"
    sha = hashlib.sha256(artifact.read_bytes()).hexdigest()
    (folder / "good.json").write_text(json.dumps(document(sha)))
    (folder / "other-sha.json").write_text(json.dumps(document("0" * 64)))
    (folder / "bad.json").write_text(REFUSED["unknown-route"][0])
    requests = [["env", ""], ["good", str(folder / "good.json")], ["other-sha", str(folder / "other-sha.json")]]
    requests += [["bad", str(folder / "bad.json")], ["good-again", str(folder / "good.json")]]
    env = {**os.environ, "FA2PATCH_ROUTING_PROFILE": str(folder / "good.json")}
    proc = subprocess.run(
        [sys.executable, "-c", RUN, str(artifact), str(REPO / "packaging")],
        input=json.dumps(requests),
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), folder, artifact


def test_the_extension_names_its_own_file(handed_over):
    out, _, artifact = handed_over
    assert os.path.samefile(out["path"], artifact)


def test_a_checked_profile_is_installed_and_waits_for_a_device(handed_over):
    out, folder, _ = handed_over
    path = str(folder / "good.json")
    # Set in the environment, not yet installed: named, not read (a device binds it at its first call).
    assert out["before"] == {"path": path, "status": "not read yet"}
    for key in ("env", "good", "good-again"):  # install() without a path reads the variable
        assert out[key]["install"] == {"path": path, "status": "installed", "decisions": len(DECISIONS)}, out[key]
        assert out[key]["stats"] == {"path": path, "status": "not read yet"}, out[key]


@pytest.mark.parametrize("key,reason", [("other-sha", "extension_mismatch"), ("bad", "unknown_route")])
def test_a_refused_profile_is_handed_over_with_its_reason(handed_over, key, reason):
    out, folder, _ = handed_over
    path = str(folder / f"{key}.json")
    assert out[key]["install"]["status"] == "refused" and out[key]["install"]["reason"].startswith(reason + ": ")
    assert out[key]["stats"] == {"path": path, "status": "refused", "reason": out[key]["install"]["reason"]}


def test_set_routing_profile_refuses_arguments_that_make_no_profile(handed_over):
    out, _, _ = handed_over
    assert out["short"].startswith("ValueError: set_routing_profile: 9 integers per decision"), out["short"]
    assert out["route"].startswith('ValueError: set_routing_profile: decision 0: route "sm70-fast"'), out["route"]
    assert "above 1 only with sm70-dense" in out["splits"], out["splits"]
    assert "1 <= batch lo < batch hi" in out["batch"], out["batch"]


def test_route_stats_without_a_profile_is_null(built_sm70):
    artifact = built_sm70 / "_vllm_fa2_C.abi3.so"
    env = {k: v for k, v in os.environ.items() if k != "FA2PATCH_ROUTING_PROFILE"}
    code = "import json,sys,torch; torch.ops.load_library(sys.argv[1]); print(torch.ops._vllm_fa2_C.route_stats())"
    proc = subprocess.run([sys.executable, "-c", code, str(artifact)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    # The built-in split rule's constants as README "Routing" documents them; the test hook off.
    rule = {"candidates": [2, 3, 4], "min_gain": 1.26, "cta_fixed_blocks": 32}
    assert stats["profile"] is None and stats["split_kv"] == {"builtin_rule": rule, "testing_splits": 0}, stats
