# SPDX-License-Identifier: BSD-3-Clause
"""The cases ci/gpu-sanitize.sh runs under compute-sanitizer, one line each:
``family|harness|spec`` (harness relative to the repository, spec as JSON).

Small shapes of every SM70 kernel family, written here (the sanitizer slows kernels a hundredfold),
and the bad inputs of the GPU suite that it marks ``sanitize`` (test_sm70_numerics.BAD): a bad
input must be rejected before any SM70 kernel runs.

    python tests/gpu/sanitize_cases.py
"""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(HERE))

from test_long_prefill_gpu import BAD as PREFILL_BAD, SCRIPT as PREFILL  # noqa: E402 - after the sys.path set-up
from test_long_prefill_guard_gpu import CASES as GUARD_CASES, SCRIPT as GUARD  # noqa: E402 - after the sys.path set-up
from test_routing_gpu import BASE as ROUTING_BASE, CORRUPT, SCRIPT as ROUTING  # noqa: E402 - after the sys.path set-up
from test_sm70_numerics import BAD, KVCACHE_SCRIPT, SCRIPT  # noqa: E402 - after the sys.path set-up

VARLEN, KVCACHE = SCRIPT, KVCACHE_SCRIPT
FAMILIES = [
    ("gqa", VARLEN, {"seqlens": [[1, 1], [37, 90], [0, 5], [5, 0]], "hq": 4, "hkv": 2, "d": 64, "causal": True}),
    ("head_dims", VARLEN, {"seqlens": [[33, 70], [1, 1]], "hq": 2, "hkv": 1, "d": 32}),
    (
        "head_dims",
        VARLEN,
        {"seqlens": [[40, 45], [1, 17], [0, 10]], "hq": 4, "hkv": 2, "d": 32, "causal": True, "page_size": 16},
    ),
    (
        "split_kv",
        VARLEN,
        {"seqlens": [[1, 300], [1, 17]], "hq": 8, "hkv": 2, "d": 32, "page_size": 16, "num_splits": 4},
    ),
    (
        "split_kv",
        VARLEN,
        {"seqlens": [[1, 300], [1, 17]], "hq": 8, "hkv": 2, "d": 96, "page_size": 16, "num_splits": 4},
    ),
    ("head_dims", VARLEN, {"seqlens": [[33, 70], [1, 1]], "hq": 2, "hkv": 1, "d": 96, "causal": True}),
    ("head_dims", VARLEN, {"seqlens": [[33, 70], [1, 1]], "hq": 2, "hkv": 1, "d": 192, "causal": True}),
    ("window", VARLEN, {"seqlens": [[300, 700], [5, 400]], "hq": 2, "hkv": 1, "d": 64, "window": [150, 40]}),
    (
        "window",
        VARLEN,
        {"seqlens": [[1, 40], [3, 77]], "hq": 8, "hkv": 1, "d": 128, "page_size": 16, "window": [16, 0]},
    ),
    (
        "softcap_alibi",
        VARLEN,
        {"seqlens": [[70, 70]], "hq": 6, "hkv": 1, "d": 256, "causal": True, "softcap": 30.0, "alibi": True},
    ),
    (
        "split_kv",
        VARLEN,
        {"seqlens": [[1, 300], [1, 17], [1, 0]], "hq": 8, "hkv": 2, "d": 128, "page_size": 16, "num_splits": 4},
    ),
    # patch 0004: split-KV on prefill (partials in q's rows, the combine's sequence search): a chunk
    # with decode rows over a paged cache, empty splits, sequences without keys or queries.
    (
        "split_prefill",
        VARLEN,
        {
            "seqlens": [[40, 45], [1, 17], [0, 10], [33, 0], [2, 3]],
            "hq": 4,
            "hkv": 1,
            "d": 64,
            "causal": True,
            "page_size": 16,
            "prefill_splits": 4,
        },
    ),
    (
        "split_prefill",
        VARLEN,
        {"seqlens": [[70, 300], [1, 1]], "hq": 6, "hkv": 1, "d": 256, "causal": True, "prefill_splits": 3},
    ),
    ("kvcache", KVCACHE, {"cache": [0, 15, 40], "seqlen_new": 1, "rotary_dim": 64, "page_size": 16, "num_splits": 3}),
    (
        "kvcache",
        KVCACHE,
        {
            "cache": [5, 40],
            "seqlen_q": 2,
            "seqlen_new": 2,
            "cache_batch_idx": True,
            "rotary_dim": 64,
            "interleaved": True,
            "hq": 4,
            "hkv": 4,
            "d": 64,
        },
    ),
    ("kvcache", KVCACHE, {"cache": [20, 40], "leftpad": [3, 0], "seqlen_q": 3, "hq": 4, "hkv": 2, "d": 128}),
    ("long_prefill", PREFILL, {"seqlens": [[300, 1000]], "hq": 6, "hkv": 1}),
    ("long_prefill", PREFILL, {"seqlens": [[200, 9000]], "hq": 8, "hkv": 2, "page_size": 16, "vllm_cache": True}),
    ("long_prefill", PREFILL, {"seqlens": [[77, 8300]], "hq": 16, "hkv": 1, "page_size": 48, "poison": True}),
    ("long_prefill", PREFILL, {"seqlens": [[300, 100]], "hq": 4, "hkv": 1}),
    # patch 0004: a captured graph replayed with a corrupted block_table and seqused_k (memcheck: no
    # out-of-bounds access), and long-prefill calls from two threads on two streams (racecheck).
    ("routing_graph", ROUTING, {"scenario": "corrupt_graph", "spec": CORRUPT}),
    ("routing_streams", ROUTING, {"scenario": "streams", "spec": {**ROUTING_BASE, "hq": 1}, "calls": 1}),
    # The decode kernel (FA2PATCH_SM70_DECODE=1 through the harness): swapped and split, two row
    # blocks (12 rows), unswapped with a window and ALiBi, a vLLM cache view; and the corrupted
    # replayed graph through it.
    (
        "sm70_decode",
        VARLEN,
        {"seqlens": [[1, 300], [1, 17], [1, 0]], "hq": 6, "hkv": 1, "d": 256, "page_size": 16, "decode_kernel": True},
    ),
    (
        "sm70_decode",
        VARLEN,
        {"seqlens": [[1, 300], [1, 0], [1, 33]], "hq": 12, "hkv": 1, "d": 128, "page_size": 16, "decode_kernel": True},
    ),
    (
        "sm70_decode",
        VARLEN,
        {
            "seqlens": [[1, 77], [1, 5]],
            "hq": 8,
            "hkv": 2,
            "d": 64,
            "page_size": 32,
            "window": [16, 0],
            "alibi": True,
            "decode_kernel": True,
        },
    ),
    (
        "sm70_decode",
        VARLEN,
        {
            "seqlens": [[1, 40], [1, 9]],
            "hq": 4,
            "hkv": 1,
            "d": 128,
            "page_size": 16,
            "vllm_cache": True,
            "decode_kernel": True,
        },
    ),
    ("routing_graph", ROUTING, {"scenario": "corrupt_graph", "spec": {**CORRUPT, "decode_kernel": True}}),
    # A split-KV prefill call captured in a CUDA graph and replayed.
    (
        "routing_split_graph",
        ROUTING,
        {
            "scenario": "split_graph",
            "spec": {"seqlens": [[60, 200], [1, 17]], "hq": 4, "hkv": 1, "d": 128, "causal": True, "page_size": 16},
            "prefill_splits": 3,
        },
    ),
]


def cases() -> list[tuple[str, Path, dict]]:
    guards = [("long_prefill_guard", GUARD, spec) for spec in GUARD_CASES.values()]
    return FAMILIES + guards + [(c.family, c.script, c.spec) for c in BAD + PREFILL_BAD if c.sanitize]


def main() -> None:
    for family, harness, spec in cases():
        print(f"{family}|{harness.relative_to(REPO)}|{json.dumps(spec)}")


if __name__ == "__main__":
    main()
