# SPDX-License-Identifier: BSD-3-Clause
"""The decode kernel's launches on the model (fa2patch.model.decode_route), by hand."""

from dataclasses import replace

from fa2patch.common.shapes import Shape
from fa2patch.model import decode_route
from fa2patch.model.exact_route import decode_splits
from fa2patch.model.loop_mix import LoopMix
from fa2patch.model.report import decode_launches


def kernel(blocks_per_sm: int) -> dict:
    mix = vars(LoopMix(instructions=100, fp32=50))
    return {
        "kernel": "decode_sm70_kernel<256, 6>",
        "occupancy": {"blocks_per_sm": blocks_per_sm},
        "decode": {"loop": {"model_mix": mix}, "outside": {"model_mix": mix}},
    }


def test_names_and_inner_loop_trips():
    assert decode_route.instantiation("void fa2patch::sm70::decode::decode_sm70_kernel<128, 4>(p)") == (128, 4)
    assert decode_route.instantiation("flash_fwd_sm70_kernel<128>") is None
    # head dim 256: 32 chunks of a K row, 16 in flight -> 2 trips; one key per V load, 16 in flight -> 2
    assert decode_route.trips(256, 6) == decode_route.trips(256, 8) == (2, 2)
    # head dim 128: 16 chunks, two keys per V load (16 loads): one trip each up to 4 rows; from 6 rows
    # 8 in flight (16 spill), two trips
    assert decode_route.trips(128, 4) == (1, 1)
    assert decode_route.trips(128, 6) == (2, 2)
    assert decode_route.trips(64, 1) == decode_route.trips(64, 8) == (1, 1)  # 8 chunks, 8 V loads


def test_split_fills_one_wave_of_slots():
    """The decode kernel's split is routing's one-wave rule over its CTAs and 128-key blocks."""
    keys = decode_route.SPLIT_KEYS
    assert keys == 128  # one iteration of its 4 warps of 32 keys
    assert decode_splits(1, 131072, keys, 144) == 128  # 144 slots, at most 128 splits
    assert decode_splits(1, 131072, keys, 100) == 100
    assert decode_splits(1, 1000, keys, 144) == 8  # one split per 128 keys
    assert decode_splits(64 * 8, 4096, keys, 216) == 1  # 512 CTAs fill the slots already


def test_launch_covers_every_key_once():
    shape = Shape(1, 1000, 6, 1, 256, True, 0.0625, b=2)
    fwd, plan = decode_route.launch(shape, kernel(2), 10)
    kv = 2 * 2 * 1000 * 256 * 2
    # ceil(1000 / 10) = 100 keys -> at least 128: splits 0-6 of 128 keys, the 8th 104, the 9th and
    # 10th none (a call split for a longer length, as a captured graph replays a shorter sequence):
    # 8 splits write their O, all 10 their LSE; the combine reads those and writes O
    partials = 2 * 6 * (8 * 256 * 4 + 10 * 4)
    q = 2 * 6 * 256 * 2
    assert plan == {"splits": 10, "keys_per_split": 128, "rows": 6, "row_blocks": 1, "combine_bytes": partials + q}
    assert fwd.iterations == (1,) * 16 + (0,) * 4
    assert fwd.streams and not fwd.fused and fwd.warps_per_cta == 4 and fwd.ctas_per_sm == 2
    assert fwd.hbm_bytes == 2 * q + 2 * 6 * 4 + kv + partials
    # a long sequence: ceil(100000 / 10) = 10,000 keys, a multiple of 16; 79 iterations of 128 keys
    _, long_plan = decode_route.launch(Shape(1, 100000, 6, 1, 256, True, 0.0625), kernel(2), 10)
    assert long_plan["keys_per_split"] == 10000
    alone, plan = decode_route.launch(Shape(1, 1000, 6, 1, 256, True, 0.0625, b=64), kernel(1), 1)
    assert plan["splits"] == 1 and plan["combine_bytes"] == 0 and alone.iterations == (8,) * 64


def test_groups_past_one_cta_run_as_row_blocks():
    """9 to 16 rows per KV head: two CTAs per (sequence, KV head, split), rows split as evenly as
    whole CTAs allow, each streaming the K/V (no L2 credit); more than 16: no decode kernel."""
    assert [decode_route.row_blocks(r) for r in (1, 8, 9, 12, 16)] == [(1, 1), (1, 8), (2, 5), (2, 6), (2, 8)]
    rows = [{"kernel": f"decode_sm70_kernel<128, {r}>", "decode": {}} for r in (1, 2, 4, 6, 8)]
    twelve = Shape(1, 4096, 24, 2, 128, True, 0.09)
    assert decode_route.kernel_for(twelve, rows)["kernel"] == "decode_sm70_kernel<128, 6>"
    assert decode_route.kernel_for(Shape(1, 4096, 34, 2, 128, True, 0.09), rows) is None  # 17 rows
    # 2 sequences x 2 KV heads x 2 row blocks = 8 CTAs; 72 SMs x 2 slots -> 18 splits
    assert decode_route.ctas(replace(twelve, b=2)) == 8
    (fwd, _), plan = decode_launches(replace(twelve, b=2), kernel(2), 72)
    assert plan["splits"] == 18
    assert plan["row_blocks"] == 2 and len(fwd.iterations) == 18 * 8
    partials = 18 * 2 * 24 * (128 * 4 + 4)
    q = 2 * 24 * 128 * 2
    assert fwd.hbm_bytes == 2 * q + 2 * 24 * 4 + 2 * (2 * 2 * 4096 * 2 * 128 * 2) + partials


def test_calls_fa2_does_not_swap_run_unsplit():
    """One query row per sequence with as many query heads as KV heads: FA2's swap does not run, nor
    its split (patch 0004's decode_splits is reached through the swap only): one CTA per sequence
    and head, no combine."""
    mha = Shape(1, 131072, 8, 8, 128, True, 0.09)
    launches, plan = decode_launches(mha, kernel(3), 80)
    assert plan["splits"] == 1 and len(launches) == 1 and len(launches[0].iterations) == 8
    assert decode_launches(replace(mha, hkv=1), kernel(3), 80)[1]["splits"] == 128
