# SPDX-License-Identifier: BSD-3-Clause
"""The long-prefill route, ``_vllm_fa2_C.gqa_prefill_fwd`` (patch 0003), against the numerics
contract (DESIGN.md section 7): FA2's bar, relative L2 <= 1e-3 against FP32, finite, softmax_lse
within 1e-3, bitwise determinism where asked; and typed errors for what it does not support.

Each case runs ``prefill_cases.py`` in its own subprocess (sm70_cases.py's inputs, reference and
checks). Unless a case says otherwise, the op gets a preallocated workspace filled with NaN, so a
read of anything the kernels did not write shows. Cases marked ``slow`` run with FA2PATCH_SLOW=1.
Select this file's cases with ``-k long_prefill``.
"""

from pathlib import Path

import pytest

import test_sm70_numerics
from test_sm70_numerics import Case, _params, check_bad_input, check_numerics

# test_sm70_numerics' fixtures, used here by name.
runner = test_sm70_numerics.runner
sm70_build_info = test_sm70_numerics.sm70_build_info

SCRIPT = Path(__file__).with_name("prefill_cases.py")
CASES: list[Case] = []
BAD: list[Case] = []


def case(name, seqlens, slow=False, family="long_prefill", **spec):
    spec.setdefault("seed", 3000 + len(CASES))
    CASES.append(Case(family, name, {"seqlens": [seqlens], **spec}, slow, script=SCRIPT))


# Group sizes 1..16 (hkv = 1 and 2), one and several KV blocks (a block holds up to 8192 keys).
for g in (1, 4, 6, 8, 16):
    case(f"g{g}-q300-kv1000", (300, 1000), hq=g, hkv=1)
case("hq8-hkv2-q200-kv700", (200, 700), hq=8, hkv=2)
case("hq12-hkv2-q513-kv20000", (513, 20000), hq=12, hkv=2)
case("g16-q64-kv17000", (64, 17000), hq=16, hkv=1)
case("g6-q1024-kv40000", (1024, 40000))
# Lengths that are multiples of nothing, Q = KV, Q = 1, and KV < Q (rows without keys) or 0.
case("q1000-kv4097", (1000, 4097))
case("q129-kv129", (129, 129), hq=4, hkv=1)
case("q1-kv1", (1, 1))
case("q1-kv300", (1, 300), hq=16, hkv=1)
case("q77-kv9000", (77, 9000))
case("q300-kv100-rows-without-keys", (300, 100), hq=4, hkv=2)
case("q50-kv0", (50, 0))
# Paged KV (block_table + seqlen_k): page sizes 16, 48, 256; vLLM's cache views (row stride 2 d);
# NaN in every cache slot the sequence does not use.
case("paged16-q700-kv9000", (700, 9000), page_size=16)
case("paged48-q300-kv2000", (300, 2000), page_size=48, hq=8, hkv=2)
case("paged256-q1000-kv10000", (1000, 10000), page_size=256)
case("paged16-vllm-cache-q500-kv9001", (500, 9001), page_size=16, vllm_cache=True, hq=8, hkv=2)
case("paged32-poison-q300-kv1111", (300, 1111), page_size=32, poison=True)
case("contig-poison-q300-kv1111", (300, 1111), poison=True)
case("strided-q-kv", (400, 3000), strided=True, hq=8, hkv=2)
# Softmax scales: any finite value.
case("scale1-q300-kv2000", (300, 2000), scale=1.0)
case("scale-negative-q300-kv2000", (300, 2000), scale=-0.05)
case("scale0-q300-kv2000", (300, 2000), scale=0.0)
# Adversarial magnitudes: scores ~100; rows dominated by one key (key 0, or the diagonal).
case("scores100-q500-kv12000", (500, 12000), magnitude=10.0, ref_dtype="float64")
case("scores100-paged16-q300-kv3000", (300, 3000), magnitude=10.0, page_size=16, ref_dtype="float64")
case("dominated-first-q500-kv10000", (500, 10000), dominated="first", ref_dtype="float64")
case("dominated-diagonal-q500-kv10000", (500, 10000), dominated="diagonal", ref_dtype="float64")
case("dominated-first-g16-q256-kv9000", (256, 9000), hq=16, hkv=1, dominated="first", ref_dtype="float64")
# The op allocating its own workspace.
case("own-workspace-q1000-kv20000", (1000, 20000), workspace=None)
# Determinism: bitwise identical out and softmax_lse over repeated calls (several blocks, paged).
case("determinism-q1000-kv20000", (1000, 20000), repeats=5)
case("determinism-paged16-q800-kv17000", (800, 17000), page_size=16, repeats=5)

# The reference workload (DESIGN.md section 4): Q = 8000, KV = 40,000 .. 128,000 step 8,000, 6/1,
# scale 1/16; paged at the endpoints; Q = 16,384 and KV = 256K.
for kv in range(40000, 128001, 8000):
    case(f"q8000-kv{kv}-contig", (8000, kv), slow=kv >= 88000, family="long_prefill_workload")
for kv in (40000, 128000):
    case(f"q8000-kv{kv}-paged16", (8000, kv), page_size=16, slow=kv > 40000, family="long_prefill_workload")
case(
    "q8000-kv128000-vllm-cache-p16",
    (8000, 128000),
    page_size=16,
    vllm_cache=True,
    slow=True,
    family="long_prefill_workload",
)
case("q1024-kv262144", (1024, 262144), slow=True, family="long_prefill_workload")
case("q1024-kv262144-paged16", (1024, 262144), page_size=16, slow=True, family="long_prefill_workload")
case("q16384-kv32768-g16", (16384, 32768), hq=16, hkv=1, slow=True, family="long_prefill_workload")
case("q16384-kv65536-hq8-hkv2", (16384, 65536), hq=8, hkv=2, slow=True, family="long_prefill_workload")


def bad(name, expect, seqlens=(100, 300), sanitize=False, **spec):
    BAD.append(
        Case(
            "long_prefill_bad",
            name,
            {"seqlens": [list(seqlens)], "expect_error": True, "seed": 4000 + len(BAD), **spec},
            expect={"out_untouched": True, **expect},
            script=SCRIPT,
            sanitize=sanitize,
        )
    )


bad("head-dim-128", {"message": "head dim"}, d=128)
bad("bf16", {"message": "float16"}, dtype="bfloat16")
# workspace=None: the op itself must refuse (the workspace size op refuses these too).
bad("hq6-hkv4", {"message": "multiple"}, hq=6, hkv=4, workspace=None)
bad("group-17", {"message": "16"}, hq=17, hkv=1, workspace=None)
bad("seqlen-k-beyond-k", {"message": "seqlen_k"}, seqlen_k_extra=1)
bad("seqlen-k-beyond-block-table", {"message": "pages"}, page_size=16, seqlen_k_extra=16)
bad("block-table-minus1", {"message": "block_table"}, page_size=16, bad_block_table=[0, 3, -1], sanitize=True)
bad("block-table-num-blocks", {"message": "block_table"}, page_size=16, bad_block_table=[0, 0, "num_blocks"])
bad("page-size-8", {"message": "multiple of 16"}, page_size=8)
bad("workspace-one-byte-short", {"message": "workspace"}, workspace="short")
bad("scale-nan", {"message": "finite"}, scale=float("nan"))
bad("misaligned-q", {"message": "aligned"}, misaligned="q")


@pytest.mark.parametrize("c", _params(CASES))
def test_long_prefill_numerics(c: Case, runner, numerics_summary):
    check_numerics(c, runner.result(c), numerics_summary)


@pytest.mark.parametrize("c", _params(BAD))
def test_long_prefill_bad_input_is_a_typed_error(c: Case, runner, numerics_summary):
    check_bad_input(c, runner.result(c), numerics_summary)
