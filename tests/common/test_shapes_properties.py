# SPDX-License-Identifier: BSD-3-Clause
"""`--shapes` specs (common/shapes.py's parse_shapes), property-based: every spec written from the
syntax is read as the shapes it names (sweeps expanded here by their definition, a..b inclusive by
step), and every spec broken in one place is refused with an EnvironmentProblem naming the key and
the value, never another exception. `report --shapes` says so on the command line, exit 2."""

import math
import os
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import assume, example, given, strategies as st

from fa2patch.common.errors import EnvironmentProblem
from fa2patch.common.shapes import Shape, parse_shapes
from helpers import REPO

POSITIVE = ("q", "kv", "hq", "hkv", "d", "b")
KEYS = (*POSITIVE, "causal", "scale", "decode", "dkv", "page")


def sweep_text(start: int, count: int, step: int) -> tuple[str, list[int]]:
    """A value naming ``count`` integers from ``start`` by ``step``, and those integers."""
    values = [start + k * step for k in range(count)]
    return (str(start) if count == 1 else f"{start}:{values[-1] + (step - 1) // 2}:{step}"), values


@st.composite
def groups(draw) -> tuple[dict[str, str], list[Shape]]:
    """One valid group: {key: value text} and the shapes it names."""
    text, values = {}, {}

    def sweep(key, start, step=1, max_count=3):
        s = draw(st.integers(*start)) * step
        count = draw(st.integers(1, max_count))
        text[key], values[key] = sweep_text(s, count, step * draw(st.integers(1, 3)))

    hkv = draw(st.integers(1, 8))
    text["hkv"], values["hkv"] = str(hkv), [hkv]
    sweep("hq", (1, 4), hkv)  # multiples of hkv: every pair is a valid GQA group
    decode = draw(st.booleans())
    sweep("q", (2 if decode else 1, 4096))
    sweep("kv", (1, 1 << 17))
    sweep("d", (1, 256), max_count=2)
    if draw(st.booleans()):
        sweep("b", (1, 64), max_count=2)
    if decode:
        sweep("decode", (0, 8), max_count=2)
        if draw(st.booleans()):
            sweep("dkv", (0, 1 << 16), max_count=2)
    if draw(st.booleans()):
        sweep("page", (0, 4), 16, max_count=2)
    causal = draw(st.sampled_from([None, "0", "1"]))
    if causal is not None:
        text["causal"] = causal
    scale = draw(st.none() | st.floats(min_value=1e-6, max_value=1e3))
    if scale is not None:
        text["scale"] = repr(scale)
    shapes = [
        Shape(
            q=q,
            kv=kv,
            hq=hq,
            hkv=hkv,
            d=d,
            causal=causal != "0",
            scale=scale if scale is not None else d**-0.5,
            b=b,
            decode=dec,
            decode_kv=dkv if dec else 0,
            page=page,
        )
        for q in values["q"]
        for kv in values["kv"]
        for hq in values["hq"]
        for hkv in values["hkv"]
        for d in values["d"]
        for b in values.get("b", [1])
        for dec in values.get("decode", [0])
        for dkv in values.get("dkv", [0])
        for page in values.get("page", [0])
    ]
    return text, shapes


@st.composite
def spec_text(draw, fields: dict[str, str]) -> str:
    """The group written in any key order, with spaces around its items."""
    order = draw(st.permutations(list(fields)))
    space = st.sampled_from(["", " ", "  "])
    return ",".join(f"{draw(space)}{k}={fields[k]}{draw(space)}" for k in order)


@given(st.lists(groups(), min_size=1, max_size=3), st.data())
def test_a_spec_is_read_as_the_shapes_it_names(specs, data):
    separators = st.sampled_from([";", " ; ", ";;", "; ;"])
    text = ""
    for i, (fields, _) in enumerate(specs):
        text += (data.draw(separators) if i else "") + data.draw(spec_text(fields))
    expected = [s for _, shapes in specs for s in shapes]
    assert Counter(parse_shapes(text)) == Counter(expected)


def refused(text: str) -> str:
    with pytest.raises(EnvironmentProblem) as exc:
        parse_shapes(text)
    message = str(exc.value)
    assert message.startswith("--shapes: "), message
    return message


def one_group(fields: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in fields.items())


@given(groups(), st.sampled_from(POSITIVE))
def test_a_count_of_zero_is_refused_naming_the_key(group, key):
    fields = {**group[0], key: "0"}
    message = refused(one_group(fields))
    assert f"{key}: expected an integer >= 1, got '0'" in message, message


# Text that is no value: no separator of the syntax (',', ';', '='), no surrounding space (items are
# stripped), not N or START:END:STEP.
garbage = st.text(st.characters(codec="utf-8", exclude_characters=",;="), min_size=1, max_size=12).filter(
    lambda v: v == v.strip() and not all(c in "0123456789:" for c in v)
)


@given(groups(), st.sampled_from(KEYS), garbage)
@example(({"q": "1", "kv": "1", "hq": "1", "hkv": "1", "d": "1"}, []), "scale", "nan")
@example(({"q": "1", "kv": "1", "hq": "1", "hkv": "1", "d": "1"}, []), "scale", "-0.5")
@example(({"q": "1", "kv": "1", "hq": "1", "hkv": "1", "d": "1"}, []), "scale", "0")
@example(({"q": "1", "kv": "1", "hq": "1", "hkv": "1", "d": "1"}, []), "causal", "2")
@example(({"q": "1", "kv": "1", "hq": "1", "hkv": "1", "d": "1"}, []), "q", "\u0661")  # an Arabic-Indic 1: \d took it
def test_a_value_that_is_no_value_is_refused_naming_the_key_and_the_value(group, key, value):
    if key == "scale":  # Python's float() is the definition of a number here
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        assume(not (math.isfinite(number) and number > 0))
    message = refused(one_group({**group[0], key: value}))
    assert key in message and repr(value) in message, message


@given(groups(), st.sampled_from(KEYS))
def test_a_key_given_twice_is_refused(group, key):
    fields = {**group[0], key: group[0].get(key, "1")}
    text = one_group(fields) + f",{key}={fields[key]}"  # the same value again
    message = refused(text)
    assert f"{key} given twice" in message, message


@given(groups(), st.sampled_from(("q", "kv", "hq", "hkv", "d")))
def test_a_missing_key_is_refused_naming_it(group, key):
    fields = {k: v for k, v in group[0].items() if k != key}
    message = refused(one_group(fields))
    assert f"lacks {key}" in message, message


@given(groups(), st.from_regex(r"[a-z_]{1,8}", fullmatch=True).filter(lambda k: k not in KEYS))
def test_an_unknown_key_is_refused_naming_the_item(group, key):
    message = refused(one_group(group[0]) + f",{key}=1")
    assert f"'{key}=1'" in message and "expected key=value with key in" in message, message


@given(st.integers(1, 64), st.integers(2, 8))
def test_heads_that_make_no_group_are_refused(hq, hkv):
    assume(hq % hkv)
    message = refused(f"q=1,kv=1,hq={hq},hkv={hkv},d=64")
    assert f"hq={hq} is not a multiple of hkv={hkv}" in message, message


@given(st.integers(1, 4096).filter(lambda p: p % 16))
def test_a_page_of_no_multiple_of_16_is_refused(page):
    assert f"page={page} is not a multiple of 16" in refused(f"q=8,kv=64,hq=1,hkv=1,d=64,page={page}")


@given(st.integers(1, 8))
def test_decode_rows_without_a_prefill_chunk_are_refused(decode):
    message = refused(f"q=1,kv=64,hq=1,hkv=1,d=64,decode={decode}")
    assert f"decode={decode}" in message and "q must be >= 2, got q=1" in message, message


@given(st.integers(1, 100), st.integers(1, 99), st.booleans())
def test_a_sweep_backwards_or_by_zero_is_refused(start, length, backwards):
    value = f"{start + length}:{start}:1" if backwards else f"{start}:{start + length}:0"
    message = refused(f"q={value},kv=1,hq=1,hkv=1,d=64")
    assert f"q={value!r}" in message, message


# Any text made of the syntax's pieces: read, then every shape holds the rules; or refused, typed.
pieces = st.sampled_from(
    [*KEYS, "x", "=", ",", ";", ":", " ", "0", "1", "2", "16", "64", "-1", "1.5", "nan", "1:3:1", "3:1:1", "1:2:0"]
)


@given(st.lists(pieces, max_size=40).map("".join))
@example("q=1,kv=1,hq=1,hkv=1,d=1")
@example("q=1,kv=1,hq=1,hkv=0,d=1")
def test_any_text_is_read_within_the_rules_or_refused_typed(text):
    try:
        shapes, message = parse_shapes(text), None
    except EnvironmentProblem as exc:
        shapes, message = [], str(exc)
    assert message is None or message.startswith("--shapes: "), message
    for s in shapes:
        assert min(s.q, s.kv, s.hq, s.hkv, s.d, s.b) >= 1 and s.hq % s.hkv == 0 and s.page % 16 == 0
        assert math.isfinite(s.scale) and s.scale > 0 and (s.decode == 0 or s.q >= 2)


@pytest.mark.parametrize(
    "spec, words",
    [
        ("q=1,kv=64,hq=1,hkv=0,d=64", ["hkv: expected an integer >= 1, got '0'"]),
        ("q=1,kv=64,hq=1,hkv=1,d=64,scale=abc", ["scale: expected a positive finite number, got 'abc'"]),
    ],
    ids=["hkv-zero", "scale-text"],
)
def test_report_refuses_a_bad_spec_without_a_traceback(spec, words):
    """Both were tracebacks before (ZeroDivisionError, ValueError); now exit 2 and the message."""
    proc = subprocess.run(
        [sys.executable, "-m", "fa2patch", "report", "--shapes", spec],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "FA2PATCH_ROOT": str(REPO)},
    )
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert all(w in proc.stderr for w in words), proc.stderr
