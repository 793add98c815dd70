# SPDX-License-Identifier: BSD-3-Clause
"""Bench JSON files given to `report --anchors` (model/user_anchors.py's read_bench and load),
property-based: every file generated as `fa2patch bench --json-file` writes it becomes one anchor per
case with a time and a clock (the case's time, shape, clock and its source) and one listed skip per
other case, in order; any value put in place of a field a case is read by is taken exactly when the
bench format's rule for it (written again here) takes it, and otherwise refused with an
EnvironmentProblem naming the file, the case, the field and the value; cut and garbled files
likewise, never another exception. `report --anchors` says so, exit 2, before it reads a build."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import assume, example, given, settings, strategies as st

from fa2patch.common.errors import EnvironmentProblem
from fa2patch.common.shapes import Shape
from fa2patch.model import user_anchors as u
from helpers import REPO

TEXT = st.text(st.characters(codec="utf-8"), max_size=12)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats() | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)
# Bounds, their neighbours and near-numbers, where an off-by-one or a bool taken for an integer shows.
VALUES = JSON | st.sampled_from([-1, 0, 1, 2, True, False, 1.0, 0.0, -0.5, "1", math.nan, math.inf])
SHAPE_MIN = {"q": 1, "kv": 1, "hq": 1, "hkv": 1, "d": 1, "b": 1, "decode": 0, "decode_kv": 0, "page": 0}


def is_count(v, low: int) -> bool:
    return type(v) is int and v >= low


def is_number(v) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


def counts_from(low: int):
    return lambda v: is_count(v, low)


# The rule for each field a case is read by, from what bench writes (measure/bench.py, gpu_clocks.py).
RULES = {
    **{f"shape.{k}": counts_from(low) for k, low in SHAPE_MIN.items()},
    "shape.causal": lambda v: type(v) is bool,
    "shape.scale": lambda v: is_number(v) and v > 0,
    "label": lambda v: v is None or isinstance(v, str),
    "route": lambda v: v is None or isinstance(v, str),
    "error": lambda v: v is None or isinstance(v, str),
    "sm_clock_after": lambda v: v is None or isinstance(v, str),
    "median_ms": lambda v: v is None or is_number(v),
    "clocks": lambda v: v is None or (isinstance(v, dict) and RULES["clocks.sm_clock_mhz"](v.get("sm_clock_mhz"))),
    "clocks.sm_clock_mhz": lambda v: (
        v is None or (isinstance(v, dict) and RULES["clocks.sm_clock_mhz.median"](v.get("median")))
    ),
    "clocks.sm_clock_mhz.median": lambda v: v is None or (is_number(v) and v >= 0),
}


@st.composite
def shapes(draw) -> dict:
    shape = {
        "q": draw(st.integers(1, 8192)),
        "kv": draw(st.integers(1, 1 << 18)),
        "hq": draw(st.integers(1, 64)),
        "hkv": draw(st.integers(1, 8)),
        "d": draw(st.sampled_from([64, 128, 256])),
        "causal": draw(st.booleans()),
        "scale": draw(st.floats(min_value=1e-3, max_value=1.0)),
    }
    for key, low in (("b", 1), ("decode", 0), ("decode_kv", 0), ("page", 0)):
        if draw(st.booleans()):  # older files lack the later keys: Shape's defaults
            shape[key] = draw(st.integers(low, 64))
    return shape


@st.composite
def cases(draw) -> dict:
    """A case as bench writes it, of one of four kinds: timed with NVML's clocks, timed with only
    nvidia-smi's clock after, timed with no clock, or failed."""
    shape = draw(shapes())
    case = {"route": draw(st.sampled_from(["sm70-dense", "sm70-decode", "sm70-gqa-prefill"])), "shape": shape}
    case["label"] = Shape(**shape).label
    kind = draw(st.sampled_from(["nvml", "smi", "no-clock", "error"]))
    if kind == "error":
        return {**case, "error": draw(TEXT)}
    ms = draw(st.floats(min_value=1e-4, max_value=1e4))
    clock = draw(st.integers(100, 2000))
    case.update(median_ms=ms, min_ms=ms, max_ms=ms, throttled=draw(st.none() | st.booleans()))
    nvml = {"samples": 10, "sm_clock_mhz": {"min": clock, "median": clock, "max": clock}, "throttled": False}
    case["clocks"] = nvml if kind == "nvml" else None
    case["sm_clock_after"] = f"{clock} MHz" if kind == "smi" else draw(st.sampled_from(["", "[N/A]"]))
    return case


@st.composite
def bench_files(draw) -> dict:
    return {
        "gpu": "Tesla V100-SXM2-32GB",
        "capability": "sm_70",
        "sms": draw(st.integers(1, 160)),
        "manifest_sha256": "ab" * 32,
        "results": draw(st.lists(cases(), min_size=1, max_size=5)),
    }


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("anchors")


def write(folder: Path, doc) -> Path:
    path = folder / "bench.json"
    path.write_text(json.dumps(doc))
    return path


def launches_for(shape, route, card):
    """Stands in for report.route_launches: what it was asked for, as the launches."""
    return [{"shape": shape, "route": route, "sms": card.sms, "clock": card.clock_mhz}]


@given(bench_files())
def test_every_timed_and_clocked_case_is_an_anchor_and_every_other_is_listed(folder, doc):
    path = write(folder, doc)
    anchors, skipped = u.load([path], launches_for)
    timed = [c for c in doc["results"] if "median_ms" in c and (c["clocks"] or c["sm_clock_after"].endswith("MHz"))]
    assert len(anchors) == len(timed) and len(skipped) == len(doc["results"]) - len(timed)
    for a, c in zip(anchors, timed, strict=True):
        clock = float(c["sm_clock_after"].split()[0]) if c["clocks"] is None else c["clocks"]["sm_clock_mhz"]["median"]
        source = "NVML median" if c["clocks"] else "nvidia-smi right after"
        assert (a["measured_ms"], a["shape"], a["label"], a["route"]) == (
            c["median_ms"],
            c["shape"],
            c["label"],
            c["route"],
        )
        assert a["clock_mhz"] == clock and a["clock_source"].startswith(source) and a["card"]["sms"] == doc["sms"]
        assert a["workload"]["launches"] == [
            {"shape": Shape(**c["shape"]), "route": c["route"], "sms": doc["sms"], "clock": clock}
        ]
    others = [c for c in doc["results"] if c not in timed]
    assert [(s["label"], s["route"], s["file"]) for s in skipped] == [
        (c["label"], c["route"], str(path)) for c in others
    ]
    assert all(
        s["reason"].startswith("no time" if "error" in c else "no clock") for s, c in zip(skipped, others, strict=True)
    )
    assert u.shapes_of([path]) == [Shape(**c["shape"]) for c in doc["results"]]


def refusal(path: Path) -> str | None:
    """None when the file is read (and each case made an anchor or listed), else the message."""
    try:
        u.load([path], launches_for)
    except EnvironmentProblem as exc:
        message = str(exc)
        assert message.startswith(f"--anchors {path}: "), message
        return message
    return None


def put(case: dict, field: str, value) -> None:
    *parents, key = field.split(".")
    target = case
    for p in parents:
        if not isinstance(target.get(p), dict):
            target[p] = {}
        target = target[p]
    target[key] = value


# Per field, values at its rule's edges (a bound and its neighbours, a bool or a float for an
# integer, NaN and infinities, a number in a string) besides any JSON value.
COUNT_EDGES = [-1, 0, 1, 2, True, False, 0.0, 1.0, "1", None, 2**64]
EDGES = {
    **{f"shape.{k}": COUNT_EDGES for k in SHAPE_MIN},
    "shape.causal": [True, False, 0, 1, "true", None],
    "shape.scale": [0, 0.0, -0.0, -1, 1e-300, 0.125, 1, True, math.nan, math.inf, "0.125", None],
    "median_ms": [0, -1, 1.5, 1, True, math.nan, math.inf, -math.inf, "1.5", None],
    "clocks.sm_clock_mhz.median": [0, -1, 1300, 1300.5, True, math.nan, math.inf, "1300", None],
    "clocks": [None, {}, {"sm_clock_mhz": None}, {"sm_clock_mhz": 1300}, {"sm_clock_mhz": {"median": "x"}}, []],
    "clocks.sm_clock_mhz": [None, {}, {"median": 1300}, {"median": -1}, 1300, [], "1300 MHz"],
}


@pytest.mark.parametrize("field", sorted(RULES))
@settings(max_examples=max(1, settings.default.max_examples // 5))  # each example reads a dozen files
@given(doc=bench_files(), data=st.data())
def test_any_value_of_a_case_field_is_taken_exactly_when_the_bench_format_takes_it(folder, field, doc, data):
    """Each example: every edge value of the field, and one JSON value drawn, in one case drawn."""
    i = data.draw(st.integers(0, len(doc["results"]) - 1))
    for value in [*EDGES.get(field, [None, 1, True, "x"]), data.draw(VALUES)]:
        changed = json.loads(json.dumps(doc))
        put(changed["results"][i], field, value)
        message = refusal(write(folder, changed))
        assert (message is None) == RULES[field](value), (field, value, message)
        if message is not None:
            assert f"results[{i}].{field.split('.')[0]}" in message, message
            assert isinstance(value, dict) or repr(value) in message, message  # else the part inside


@given(bench_files(), st.sampled_from(["q", "kv", "hq", "hkv", "d", "causal", "scale"]), st.booleans(), TEXT)
def test_a_shape_missing_a_key_or_with_an_unknown_one_is_refused_naming_it(folder, doc, key, drop, extra):
    shape = doc["results"][0]["shape"]
    assume(drop or extra not in shape)
    if drop:
        del shape[key]
    else:
        shape[extra] = 1
    message = refusal(write(folder, doc))
    assert message is not None and "results[0].shape" in message, message
    assert (f"missing key(s) [{key!r}]" if drop else f"unknown key(s) [{extra!r}]") in message, message


@given(bench_files(), VALUES)
def test_a_case_that_is_no_object_is_refused(folder, doc, value):
    assume(not isinstance(value, dict))
    doc["results"][-1] = value
    message = refusal(write(folder, doc))
    assert message is not None and f"results[{len(doc['results']) - 1}]: expected an object" in message, message


@given(bench_files(), st.sampled_from(["capability", "sms", "results", None]), VALUES)
def test_a_file_from_another_gpu_or_of_another_shape_is_refused(folder, doc, key, value):
    if key is None:
        doc = value  # not an object at all
    else:
        doc[key] = value
    ok = key is not None and (
        (key == "capability" and value == "sm_70")
        or (key == "sms" and is_count(value, 1))
        or (key == "results" and value == [])
    )
    message = refusal(write(folder, doc))
    assert (message is None) == ok, (key, value, message)


@given(bench_files(), st.integers(0, 2000), st.binary(max_size=3))
@example({"capability": "sm_70", "sms": 80, "results": []}, 0, b"[" * 3)
def test_a_cut_or_garbled_file_is_read_or_refused_never_a_traceback(folder, doc, at, junk):
    raw = json.dumps(doc).encode()
    path = folder / "bench.json"
    path.write_bytes(raw[: min(at, len(raw) - 1)] + junk)
    refusal(path)  # None (junk closed what the cut left open) or the typed refusal


def test_nesting_too_deep_for_json_is_refused(folder):
    """A RecursionError before (json.loads nests one Python frame a level)."""
    path = folder / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    assert "cannot read it as JSON" in refusal(path)


@pytest.mark.parametrize(
    "case, words",
    [
        (5, ["results[0]: expected an object (a bench case), actual 5"]),
        ({"shape": {"q": 1}, "median_ms": 1.0}, ["results[0].shape: unknown key(s) [], missing key(s)"]),
    ],
    ids=["case-number", "shape-partial"],
)
def test_report_refuses_a_malformed_bench_file_without_a_traceback(tmp_path, case, words):
    """Both were tracebacks before (AttributeError, TypeError); report refuses them before it reads a
    build (there is none in this temporary project)."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "baseline.lock").write_bytes((REPO / "baseline.lock").read_bytes())
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"capability": "sm_70", "sms": 80, "results": [case]}))
    proc = subprocess.run(
        [sys.executable, "-m", "fa2patch", "report", "--anchors", str(path)],
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, "FA2PATCH_ROOT": str(root)},
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert str(path) in proc.stderr and all(w in proc.stderr for w in words), proc.stderr
