# SPDX-License-Identifier: BSD-3-Clause
"""baseline.lock (common/lockfile.py's Lock.load), property-based: every lock written from the format
is read as written and survives `export`'s rewrite of [[patches]] with its comments; every lock broken
in one place (a value of another type, out of its pattern or range, a missing or unknown field, a
wrong format number, garbled text) is refused with CheckFailed naming the lock file and the field,
with the expected and actual value where there are two; never another exception. `fa2patch check`
says so on the command line, exit 1, without a traceback (test_lock.py flips each real field)."""

import re
import string
import tomllib
from pathlib import Path

import pytest
import tomlkit
from hypothesis import assume, example, given, settings, strategies as st

from fa2patch.common.errors import CheckFailed
from fa2patch.common.lockfile import Baseline, Lock, PatchEntry, Toolchain
from helpers import REPO

# tomlkit writes and reads every example (some 10 ms each): half the profile's examples a test.
FEWER = settings(max_examples=max(1, settings.default.max_examples // 2))
HEX64 = st.from_regex(r"[0-9a-f]{64}", fullmatch=True)
RELEASE = st.from_regex(r"[0-9]{1,3}(\.[0-9]{1,3}){0,3}", fullmatch=True)
SIMPLE_KEY = st.text(string.ascii_lowercase + "_", min_size=1, max_size=8)
# Any TOML value (no dates: their Python reprs differ between TOML readers).
TOML_VALUE = st.recursive(
    st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats() | st.text(st.characters(codec="utf-8")),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(SIMPLE_KEY, inner, max_size=3),
    max_leaves=6,
)
KINDS = {
    ("baseline", "size"): int,
    ("baseline", "files"): int,
    ("toolchain", "wheels"): list,
}
FIELDS = [("baseline", f) for f in Baseline.__dataclass_fields__] + [
    ("toolchain", f) for f in Toolchain.__dataclass_fields__
]


def _a_lock() -> dict:
    """A valid lock for the explicit examples: the repository's own (test_lock.py flips its fields)."""
    return tomllib.loads((REPO / "baseline.lock").read_text())


def normalized(name: str) -> str:
    """PEP 503: runs of -, _ and . are one -, case folded."""
    return re.sub(r"[-_.]+", "-", name).lower()


@st.composite
def spelling(draw, name: str) -> str:
    """The project's name as an sdist may spell it: any separator, any case."""
    parts = re.split(r"[-_.]+", name)
    seps = [draw(st.sampled_from("-_.")) for _ in parts[1:]]
    text = parts[0] + "".join(s + p for s, p in zip(seps, parts[1:], strict=True))
    return "".join(c.upper() if draw(st.booleans()) else c for c in text)


@st.composite
def locks(draw) -> dict:
    """A valid lock as a dict (what tomllib would read back)."""
    project = draw(st.from_regex(r"[a-z][a-z0-9]{0,6}([-_.][a-z0-9]{1,5}){0,2}", fullmatch=True))
    version = draw(st.from_regex(r"[0-9]{1,3}(\.[0-9]{1,3}){0,2}(rc[0-9])?", fullmatch=True))
    top_dir = f"{draw(spelling(project))}-{version}"
    cuda = f"{draw(st.integers(10, 14))}.{draw(st.integers(0, 9))}"
    wheel_name = st.from_regex(r"[a-z][a-z0-9._-]{0,12}", fullmatch=True)
    wheels = [f"{draw(wheel_name)}=={cuda}.{draw(st.integers(0, 999))}" for _ in range(draw(st.integers(0, 3)))]
    patches = [
        {
            "file": f"{i:04d}-{draw(st.from_regex(r'[a-z0-9][a-z0-9-]{0,12}', fullmatch=True))}.patch",
            "sha256": draw(HEX64),
            "tree_digest": "sha256:" + draw(HEX64),
        }
        for i in range(1, draw(st.integers(0, 4)) + 1)
    ]
    return {
        "format": 2,
        "baseline": {
            "project": project,
            "version": version,
            "archive": top_dir + ".tar.gz",
            "sha256": draw(HEX64),
            "size": draw(st.integers(1, 2**40)),
            "top_dir": top_dir,
            "tree_digest": "sha256:" + draw(HEX64),
            "files": draw(st.integers(1, 10**6)),
        },
        "toolchain": {
            "cuda": cuda,
            "torch": draw(RELEASE),
            "clang": str(draw(st.integers(0, 99))),
            "wheels": wheels,
            "fatbinary_wheel": f"{draw(wheel_name)}=={draw(RELEASE)}",
        },
        "patches": patches,
    }


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("locks")


def write(folder: Path, doc: dict, comment: str = "") -> Path:
    path = folder / "baseline.lock"
    path.write_text(comment + tomlkit.dumps(doc))
    return path


def refused(path: Path, *words: str) -> str:
    """The CheckFailed message of loading ``path``; it names the file and holds every word."""
    with pytest.raises(CheckFailed) as exc:
        Lock.load(path)
    message = str(exc.value)
    assert str(path) in message and all(w in message for w in words), (words, message)
    return message


@FEWER
@given(locks())
def test_a_lock_is_read_as_written(folder, doc):
    lock = Lock.load(write(folder, doc))
    assert lock.baseline == Baseline(**doc["baseline"])
    assert lock.toolchain == Toolchain(**{**doc["toolchain"], "wheels": tuple(doc["toolchain"]["wheels"])})
    assert lock.patches == [PatchEntry(**p) for p in doc["patches"]]
    assert lock.final_digest() == (doc["patches"] or [doc["baseline"]])[-1]["tree_digest"]


@FEWER
@given(locks(), locks())
def test_export_rewrites_the_patches_and_keeps_everything_else(folder, doc, other):
    path = write(folder, doc, comment="# reviewed like code\n")
    entries = [PatchEntry(**p) for p in other["patches"]]
    Lock.load(path).write_patches(entries)
    again = Lock.load(path)
    assert again.patches == entries and again.baseline == Baseline(**doc["baseline"])
    assert "# reviewed like code\n" in path.read_text()


@FEWER
@given(locks(), st.sampled_from(FIELDS), TOML_VALUE)
@example(_a_lock(), ("baseline", "size"), True)  # a bool is no int
def test_a_value_of_another_type_is_refused_naming_field_and_value(folder, doc, field, value):
    table, key = field
    kind = KINDS.get(field, str)
    assume(not isinstance(value, kind) or isinstance(value, bool))
    doc[table][key] = value
    path = write(folder, doc)
    actual = tomllib.loads(path.read_text())[table][key]
    refused(path, f"[{table}] {key} must be {kind.__name__}, got {actual!r}")


@FEWER
@given(locks(), st.sampled_from(FIELDS))
def test_a_missing_field_is_refused_naming_it(folder, doc, field):
    table, key = field
    del doc[table][key]
    refused(write(folder, doc), f"[{table}]", f"missing {key}")


@FEWER
@given(locks(), st.sampled_from(["baseline", "toolchain", "format"]))
def test_a_missing_table_or_format_is_refused_naming_it(folder, doc, name):
    del doc[name]
    refused(write(folder, doc), "missing format" if name == "format" else f"missing [{name}]")


@FEWER
@given(locks(), st.sampled_from(["baseline", "toolchain", None]), SIMPLE_KEY, TOML_VALUE)
def test_an_unknown_field_is_refused_naming_it(folder, doc, table, key, value):
    target = doc if table is None else doc[table]
    assume(key not in target)
    target[key] = value
    words = [f"unknown top-level field(s) {key}"] if table is None else [f"[{table}] unknown field(s) {key}"]
    refused(write(folder, doc), *words)


@FEWER
@given(locks(), TOML_VALUE)
@example(_a_lock(), 3)
@example(_a_lock(), 2.0)
@example(_a_lock(), "2")
def test_a_lock_of_another_format_is_refused_with_expected_and_actual(folder, doc, value):
    assume(type(value) is not int or value != 2)
    doc["format"] = value
    path = write(folder, doc)
    refused(path, "format mismatch", "expected: 2", f"actual:   {tomllib.loads(path.read_text())['format']}")


# Strings that are no sha256 (64 lowercase hex digits): any text, and near misses.
NOT_HEX64 = (
    st.text(st.characters(codec="utf-8"), max_size=70).filter(lambda s: not re.fullmatch(r"[0-9a-f]{64}", s))
    | HEX64.map(lambda h: h + "\n")
    | HEX64.map(lambda h: h.upper()).filter(lambda h: not h.isdigit())
)


@FEWER
@given(locks(), st.sampled_from(["sha256", "tree_digest"]), NOT_HEX64, st.booleans())
@example(_a_lock(), "sha256", "0" * 64 + "\n", False)  # read as valid before: $ matched before the newline
def test_a_hash_that_is_no_sha256_is_refused_naming_it(folder, doc, key, bad, in_patch):
    value = bad if key == "sha256" else "sha256:" + bad
    if in_patch and doc["patches"]:
        doc["patches"][0][key] = value
        what = f"patch {doc['patches'][0]['file']}: {key}"
    else:
        doc["baseline"][key] = value
        what = f"[baseline] {key}"
    refused(write(folder, doc), what, repr(value))


@FEWER
@given(locks(), st.sampled_from(["size", "files"]), st.integers(-(2**63), 0))
def test_a_size_or_file_count_below_one_is_refused(folder, doc, key, value):
    doc["baseline"][key] = value
    refused(write(folder, doc), "[baseline] size and files must be positive", str(value))


@FEWER
@given(locks(), st.sampled_from(["project", "version", "top_dir", "archive"]), st.text(max_size=20))
def test_names_that_do_not_agree_are_refused_with_expected_and_actual(folder, doc, key, value):
    b = doc["baseline"]
    b[key] = value
    name, dash, version = b["top_dir"].rpartition("-")
    agree = dash and normalized(name) == normalized(b["project"]) and version == b["version"]
    assume(not agree or b["archive"] != b["top_dir"] + ".tar.gz")
    field = "[baseline] top_dir" if not agree else "[baseline] archive"
    actual = b["top_dir"] if not agree else b["archive"]
    refused(write(folder, doc), f"{field} mismatch", f"actual:   {actual}")


@FEWER
@given(
    locks(),
    st.sampled_from(["cuda", "clang", "torch"]),
    st.text(st.characters(codec="utf-8"), max_size=8) | st.text("0123456789.", max_size=6),  # near misses too
)
@example(_a_lock(), "clang", "٢٢")  # Arabic-Indic digits: \d took them before
@example(_a_lock(), "cuda", "12.")
@example(_a_lock(), "torch", "2..10")
def test_a_toolchain_release_out_of_its_pattern_is_refused(folder, doc, key, value):
    pattern = {"cuda": r"[0-9]+\.[0-9]+", "clang": r"[0-9]+", "torch": r"[0-9]+(\.[0-9]+)*"}[key]
    assume(not re.fullmatch(pattern, value))
    doc["toolchain"][key] = value
    refused(write(folder, doc), "[toolchain]", key, repr(value))


@FEWER
@given(locks(), st.text(st.characters(codec="utf-8"), max_size=30), st.booleans())
def test_a_pin_that_is_no_name_and_version_is_refused(folder, doc, pin, fatbinary):
    assume(not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][0-9A-Za-z.+-]*", pin))
    if fatbinary:
        doc["toolchain"]["fatbinary_wheel"] = pin
    else:
        doc["toolchain"]["wheels"].append(pin)
    refused(write(folder, doc), f"[toolchain] {pin!r} is not NAME==VERSION")


@FEWER
@given(locks(), st.from_regex(r"[0-9]{1,2}\.[0-9]{1,3}", fullmatch=True))
def test_a_cuda_wheel_of_another_release_is_refused(folder, doc, version):
    cuda = doc["toolchain"]["cuda"]
    assume(not version.startswith(cuda + "."))
    pin = f"nvidia-cuda-nvcc-cu12=={version}"
    doc["toolchain"]["wheels"].append(pin)
    refused(write(folder, doc), f"CUDA release of {pin}", f"expected: {cuda}.x", f"actual:   {version}")


@FEWER
@given(locks(), TOML_VALUE)
@example(_a_lock(), 3)  # a TypeError before
@example(_a_lock(), {"file": "0001-a.patch"})  # an AttributeError before
def test_patches_that_are_no_array_of_tables_are_refused(folder, doc, value):
    assume(not (isinstance(value, list) and all(isinstance(v, dict) for v in value)))
    doc["patches"] = value
    path = write(folder, doc)
    refused(path, "patches must be an array of tables", repr(tomllib.loads(path.read_text())["patches"]))


@FEWER
@given(locks(), st.sampled_from(sorted(PatchEntry.__dataclass_fields__)), TOML_VALUE)
def test_a_patch_field_of_another_type_is_refused(folder, doc, key, value):
    assume(doc["patches"] and not isinstance(value, str))
    doc["patches"][-1][key] = value
    path = write(folder, doc)
    n = len(doc["patches"])
    refused(path, f"patch #{n}: {key} must be str, got {tomllib.loads(path.read_text())['patches'][-1][key]!r}")


PATCH_NAMES = st.text(st.characters(codec="utf-8"), max_size=40) | st.builds(
    "{:04d}-{}.patch".format, st.integers(0, 9999), st.from_regex(r"[a-z0-9][a-z0-9-]{0,8}", fullmatch=True)
)  # any text, and well-formed names of any number


@FEWER
@given(locks(), PATCH_NAMES)
def test_a_patch_out_of_order_or_misnamed_is_refused(folder, doc, name):
    assume(doc["patches"])
    n = len(doc["patches"])
    m = re.fullmatch(r"([0-9]{4})-[a-z0-9][a-z0-9-]*\.patch", name)
    assume(not m or int(m.group(1)) != n)
    doc["patches"][-1]["file"] = name
    refused(write(folder, doc), f"patch #{n} file name must be {n:04d}-<slug>.patch, got {name!r}")


@FEWER
@given(locks(), st.data())
def test_garbled_text_is_read_or_refused_never_a_traceback(folder, doc, data):
    """Cut, or with a few bytes inserted (possibly not UTF-8): a Lock or CheckFailed naming the file."""
    raw = tomlkit.dumps(doc).encode()
    at = data.draw(st.integers(0, len(raw)))
    junk = data.draw(st.binary(max_size=4) | st.sampled_from([b"[", b'"', b"=", b"\xff", b"[[patches]]\n"]))
    path = folder / "baseline.lock"
    path.write_bytes(raw[:at] if data.draw(st.booleans()) else raw[:at] + junk + raw[at:])
    try:
        Lock.load(path)
        message = None
    except CheckFailed as exc:
        message = str(exc)
    assert message is None or str(path) in message, message


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda t: t.replace("format = 2\n", "format = 2\npatches = 3\n"), ["patches must be an array of tables"]),
        (  # [toolchain] is the mini lock's last table
            lambda t: t[: t.index("[toolchain]")].replace("format = 2\n", "format = 2\ntoolchain = 5\n"),
            ["[toolchain] must be a table, got 5"],
        ),
    ],
    ids=["patches-number", "toolchain-number"],
)
def test_check_refuses_a_malformed_lock_without_a_traceback(mini, edit, words):
    """Both were tracebacks before (TypeError)."""
    lock = mini.root / "baseline.lock"
    lock.write_text(edit(lock.read_text()))
    proc = mini.run("check", check_rc=1)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert str(lock) in proc.stderr and all(w in proc.stderr for w in words), proc.stderr
