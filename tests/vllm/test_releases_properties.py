# SPDX-License-Identifier: BSD-3-Clause
"""The release matrix, packaging/vllm-releases.toml (vllm/releases.py's load), property-based: every
matrix written from the format is read as written (each release, its pinned files, the primary, the
releases of a torch); any TOML value put in place of any field is taken exactly when the format's
rule for that field (written again here) takes it, and otherwise refused with an EnvironmentProblem
naming the file, the release, the field and the value; missing, unknown and twice-listed entries and
garbled files likewise, never another exception. `doctor --vllm` says so, exit 2."""

import copy
import math
import re
import string
import sys
import tomllib
from pathlib import Path

import pytest
import tomlkit
from hypothesis import assume, example, given, settings, strategies as st

from fa2patch.common.errors import EnvironmentProblem
from fa2patch.common.project import Project
from fa2patch.vllm import releases
from fa2patch.vllm.releases import Pinned, Release

# tomlkit writes every example (some 10 ms each): two fifths of the profile's examples a test.
FEWER = settings(max_examples=max(1, settings.default.max_examples * 2 // 5))
HEX64 = st.from_regex(r"[0-9a-f]{64}", fullmatch=True)
VERSION = st.from_regex(r"[0-9]{1,2}\.[0-9]{1,2}(\.[0-9]{1,2}(rc[0-9]|\.post[0-9])?)?", fullmatch=True)
KEY = st.text(string.ascii_lowercase + "_", min_size=1, max_size=8)
TEXT = st.text(st.characters(codec="utf-8"), max_size=12)
# Any TOML value (no dates), and the edges of this format's rules.
TOML = st.recursive(
    st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats() | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEY, inner, max_size=3),
    max_leaves=6,
)
EDGES = st.sampled_from(
    [0, 1, -1, True, False, 1.0, "", "1", "12.8", "12.8.1", "2.10.0", "0.19", "x.1", "1.", math.nan]
)
VALUES = TOML | EDGES | HEX64 | HEX64.map(str.upper) | HEX64.map(lambda h: h + "\n")

SHA_RULE = r"[0-9a-f]{64}"
RELEASE_RULE = r"[0-9]+\.[0-9]+(\.[0-9A-Za-z.]+)?"


def text_matching(pattern: str):
    return lambda v: isinstance(v, str) and re.fullmatch(pattern, v) is not None


def positive(v) -> bool:
    return type(v) is int and v >= 1


def pinned_ok(v) -> bool:
    return (
        isinstance(v, dict)
        and set(v) == {"file", "sha256", "size"}
        and text_matching(r"[\s\S]+")(v["file"])
        and text_matching(SHA_RULE)(v["sha256"])
        and positive(v["size"])
    )


# The format's rule for each field: what the matrix's comments say of it and what its readers need.
RULES = {
    "version": text_matching(RELEASE_RULE),
    "line": text_matching(r"[\s\S]+"),
    "torch": text_matching(RELEASE_RULE),
    "torch_cuda": text_matching(r"[0-9]+\.[0-9]+"),
    "v100_from_index": lambda v: type(v) is bool,
    "sdist": pinned_ok,
    "sdist.file": text_matching(r"[\s\S]+"),
    "sdist.sha256": text_matching(SHA_RULE),
    "sdist.size": positive,
    "wheel_files": lambda v: (
        v == {}
        or (
            isinstance(v, dict)
            and set(v) == {"wheel", "files"}
            and pinned_ok(v["wheel"])
            and isinstance(v["files"], dict)
            and v["files"] != {}
            and all(text_matching(SHA_RULE)(s) for s in v["files"].values())
        )
    ),
}


@st.composite
def pinned(draw, suffix: str) -> dict:
    return {"file": draw(TEXT.filter(bool)) + suffix, "sha256": draw(HEX64), "size": draw(st.integers(1, 2**40))}


@st.composite
def release_entries(draw, version: str) -> dict:
    entry = {
        "version": version,
        "line": draw(TEXT.filter(bool)),
        "torch": draw(VERSION),
        "torch_cuda": f"{draw(st.integers(10, 14))}.{draw(st.integers(0, 9))}",
        "v100_from_index": draw(st.booleans()),
        "sdist": draw(pinned(".tar.gz")),
    }
    if draw(st.booleans()):
        paths = st.from_regex(r"vllm/[a-z_/]{1,20}\.py", fullmatch=True)
        entry["wheel_files"] = {
            "wheel": draw(pinned(".whl")),
            "files": draw(st.dictionaries(paths, HEX64, min_size=1, max_size=3)),
        }
    return entry


@st.composite
def matrices(draw) -> dict:
    versions = draw(st.lists(VERSION, min_size=1, max_size=4, unique=True))
    entries = [draw(release_entries(v)) for v in versions]
    return {"format": 1, "primary": draw(st.sampled_from(versions)), "release": entries}


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Project:
    root = tmp_path_factory.mktemp("matrix")
    (root / "packaging").mkdir()
    return Project(root)


def write(project: Project, doc) -> Path:
    path = project.root / releases.MATRIX
    path.write_text(tomlkit.dumps(doc))
    return path


def as_read(value):
    """The value as the matrix's reader sees it once written (tomllib)."""
    return tomllib.loads(tomlkit.dumps({"v": value}))["v"]


def as_release(entry: dict) -> Release:
    extra = entry.get("wheel_files") or {}
    return Release(
        version=entry["version"],
        line=entry["line"],
        torch=entry["torch"],
        torch_cuda=entry["torch_cuda"],
        v100_from_index=entry["v100_from_index"],
        sdist=Pinned(**entry["sdist"]),
        wheel=Pinned(**extra["wheel"]) if extra else None,
        wheel_files=dict(extra.get("files", {})),
    )


@FEWER
@given(matrices())
def test_a_matrix_is_read_as_written(project, doc):
    path = write(project, doc)
    matrix = releases.load(project)
    assert matrix.path == path and matrix.releases == tuple(as_release(e) for e in doc["release"])
    assert matrix.primary.version == doc["primary"] and matrix.versions() == [e["version"] for e in doc["release"]]
    for e in doc["release"]:
        assert [r.version for r in matrix.for_torch(e["torch"] + "+cu128")] == [
            x["version"] for x in doc["release"] if x["torch"] == e["torch"]
        ]
        major, minor = e["torch"].split(".")[:2]
        assert matrix.get(e["version"]).torch_minor == (int(major), int(minor))


def refusal(project: Project) -> str | None:
    try:
        releases.load(project)
    except EnvironmentProblem as exc:
        message = str(exc)
        assert message.startswith(f"{project.root / releases.MATRIX}: "), message
        return message
    return None


H = "ab" * 32
PIN = {"file": "vllm-0.19.1.tar.gz", "sha256": H, "size": 1}
# Per field, values at its rule's edges: a bound and its neighbours, a bool or a float for an
# integer, near-miss patterns, tables missing or adding a key.
FIELD_EDGES = {
    "version": ["0.19.1", "0.19", "0.10.0rc1", "0.8.5.post1", "1.", "1", ".1", "x.1", "", 1, 1.5, True],
    "torch": ["2.10.0", "2.10", "2.", "2", "2.x", "", 2, True],
    "torch_cuda": ["12.8", "12", "12.8.1", "12.", "a.b", "", 12.8, True],
    "line": ["", "x", "\n", 1, True, ["x"]],
    "v100_from_index": [True, False, 1, 0, "true", "no"],
    "sdist": [PIN, {}, {"file": "x", "sha256": H}, {**PIN, "url": "x"}, [PIN], "x"],
    "sdist.file": ["", "x", 1, True],
    "sdist.sha256": [H, H.upper(), H + "\n", H[:-1], "", 1],
    "sdist.size": [0, 1, -1, True, False, 1.0, "1", 2**63 - 1],
    "wheel_files": [
        {},
        {"wheel": PIN, "files": {"vllm/a.py": H}},
        {"wheel": PIN, "files": {}},
        {"wheel": PIN, "files": {"vllm/a.py": H.upper()}},
        {"wheel": PIN},
        {"wheel": {}, "files": {"vllm/a.py": H}},
        {"wheel": PIN, "files": {"vllm/a.py": H}, "url": "x"},
        [],
        "x",
    ],
}


@pytest.mark.parametrize("field", sorted(RULES))
@settings(max_examples=max(1, settings.default.max_examples // 10))  # each example writes a dozen files
@given(doc=matrices(), data=st.data())
def test_any_value_of_a_release_field_is_taken_exactly_when_the_format_takes_it(project, field, doc, data):
    """Each example: every edge value of the field, and one TOML value drawn, in one release drawn."""
    i = data.draw(st.integers(0, len(doc["release"]) - 1))
    for value in [*FIELD_EDGES[field], data.draw(VALUES)]:
        changed = copy.deepcopy(doc)
        entry = changed["release"][i]
        top, _, sub = field.partition(".")
        if sub:
            entry[top][sub] = value
        else:
            entry[top] = value
        if field == "version":  # the primary follows its release; two of one version: tested below
            if changed["primary"] == doc["release"][i]["version"]:
                changed["primary"] = value
            if any(value == e["version"] for j, e in enumerate(doc["release"]) if j != i):
                continue
        write(project, changed)
        message = refusal(project)
        assert (message is None) == RULES[top](entry[top]), (field, value, message)
        if message is not None:
            assert f"release[{i}].{top}" in message, message
            if not isinstance(value, dict):
                assert repr(as_read(value)) in message, message


@FEWER
@given(matrices(), st.sampled_from(["version", "line", "torch", "torch_cuda", "v100_from_index", "sdist"]))
def test_a_missing_release_key_is_refused_naming_it(project, doc, key):
    del doc["release"][0][key]
    write(project, doc)
    assert f"release[0]: unknown key(s) [], missing key(s) [{key!r}]" in refusal(project)


@FEWER
@given(matrices(), KEY, TOML, st.sampled_from(["top", "release"]))
def test_an_unknown_key_is_refused_naming_it(project, doc, key, value, level):
    target = doc if level == "top" else doc["release"][0]
    assume(key not in target and key not in (releases.TOP_KEYS if level == "top" else releases.RELEASE_KEYS))
    target[key] = value
    write(project, doc)
    assert f"unknown key(s) [{key!r}]" in refusal(project)


@FEWER
@given(matrices(), VALUES)
@example({"format": 1, "primary": "0.1", "release": []}, True)  # True == 1 in Python: taken before
def test_another_format_is_refused_with_expected_and_actual(project, doc, value):
    assume(type(value) is not int or value != 1)
    doc["format"] = value
    write(project, doc)
    assert f"format: expected 1, actual {as_read(value)!r}" in refusal(project)


@FEWER
@given(matrices(), VALUES)
@example({"format": 1, "primary": "0.1", "release": []}, 5)  # a TypeError before
def test_releases_that_are_no_array_of_tables_are_refused(project, doc, value):
    assume(not isinstance(value, list))
    doc["release"] = value
    write(project, doc)
    assert f"release: expected an array of tables ([[release]]), actual {as_read(value)!r}" in refusal(project)


@FEWER
@given(matrices(), VALUES)
def test_a_primary_not_listed_is_refused_naming_it(project, doc, value):
    assume(value not in [e["version"] for e in doc["release"]])
    doc["primary"] = value
    write(project, doc)
    assert "primary: expected one of" in refusal(project)


@FEWER
@given(matrices())
def test_a_version_listed_twice_is_refused(project, doc):
    doc["release"].append(dict(doc["release"][0]))
    write(project, doc)
    assert "a version is listed twice" in refusal(project)


@FEWER
@given(matrices(), st.integers(0, 4000), st.binary(max_size=3))
@example({"format": 1, "primary": "0.1", "release": []}, 0, b"\xff")  # a UnicodeDecodeError before
def test_a_cut_or_garbled_file_is_read_or_refused_never_a_traceback(project, doc, at, junk):
    raw = tomlkit.dumps(doc).encode()
    (project.root / releases.MATRIX).write_bytes(raw[: min(at, len(raw))] + junk)
    refusal(project)  # None (still a matrix) or the typed refusal naming the file


def test_doctor_refuses_a_malformed_matrix_without_a_traceback(mini):
    """`release = 5` was a traceback before (TypeError)."""
    path = mini.root / releases.MATRIX
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('format = 1\nprimary = "0.19.1"\nrelease = 5\n')
    proc = mini.run("doctor", "--vllm", sys.executable, check_rc=2)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert f"{path}: release: expected an array of tables ([[release]]), actual 5" in proc.stderr, proc.stderr
