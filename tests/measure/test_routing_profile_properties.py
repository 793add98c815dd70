# SPDX-License-Identifier: BSD-3-Clause
"""Routing profiles (the one reader, packaging/fa2patch_vllm/routing_profile.py), property-based,
beyond test_routing_profile.py's written cases and random byte edits: every profile generated from
the format is read as written and handed over as nine integers a decision; any JSON value put in
place of any field is accepted exactly when the format's rule for that field (written again here)
takes it, and otherwise refused with a documented reason and a message naming the field and the
value; missing and unknown keys at every level likewise. `tune --check` says so, exit 1."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import assume, example, given, settings, strategies as st

from fa2patch.measure import profile as pf
from helpers import REPO

reader = pf.reader()
FORMAT = "fa2patch-routing-profile/1"
EXACT, DECODE, GQA = "sm70-dense", "sm70-decode", "sm70-gqa-prefill"
END = 1 << 62
JSON_TEXT = st.text(st.characters(codec="utf-8"), max_size=12)
# Any JSON value json.dumps writes as strict JSON (no NaN or Infinity; integers the reader can parse).
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | JSON_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(JSON_TEXT, inner, max_size=3),
    max_leaves=6,
)

# The format's bounds and their neighbours, alone and in pairs (ranges), and near-integers: where a
# rule that is off by one, or takes a bool or a float for an integer, differs from the format's.
EDGES = st.sampled_from([-1, 0, 1, 2, 16, 17, 255, 256, 257, 1 << 16, (1 << 16) + 1, 1 << 20, (1 << 20) + 1])
EDGES |= st.sampled_from([1 << 62, (1 << 62) + 1, True, False, 1.0, 256.0, "1"])
VALUES = JSON | EDGES | st.lists(EDGES, max_size=3)


def is_int(v, low: int, high: int) -> bool:
    return type(v) is int and low <= v <= high


def is_range(v, low: int) -> bool:
    return isinstance(v, list) and len(v) == 2 and all(is_int(x, low, END) for x in v) and v[0] < v[1]


# The format's rule for each field, written from README "Tuning routing for your card".
RULES = {
    "format": lambda v: v == FORMAT,
    "device": lambda v: (
        isinstance(v, dict)
        and not set(v) - {"name", "sms", "capability"}
        and isinstance(v.get("name"), str)
        and v["name"] != ""
        and is_int(v.get("sms"), 1, 1 << 20)
        and isinstance(v.get("capability"), list)
        and len(v["capability"]) == 2
        and all(is_int(c, 0, 1 << 16) for c in v["capability"])
    ),
    "device.name": lambda v: isinstance(v, str) and v != "",
    "device.sms": lambda v: is_int(v, 1, 1 << 20),
    "device.capability": lambda v: isinstance(v, list) and len(v) == 2 and all(is_int(c, 0, 1 << 16) for c in v),
    "extension_sha256": lambda v: isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v) is not None,
    "software": lambda v: isinstance(v, dict),
    "clocks_seen": lambda v: isinstance(v, dict),
    "measured": lambda v: isinstance(v, list),
    "decisions": lambda v: isinstance(v, list) and all(is_decision(d) for d in v),
    "group": lambda v: is_int(v, 1, 1 << 16),
    "head_dim": lambda v: is_int(v, 1, 256),
    "q": lambda v: is_range(v, 0),
    "kv": lambda v: is_range(v, 0),
    "batch": lambda v: is_range(v, 1),
    "route": lambda v: v in (EXACT, DECODE, GQA),
}


def is_decision(d) -> bool:
    return (
        isinstance(d, dict)
        and not set(d) - {"group", "head_dim", "q", "kv", "batch", "route", "splits"}
        and all(RULES[k](d.get(k)) for k in ("group", "head_dim", "q", "kv", "route"))
        and ("batch" not in d or RULES["batch"](d["batch"]))
        and ("splits" not in d or (d.get("route") == EXACT and is_int(d["splits"], 1, 16)))
    )


# The message names the field as the reader's path: "<file>: device.sms", "<file>: decisions[0].q".
TOP = ["format", "device", "extension_sha256", "software", "clocks_seen", "measured", "decisions"]
DEVICE = ["device.name", "device.sms", "device.capability"]
DECISION = ["group", "head_dim", "q", "kv", "batch", "route"]


def ranges(low: int):
    return st.tuples(st.integers(low, END - 1), st.integers(1, END)).map(lambda t: [t[0], min(t[0] + t[1], END)])


@st.composite
def decisions(draw) -> dict:
    route = draw(st.sampled_from([EXACT, DECODE, GQA]))
    d = {
        "group": draw(st.integers(1, 1 << 16)),
        "head_dim": draw(st.integers(1, 256)),
        "q": draw(ranges(0)),
        "kv": draw(ranges(0)),
        "route": route,
    }
    if draw(st.booleans()):
        d["batch"] = draw(ranges(1))
    if route == EXACT and draw(st.booleans()):
        d["splits"] = draw(st.integers(1, 16))
    return d


@st.composite
def profiles(draw) -> dict:
    doc = {
        "format": FORMAT,
        "device": {
            "name": draw(st.text(st.characters(codec="utf-8"), min_size=1, max_size=20)),
            "sms": draw(st.integers(1, 1 << 20)),
            "capability": [draw(st.integers(0, 1 << 16)), draw(st.integers(0, 1 << 16))],
        },
        "extension_sha256": draw(st.from_regex(r"[0-9a-f]{64}", fullmatch=True)),
        "decisions": draw(st.lists(decisions(), max_size=4)),
    }
    for key, kind in (("software", dict), ("clocks_seen", dict), ("measured", list)):
        if draw(st.booleans()):
            doc[key] = draw(
                st.dictionaries(JSON_TEXT, JSON, max_size=2) if kind is dict else st.lists(JSON, max_size=2)
            )
    return doc


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("profiles")


def write(folder: Path, doc) -> Path:
    path = folder / "p.json"
    path.write_text(json.dumps(doc))
    return path


@given(profiles())
def test_a_profile_is_read_as_written_and_handed_over_as_nine_integers_a_decision(folder, doc):
    path = write(folder, doc)
    assert reader.check_file(path, doc["device"], doc["extension_sha256"]) == doc
    ints, routes = reader.flat_decisions(doc)
    assert routes == [d["route"] for d in doc["decisions"]] and len(ints) == 9 * len(routes)
    for i, d in enumerate(doc["decisions"]):
        batch = d.get("batch", [1, END])
        assert ints[9 * i : 9 * i + 9] == [d["group"], d["head_dim"], *d["q"], *d["kv"], *batch, d.get("splits", 1)]


def outcome(path: Path):
    """None when the reader takes the file, else (reason, message)."""
    try:
        reader.check_file(path)
    except reader.ProfileRefused as exc:
        return exc.reason, str(exc)
    return None


def names_the_value(message: str, value) -> bool:
    return repr(value) in message or type(value).__name__ in message


@given(profiles(), st.sampled_from(TOP + DEVICE), VALUES)
@example({"format": FORMAT, "device": {"name": "V100", "sms": 80, "capability": [7, 0]},
          "extension_sha256": "0" * 64, "decisions": []}, "device.sms", True)  # fmt: skip
def test_any_value_of_a_field_is_taken_exactly_when_the_format_takes_it(folder, doc, field, value):
    if field.startswith("device."):
        doc["device"][field.split(".")[1]] = value
    else:
        doc[field] = value
    result = outcome(write(folder, doc))
    assert (result is None) == RULES[field](value), (field, value, result)
    if result is not None:
        reason, message = result
        assert reason in ("wrong_format", "bad_field", "unknown_key", "unknown_route"), result
        assert f": {field}" in message, result
        if field not in ("device", "decisions"):  # else the message names the part inside that is wrong
            assert names_the_value(message, value), result


@given(profiles().filter(lambda d: d["decisions"]), st.sampled_from(DECISION), VALUES, st.data())
def test_any_value_of_a_decision_field_is_taken_exactly_when_the_format_takes_it(folder, doc, field, value, data):
    i = data.draw(st.integers(0, len(doc["decisions"]) - 1))
    d = doc["decisions"][i]
    d[field] = value
    if "splits" in d and d["route"] != EXACT:
        del d["splits"]  # splits is the exact route's only: tested on its own below
    result = outcome(write(folder, doc))
    assert (result is None) == RULES[field](value), (field, value, result)
    if result is not None:
        reason, message = result
        assert reason == ("unknown_route" if field == "route" and isinstance(value, str) else "bad_field"), result
        assert f"decisions[{i}].{field}" in message and names_the_value(message, value), result


@given(profiles(), st.integers(-1, 18) | VALUES, st.sampled_from([EXACT, DECODE, GQA]))
def test_splits_are_taken_only_on_the_exact_route_from_1_to_16(folder, doc, splits, route):
    d = {"group": 1, "head_dim": 64, "q": [0, 2], "kv": [0, 9], "route": route, "splits": splits}
    doc["decisions"].append(d)
    result = outcome(write(folder, doc))
    assert (result is None) == (route == EXACT and is_int(splits, 1, 16)), result
    if result is not None:
        where = f"decisions[{len(doc['decisions']) - 1}].splits"
        assert result[0] == "bad_field" and where in result[1], result


# Every integer of the format with its bounds: a value at, inside or just beyond them (or a float
# or a bool at a bound) is taken exactly when it is an integer within them.
BOUNDS = {
    "device.sms": (1, 1 << 20),
    "device.capability": (0, 1 << 16),
    "group": (1, 1 << 16),
    "head_dim": (1, 256),
    "q": (0, END),
    "kv": (0, END),
    "batch": (1, END),
}


def near(low: int, high: int):
    edges = st.sampled_from([low - 1, low, low + 1, high - 1, high, high + 1])
    return edges | st.integers(low - 2, min(high + 2, low + 300)) | st.sampled_from([float(low), float(high), True])


@pytest.mark.parametrize("field", sorted(BOUNDS))
@settings(max_examples=max(1, settings.default.max_examples // 2))  # per field
@given(doc=profiles().filter(lambda d: d["decisions"]), data=st.data())
def test_integers_are_taken_exactly_within_their_bounds(folder, field, doc, data):
    low, high = BOUNDS[field]
    if field in ("device.capability", "q", "kv", "batch"):  # pairs: [major, minor], [lo, hi)
        value = [data.draw(near(low, high)), data.draw(near(low, high))]
        ok = all(is_int(v, low, high) for v in value) and (field == "device.capability" or value[0] < value[1])
    else:
        value = data.draw(near(low, high))
        ok = is_int(value, low, high)
    if field.startswith("device."):
        doc["device"][field.split(".")[1]] = value
    else:
        doc["decisions"][0][field] = value
    result = outcome(write(folder, doc))
    assert (result is None) == ok, (field, value, result)
    assert result is None or (result[0] == "bad_field" and field.split(".")[-1] in result[1]), result


@given(profiles(), st.sampled_from(["top", "device", "decision"]), JSON_TEXT.filter(bool), JSON)
def test_an_unknown_key_at_any_level_is_refused_naming_it(folder, doc, level, key, value):
    known = {"top": reader.TOP_LEVEL, "device": set(reader.DEVICE_KEYS), "decision": reader.DECISION_KEYS}[level]
    assume(key not in known and (level != "decision" or doc["decisions"]))
    target = {"top": doc, "device": doc["device"]}.get(level) or doc["decisions"][0]
    target[key] = value
    reason, message = outcome(write(folder, doc))
    assert reason == "unknown_key" and key in message, message


@given(profiles(), st.sampled_from(["format", "device", "extension_sha256", "decisions", *DEVICE, *DECISION]))
def test_a_missing_required_key_is_refused_naming_it(folder, doc, key):
    assume(key not in DECISION or (key != "batch" and doc["decisions"]))  # batch is optional
    if key.startswith("device."):
        del doc["device"][key.split(".")[1]]
    elif key in DECISION:
        del doc["decisions"][0][key]
    else:
        del doc[key]
    reason, message = outcome(write(folder, doc))
    assert reason in ("wrong_format", "bad_field"), message
    assert key.split(".")[-1] in message, message


@given(profiles(), st.integers(0, 400), st.binary(max_size=3))
def test_a_cut_or_garbled_file_is_refused_with_a_reason(folder, doc, at, junk):
    raw = json.dumps(doc).encode()
    at = min(at, len(raw) - 1)
    path = folder / "cut.json"
    path.write_bytes(raw[:at] + junk)
    result = outcome(path)  # junk may close what the cut left open: then a profile the reader has checked
    assert result is None or (result[0] in reader_reasons() and str(path) in result[1]), result


def reader_reasons() -> set[str]:
    """The reasons ProfileRefused documents (its docstring)."""
    return set(re.findall(r"[a-z]+_[a-z_]+", reader.ProfileRefused.__doc__.split("one of:")[1]))


@pytest.mark.parametrize(
    "content, words",
    [
        (
            json.dumps({"format": FORMAT, "device": 7, "extension_sha256": "0" * 64, "decisions": []}),
            ["bad_field", "device: expected an object, actual int"],
        ),
        (b"\xff\xfe", ["invalid_json", "not valid JSON"]),
    ],
    ids=["device-number", "not-utf8"],
)
def test_tune_check_refuses_a_bad_profile_without_a_traceback(tmp_path, content, words):
    path = tmp_path / "profile.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    for as_json in ([], ["--json"]):
        proc = subprocess.run(
            [sys.executable, "-m", "fa2patch", "tune", "--check", str(path), *as_json],
            capture_output=True,
            text=True,
            cwd=REPO,
            env={**os.environ, "FA2PATCH_ROOT": str(REPO)},
        )
        output = proc.stdout + proc.stderr
        assert proc.returncode == 1 and "Traceback" not in output, output
        assert str(path) in output and all(w in output for w in words), output
        if as_json:
            assert json.loads(proc.stdout)["reason"] == words[0]
