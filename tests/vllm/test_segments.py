# SPDX-License-Identifier: BSD-3-Clause
"""The per-request split of a scheduler batch (packaging/fa2patch_vllm/segments.py), from host
values: every long prefill chunk alone, the runs of other requests between them together, nothing
split where no chunk qualifies. Expected segments written down by hand."""

import sys

import pytest

from helpers import REPO

sys.path.insert(0, str(REPO / "packaging"))
from fa2patch_vllm import segments as sg

LIMITS = sg.Thresholds(min_seqlen_q=1024, min_seqlen_k=16384)


def offsets(rows):
    out = [0]
    for r in rows:
        out.append(out[-1] + r)
    return out


def shape(plan):
    return [
        (s.kind, s.first_request, s.last_request, s.first_token, s.last_token, s.max_seqlen_q, s.max_seqlen_k)
        for s in plan
    ]


def test_decodes_and_one_long_chunk():
    rows = [1] * 32 + [4096]
    keys = [4096 + 1000 * i for i in range(32)] + [65536]
    plan = sg.plan(offsets(rows), keys, LIMITS)
    assert shape(plan) == [("exact", 0, 32, 0, 32, 1, 35096), ("long_prefill", 32, 33, 32, 4128, 4096, 65536)]
    assert sg.worth_splitting(plan)


def test_several_long_chunks_each_alone_and_the_rows_between_together():
    rows = [1, 1, 4096, 2048, 300, 1, 1024]
    keys = [5000, 7000, 20000, 65536, 900, 10, 16384]
    plan = sg.plan(offsets(rows), keys, LIMITS)
    assert shape(plan) == [
        ("exact", 0, 2, 0, 2, 1, 7000),
        ("long_prefill", 2, 3, 2, 4098, 4096, 20000),
        ("long_prefill", 3, 4, 4098, 6146, 2048, 65536),
        ("exact", 4, 6, 6146, 6447, 300, 900),
        ("long_prefill", 6, 7, 6447, 7471, 1024, 16384),
    ]


@pytest.mark.parametrize(
    "rows, keys",
    [
        ([1] * 8, [40000] * 8),  # decodes only: vLLM's full CUDA graphs
        ([1, 1023], [9, 40000]),  # a chunk below the query threshold
        ([1, 4096], [9, 16383]),  # a chunk below the key threshold
        ([4096], [65536]),  # one chunk alone: already one call
    ],
)
def test_nothing_to_gain_nothing_split(rows, keys):
    plan = sg.plan(offsets(rows), keys, LIMITS)
    assert not sg.worth_splitting(plan)


def test_inconsistent_host_values_are_refused():
    with pytest.raises(ValueError, match="query_start has 3 offsets for 1 requests"):
        sg.plan([0, 1, 2], [5], LIMITS)
    with pytest.raises(ValueError, match="request 0: 10 query rows and 9 keys"):
        sg.plan([0, 10], [9], LIMITS)
