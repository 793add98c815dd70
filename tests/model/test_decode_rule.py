# SPDX-License-Identifier: BSD-3-Clause
"""Patch 0004's built-in rule for the decode kernel (fa2patch.model.decode_route.rule_takes, the mirror
of routing::decode_kernel_rule): its classes by hand, and every bound against the model it was read
from -- at its bound each class's decode shapes are separated ahead of the exact route on 72 and 80
SMs (test_real_series checks that the mirror says what routing.cpp says)."""

import pytest
from tests.model.test_report_sass import real_rows

from fa2patch.common.routes import DECODE, EXACT
from fa2patch.common.shapes import Shape
from fa2patch.model import decode_route

MIB = 1 << 20


def decode_shape(rows: int, d: int, b: int, hkv: int, kv: int, q: int = 1) -> Shape:
    return Shape(q, kv, rows * hkv, hkv, d, True, d**-0.5, b=b)


def test_rule_classes_by_hand():
    assert decode_route.rule_bound(1, 64) == 64 * MIB
    assert decode_route.rule_bound(3, 128) == decode_route.rule_bound(4, 128) == 32 * MIB  # the <128, 4> kernel
    assert decode_route.rule_bound(5, 64) == 16 * MIB  # rows 5: the 6-row class
    assert decode_route.rule_bound(7, 256) == 16 * MIB
    assert decode_route.rule_bound(9, 128) is None  # row blocks: never by the rule
    assert decode_route.rule_bound(4, 96) is None  # no decode kernel at head dim 96
    # 6/1 x 256 at 32,768 keys: 32 MiB of K/V, the bound of its class
    assert decode_route.rule_takes(decode_shape(6, 256, 1, 1, 32768), 72)
    assert not decode_route.rule_takes(decode_shape(6, 256, 1, 1, 32769), 72)
    assert not decode_route.rule_takes(decode_shape(6, 256, 1, 1, 300, q=2), 72)  # speculative rows
    assert not decode_route.rule_takes(Shape(1, 300, 6, 1, 256, True, 0.06, decode=2, decode_kv=300), 72)


def test_rule_under_graph_capture_takes_every_length():
    """Captured (vLLM's decode graphs at max_model_len), the rule cannot see the replays' lengths: the
    decode kernel takes every call of a class the rule knows, at any length; the rest stay exact."""
    assert decode_route.rule_takes(decode_shape(6, 256, 1, 1, 262144), 72, capturing=True)
    assert decode_route.rule_takes(decode_shape(4, 128, 64, 8, 131072), 72, capturing=True)
    assert not decode_route.rule_takes(decode_shape(6, 256, 1, 1, 262144), 72)
    assert not decode_route.rule_takes(decode_shape(12, 128, 1, 1, 1024), 72, capturing=True)  # row blocks
    assert not decode_route.rule_takes(decode_shape(6, 96, 1, 1, 1024), 72, capturing=True)  # no kernel
    assert not decode_route.rule_takes(decode_shape(6, 256, 1, 1, 300, q=2), 72, capturing=True)


def test_rule_bound_is_per_wave_of_the_exact_route():
    """batch x KV heads CTAs over the exact route's slots: twice the bytes in two waves is in the rule."""
    shape = decode_shape(4, 128, 16, 8, 8192)  # 128 CTAs, 512 MiB
    assert decode_route.rule_takes(shape, 8)  # 16 waves: 32 MiB a wave
    assert not decode_route.rule_takes(shape, 64)  # 2 waves: 256 MiB a wave
    assert not decode_route.rule_takes(decode_shape(4, 128, 16, 8, 8193), 8)


# (sequences, KV heads): one sequence, a few, many KV heads, more CTAs than one wave of 72 SMs.
FACTORS = [(1, 1), (4, 1), (1, 8), (16, 8)]


@pytest.fixture(scope="module")
def model(built_sm70):
    """The shipped build's report rows, the V100 card data and the calibration: (artifact, rows, v100, cal)."""
    from fa2patch.model.calibration import calibrate
    from fa2patch.model.v100model import load_v100

    artifact = built_sm70 / "_vllm_fa2_C.abi3.so"
    v100 = load_v100()
    return artifact, real_rows(artifact), v100, calibrate(v100)


@pytest.mark.parametrize("sms", [72, 80])
def test_rule_bounds_are_separated_on_the_model(model, sms):
    """Each instantiation's class at its bound (the largest K/V it admits, for several batch x KV
    head splits): the decode kernel's calibrated range lies wholly below the exact route's."""
    from fa2patch.model.ranges import versus
    from fa2patch.model.report import dense_kernel, predict, predict_decode
    from fa2patch.model.v100model import Card

    artifact, rows, v100, cal = model
    card = Card(sms, 1530)
    checked = []
    for top in (1, 2, 4, 6, 8):  # the kernel's instantiations; 3, 5 and 7 rows run those of 4, 6 and 8
        for d in decode_route.RULE_DIMS:
            for b, hkv in FACTORS:
                probe = decode_shape(top, d, b, hkv, 1)
                slots = sms * dense_kernel(probe, rows, artifact)["occupancy"]["blocks_per_sm"]
                waves = -(-(b * hkv) // slots)
                kv = decode_route.rule_bound(top, d) * waves // (b * hkv * d * 4)
                shape = decode_shape(top, d, b, hkv, kv)
                assert decode_route.rule_takes(shape, slots), shape.label
                assert not decode_route.rule_takes(decode_shape(top, d, b, hkv, kv + 1), slots), shape.label
                exact = predict(shape, rows, card, v100, cal, artifact)
                decode = predict_decode(shape, rows, card, v100, cal)
                assert (exact["route"], decode["route"]) == (EXACT, DECODE)
                assert decode["calibrated_ms_high"] < exact["calibrated_ms_low"], shape.label
                assert versus(decode, exact, "vs")["vs_verdict"] == "faster", shape.label
                checked.append(decode_route.rule_bound(top, d))
    assert len(checked) == 5 * len(decode_route.RULE_DIMS) * len(FACTORS) and None not in checked


def test_report_marks_the_rules_choice(model):
    """report's decode rows say whether the built-in rule takes the call (JSON builtin_rule, text
    "(rule)"): 32/8 x 128 at 2,048 keys (32 MiB, one wave) is taken, at 131,072 keys it is not."""
    from fa2patch.model.report import predict_routes
    from fa2patch.model.v100model import Card

    artifact, rows, v100, cal = model
    for kv, taken in ((2048, True), (131072, False)):
        preds = predict_routes(decode_shape(4, 128, 1, 8, kv), rows, Card(80, 1530), v100, cal, artifact)
        decode = next(p for p in preds if p["route"] == DECODE)
        assert decode["builtin_rule"] is taken
        assert all("builtin_rule" not in p for p in preds if p["route"] != DECODE)


@pytest.mark.parametrize("decode,dkv,kernel_route", [(4, 300, DECODE), (32, 131072, EXACT)])
def test_the_v100_backends_decode_rows_take_the_kernel_the_rule_gives_them(model, decode, dkv, kernel_route):
    """report's v100-backend row (a chunk batched with decode rows, split as the V100 backend runs
    it): the rows' one call runs where routing's rule sends it -- the decode kernel for 4 rows of
    6/1 x 256 over 300 keys (1.2 MB, inside the 32 MiB bound), the exact route for 32 rows over
    131,072 keys (4.3 GB in one wave of 72 SMs: beyond it). Its launches are the chunk's long-prefill
    launches followed by those of the rows' call alone on that kernel."""
    import gqa_oracle
    from fa2patch.common.routes import GQA
    from fa2patch.model import gqa_route
    from fa2patch.model.report import PER_REQUEST, predict_routes
    from fa2patch.model.v100model import Card

    artifact, rows, v100, cal = model
    card, scale = Card(72, 1530), 1 / 16
    chunk = Shape(4096, 65536, 6, 1, 256, True, scale)
    rows_call = Shape(1, dkv, 6, 1, 256, True, scale, b=decode)
    plans = {gqa_route.sizes(chunk): gqa_oracle.plan(4096, 65536, 6, 1)}

    def route(shape, name):
        return next(p for p in predict_routes(shape, rows, card, v100, cal, artifact, (), plans) if p["route"] == name)

    split = route(Shape(4096, 65536, 6, 1, 256, True, scale, decode=decode, decode_kv=dkv), PER_REQUEST)
    alone = route(rows_call, kernel_route)
    names = lambda p: [x["name"] for x in p["launches"]]  # noqa: E731
    assert names(split) == names(route(chunk, GQA)) + names(alone)
    assert split["plan"]["decodes"] == alone["plan"]
