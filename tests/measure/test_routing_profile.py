# SPDX-License-Identifier: BSD-3-Clause
"""Routing profiles in the built extension, without a GPU (patch 0004; issue 17 item 5): the strict
JSON reader against Python's json module, SHA-256 against hashlib on real files (the extension
file included, found by the extension itself), and the profile check against the format (the
routing-profile spec) with device facts given by the test.

All requests go to the extension's CPU-only test ops in one subprocess (importing torch is the
slow part): _json_parse_for_testing, _sha256_file_for_testing, _profile_check_for_testing."""

import hashlib
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

FORMAT = "fa2patch-routing-profile/1"
DEVICE = {"name": "Tesla V100-SXM2-32GB", "sms": 80, "capability": [7, 0]}
DECISIONS = [
    {"group": 6, "head_dim": 256, "q": [1024, 2048], "kv": [16384, 1048576], "route": "sm70-gqa-prefill"},
    {"group": 6, "head_dim": 256, "q": [2048, 8192], "kv": [32768, 1048576], "route": "sm70-dense", "splits": 3},
    {"group": 6, "head_dim": 256, "q": [2048, 8192], "kv": [0, 32768], "route": "sm70-dense"},
]

RUN = r"""
import json, sys, torch
torch.ops.load_library(sys.argv[1])
ops = torch.ops._vllm_fa2_C
out = {}
for key, (op, args) in json.loads(sys.stdin.read()).items():
    try:
        out[key] = {"ok": getattr(ops, op)(*args)}
    except Exception as exc:
        out[key] = {"raised": type(exc).__name__, "message": str(exc).splitlines()[0]}
print(json.dumps(out))
"""


def run_ops(artifact: Path, requests: dict, env=None) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", RUN, str(artifact)], input=json.dumps(requests), capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- JSON ------------------------------------------------------------------------------------

VALID_JSON = [
    '{"a": [1, -0, 2.5e3, 1E+2, 1e-2, -12.75, true, false, null], "b": {}, "c": []}',
    '  [ "x\\u00e9\\ud83d\\ude00\\n\\t\\"\\\\\\/", "é漢", "" ]  \n',
    "0",
    '"just a string"',
    "null",
    '{"nested": {"deeper": [[[{"k": [1]}]]]}}',
    "[" * 64 + "]" * 64,  # the deepest nesting the reader takes
    json.dumps({"profile": DECISIONS}),
]
INVALID_JSON = {  # text: what Python's json would say (None: it accepts it)
    "[1,]": "rejects",
    '{"a": 1,}': "rejects",
    "// c\n{}": "rejects",
    "{'a': 1}": "rejects",
    "01": "rejects",
    "1.": "rejects",
    ".5": "rejects",
    "-": "rejects",
    '"\\x"': "rejects",
    '"tab\there"': "rejects",
    "[1] 2": "rejects",
    "": "rejects",
    '{"a" 1}': "rejects",
    "tru": "rejects",
    "[" * 65 + "]" * 65: None,  # deeper than the reader's limit
    "NaN": None,
    "[Infinity]": None,
    '{"a": 1, "a": 2}': None,  # Python accepts these; the reader does not
    '"\\ud800"': None,
    '"\\udc00x"': None,  # lone surrogates
}


@pytest.fixture(scope="module")
def results(built_sm70, tmp_path_factory) -> dict:
    """Every request's answer, from one subprocess."""
    folder = tmp_path_factory.mktemp("profiles")
    artifact = built_sm70 / "_vllm_fa2_C.abi3.so"
    requests = {}
    for i, text in enumerate(VALID_JSON):
        requests[f"json-valid-{i}"] = ("_json_parse_for_testing", [text])
    for i, text in enumerate(INVALID_JSON):
        requests[f"json-invalid-{i}"] = ("_json_parse_for_testing", [text])
    rng = random.Random(17)
    for n in SHA_SIZES:
        path = folder / f"bytes-{n}"
        path.write_bytes(rng.randbytes(n))
        requests[f"sha-{n}"] = ("_sha256_file_for_testing", [str(path)])
    requests["sha-extension"] = ("_sha256_file_for_testing", [""])
    requests["sha-missing"] = ("_sha256_file_for_testing", [str(folder / "missing")])
    sha = hashlib.sha256(artifact.read_bytes()).hexdigest()
    for name, (content, facts) in profile_cases(sha).items():
        path = folder / f"{name}.json"
        if name == "directory":
            path = folder
        elif content is not None:
            path.write_bytes(content if isinstance(content, bytes) else content.encode())
        requests[f"profile-{name}"] = ("_profile_check_for_testing", [str(path), *facts])
    return {"answers": run_ops(artifact, requests), "folder": folder, "sha": sha, "artifact": artifact}


@pytest.mark.parametrize("i", range(len(VALID_JSON)))
def test_json_reader_reads_what_python_reads(results, i):
    answer = results["answers"][f"json-valid-{i}"]
    assert "ok" in answer, answer
    assert json.loads(answer["ok"]) == json.loads(VALID_JSON[i])  # the same values, independently parsed


def test_json_reader_keeps_number_literals_and_writes_compactly(results):
    assert (
        results["answers"]["json-valid-0"]["ok"] == '{"a":[1,-0,2.5e3,1E+2,1e-2,-12.75,true,false,null],"b":{},"c":[]}'
    )


@pytest.mark.parametrize("i", range(len(INVALID_JSON)))
def test_json_reader_refuses_what_strict_json_refuses(results, i):
    text, python = list(INVALID_JSON.items())[i]
    answer = results["answers"][f"json-invalid-{i}"]
    assert answer.get("raised") == "ValueError" and "invalid JSON: line " in answer["message"], answer
    if python == "rejects":  # the reader is at least as strict as Python's json
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)


def test_json_reader_names_line_and_column(results):
    i = list(INVALID_JSON).index("[1,]")
    assert "line 1, column 4 (byte 3)" in results["answers"][f"json-invalid-{i}"]["message"]


# --- SHA-256 -----------------------------------------------------------------------------------

SHA_SIZES = [0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 128, 1000, (1 << 20) + 3]


@pytest.mark.parametrize("n", SHA_SIZES)
def test_sha256_of_a_file_is_hashlibs(results, n):
    data = (results["folder"] / f"bytes-{n}").read_bytes()
    assert results["answers"][f"sha-{n}"] == {"ok": hashlib.sha256(data).hexdigest()}


def test_sha256_of_the_extension_is_found_by_the_extension_itself(results):
    assert results["answers"]["sha-extension"] == {"ok": results["sha"]}


def test_sha256_of_a_missing_file_raises(results):
    answer = results["answers"]["sha-missing"]
    assert answer.get("raised") == "RuntimeError" and "No such file" in answer["message"], answer


# --- The profile check ---------------------------------------------------------------------------

V100 = [DEVICE["name"], DEVICE["sms"], 7, 0]


def document(sha: str, **changes) -> dict:
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


def edited(sha: str, edit) -> str:
    doc = document(sha)
    edit(doc)
    return json.dumps(doc)


def profile_cases(sha: str) -> dict:
    """name -> (file content or None for no file, [device_name, sms, major, minor, extension_sha256])."""
    own = [*V100, ""]  # "": the loaded extension's own sha256
    d0 = lambda f: lambda doc: f(doc["decisions"][0])  # noqa: E731
    minimal = {k: v for k, v in document(sha).items() if k not in ("software", "clocks_seen", "measured")}
    return {
        "valid": (json.dumps(document(sha)), own),
        "valid-minimal": (json.dumps(minimal), own),
        "valid-no-decisions": (json.dumps(document(sha, decisions=[])), own),
        "valid-pretty": (json.dumps(document(sha), indent=2), own),
        "bad-json": (json.dumps(document(sha))[:-1], own),
        "bad-json-trailing-comma": (json.dumps(document(sha))[:-1] + ",}", own),
        "bad-json-nan": (edited(sha, d0(lambda d: d.update(group=float("nan")))), own),
        "bad-json-duplicate-key": (json.dumps(document(sha))[:-1] + ', "format": "x"}', own),
        "bad-json-utf8": (json.dumps(document(sha)).encode().replace(b"Tesla", b"T\xffsla"), own),
        "bad-json-bom": (b"\xef\xbb\xbf" + json.dumps(document(sha)).encode(), own),
        "not-an-object": (json.dumps([document(sha)]), own),
        "empty-file": ("", own),
        "wrong-format": (json.dumps(document(sha, format="fa2patch-routing-profile/2")), own),
        "missing-format": (edited(sha, lambda doc: doc.pop("format")), own),
        "unknown-key": (json.dumps(document(sha, decision=[])), own),
        "unknown-device-key": (edited(sha, lambda doc: doc["device"].update(memory_gb=32)), own),
        "unknown-decision-key": (edited(sha, d0(lambda d: d.update(split=3))), own),
        "q-reversed": (edited(sha, d0(lambda d: d.update(q=[2048, 1024]))), own),
        "q-empty": (edited(sha, d0(lambda d: d.update(q=[5, 5]))), own),
        "q-float": (edited(sha, d0(lambda d: d.update(q=[1024.0, 2048]))), own),
        "kv-negative": (edited(sha, d0(lambda d: d.update(kv=[-1, 5]))), own),
        "kv-three": (edited(sha, d0(lambda d: d.update(kv=[0, 5, 9]))), own),
        "group-zero": (edited(sha, d0(lambda d: d.update(group=0))), own),
        "head-dim-300": (edited(sha, d0(lambda d: d.update(head_dim=300))), own),
        "head-dim-string": (edited(sha, d0(lambda d: d.update(head_dim="256"))), own),
        "splits-17": (edited(sha, lambda doc: doc["decisions"][1].update(splits=17)), own),
        "splits-0": (edited(sha, lambda doc: doc["decisions"][1].update(splits=0)), own),
        "splits-with-long-prefill": (edited(sha, d0(lambda d: d.update(splits=2))), own),
        "unknown-route": (edited(sha, d0(lambda d: d.update(route="sm70-fast"))), own),
        "decisions-not-array": (json.dumps(document(sha, decisions={})), own),
        "missing-decisions": (edited(sha, lambda doc: doc.pop("decisions")), own),
        "software-not-object": (json.dumps(document(sha, software="2.9.1")), own),
        "measured-not-array": (json.dumps(document(sha, measured={})), own),
        "sha-uppercase": (json.dumps(document(sha.upper())), own),
        "sha-short": (json.dumps(document(sha[:-1])), own),
        "other-device-name": (json.dumps(document(sha)), ["NVIDIA H200", 132, 7, 0, ""]),
        "other-sm-count": (json.dumps(document(sha)), [DEVICE["name"], 72, 7, 0, ""]),
        "other-capability": (json.dumps(document(sha)), [DEVICE["name"], 80, 9, 0, ""]),
        "other-sha256": (json.dumps(document(sha)), [*V100, "ab" * 32]),
        "missing-file": (None, own),
        "directory": (None, own),
    }


def check(results, name) -> dict:
    answer = results["answers"][f"profile-{name}"]
    assert "ok" in answer, answer
    return json.loads(answer["ok"])


@pytest.mark.parametrize("name", ["valid", "valid-minimal", "valid-pretty"])
def test_a_profile_for_this_device_and_extension_is_in_use(results, name):
    r = check(results, name)
    assert r["status"] == "in use" and r["device"] == DEVICE["name"] and r["decisions"] == 3, r
    # Every decision as written, splits 1 where the file gives none.
    assert r["parsed"] == [{**d, "splits": d.get("splits", 1)} for d in DECISIONS], r
    assert r["path"].endswith(f"{name}.json")


def test_a_profile_without_decisions_is_in_use(results):
    r = check(results, "valid-no-decisions")
    assert r["status"] == "in use" and r["decisions"] == 0 and r["parsed"] == [], r


# name -> substrings of the reason (expected and actual values where there are two).
REFUSED = {
    "bad-json": ["invalid JSON: line 1", "expected ',' or '}' in an object"],
    "bad-json-trailing-comma": ["invalid JSON", "expected a string key"],
    "bad-json-nan": ["invalid JSON", "expected a JSON value"],
    "bad-json-duplicate-key": ["invalid JSON", 'duplicate key "format"'],
    "bad-json-utf8": ["invalid JSON", "invalid UTF-8"],
    "bad-json-bom": ["invalid JSON", "line 1, column 1 (byte 0)"],
    "not-an-object": ["the profile must be a JSON object, got an array"],
    "empty-file": ["invalid JSON", "unexpected end of input"],
    "wrong-format": ['"format" is "fa2patch-routing-profile/2", expected "fa2patch-routing-profile/1"'],
    "missing-format": ['missing key "format"'],
    "unknown-key": ['unknown key "decision" in the profile'],
    "unknown-device-key": ['unknown key "memory_gb" in device'],
    "unknown-decision-key": ['unknown key "split" in decisions[0]'],
    "q-reversed": ["decisions[0].q must be [lo, hi] with integers 0 <= lo < hi, got [2048,1024]"],
    "q-empty": ["decisions[0].q", "got [5,5]"],
    "q-float": ["decisions[0].q", "got [1024.0,2048]"],
    "kv-negative": ["decisions[0].kv", "got [-1,5]"],
    "kv-three": ["decisions[0].kv", "got [0,5,9]"],
    "group-zero": ["decisions[0].group must be an integer in [1, ", "got 0"],
    "head-dim-300": ["decisions[0].head_dim must be an integer in [1, 256], got 300"],
    "head-dim-string": ["decisions[0].head_dim", 'got "256"'],
    "splits-17": ["decisions[1].splits must be an integer in [1, 16], got 17"],
    "splits-0": ["decisions[1].splits", "got 0"],
    "splits-with-long-prefill": ['decisions[0].splits is allowed only with the route "sm70-dense"'],
    "unknown-route": ['decisions[0].route "sm70-fast" is not a route of this extension'],
    "decisions-not-array": ["decisions must be an array, got an object"],
    "missing-decisions": ['missing key "decisions"'],
    "software-not-object": ["software must be an object, got a string"],
    "measured-not-array": ["measured must be an array, got an object"],
    "sha-uppercase": ["extension_sha256 must be 64 lowercase hex digits"],
    "sha-short": ["extension_sha256 must be 64 lowercase hex digits"],
    "other-device-name": ['device.name is "Tesla V100-SXM2-32GB" in the profile, this device is "NVIDIA H200"'],
    "other-sm-count": ["device.sms is 80 in the profile, this device has 72"],
    "other-capability": ["device.capability is [7, 0] in the profile, this device has [9, 0]"],
    "other-sha256": ["extension_sha256 is {sha} in the profile, the loaded extension's file has " + "ab" * 32],
    "missing-file": ["cannot read the file: No such file or directory"],
    "directory": ["cannot read the file: Is a directory"],
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_bad_or_foreign_profile_is_refused_whole_with_its_reason(results, name):
    r = check(results, name)
    assert r["status"] == "refused" and r["parsed"] == [], r  # never a partial use
    for words in REFUSED[name]:
        assert words.replace("{sha}", results["sha"]) in r["reason"], (words, r)


def test_every_refusal_case_is_checked():
    assert set(REFUSED) == {n for n in profile_cases("0" * 64) if not n.startswith("valid")}


def test_route_stats_names_the_profile_setting_without_a_gpu(built_sm70, tmp_path):
    """route_stats() on a GPU-less machine: no profile set is null; a set one is not read before the
    first SM70 call (the device's facts decide it)."""
    artifact = built_sm70 / "_vllm_fa2_C.abi3.so"
    import os

    env = {k: v for k, v in os.environ.items() if k != "FA2PATCH_ROUTING_PROFILE"}
    unset = json.loads(run_ops(artifact, {"s": ("route_stats", [])}, env)["s"]["ok"])
    # The built-in split rule's constants as README "Routing" documents them; the test hook off.
    rule = {"candidates": [2, 3, 4], "min_gain": 1.25, "cta_fixed_blocks": 32}
    assert unset["profile"] is None and unset["split_kv"] == {"builtin_rule": rule, "testing_splits": 0}, unset
    path = str(tmp_path / "p.json")
    set_ = json.loads(
        run_ops(artifact, {"s": ("route_stats", [])}, {**env, "FA2PATCH_ROUTING_PROFILE": path})["s"]["ok"]
    )
    assert set_["profile"] == {"path": path, "status": "not read yet"}, set_
