# SPDX-License-Identifier: BSD-3-Clause
"""The numerics contract of the SM70 route (docs/DESIGN.md §7), on any GPU.

Each case runs ``sm70_cases.py`` in its own subprocess with FA2PATCH_FORCE_SM70=1 (a crash or a
CUDA fault in one case cannot take the others down) and compares ``varlen_fwd``, called the way
vLLM calls it (22 positional arguments, results in a NaN-filled ``out``), against the FP32
reference with the thresholds of ``fa2patch.common.numerics``: FA2's bar, relative L2, finite outputs,
softmax_lse, and bitwise
determinism where a case asks for it. The cases are started up front, a few at a time
(FA2PATCH_GPU_JOBS, default 6; slow ones FA2PATCH_GPU_SLOW_JOBS, default 2), because a
subprocess spends most of its time importing torch.
Cases marked ``slow`` run with FA2PATCH_SLOW=1. Every result goes to the session's numerics
summary (``$FA2PATCH_GPU_SUMMARY``, see conftest.py).
"""

import json
import os
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fa2patch.common import routes
from fa2patch.common.numerics import LSE_ABS_MAX, REL_L2_MAX

SCRIPT = Path(__file__).with_name("sm70_cases.py")  # varlen_fwd cases
KVCACHE_SCRIPT = Path(__file__).with_name("kvcache_cases.py")  # fwd_kvcache cases
TOOLS = Path(__file__).resolve().parents[2] / "tools"
FORCE = {"FA2PATCH_FORCE_SM70": "1"}
TIMEOUT_S = 300
HEAVY_SCORES = 1 << 28  # query rows x keys of one head (Case.heavy)
SLOW_TIMEOUT_S = 3600
# A typed error from a check (TORCH_CHECK and friends). torch.AcceleratorError (a CUDA fault
# surfacing at a synchronisation) is not one: it means the kernel already misbehaved.
TYPED_ERRORS = {"RuntimeError", "ValueError", "TypeError", "IndexError", "NotImplementedError"}


@dataclass(eq=False)
class Case:
    family: str
    name: str
    spec: dict
    slow: bool = False
    expect: dict = field(default_factory=dict)  # bad-input cases: what the error must look like
    script: Path = SCRIPT
    sanitize: bool = False  # also run under compute-sanitizer (ci/gpu-sanitize.sh, sanitize_cases.py)

    @property
    def id(self) -> str:
        return f"{self.family}/{self.name}"

    @property
    def timeout(self) -> int:
        return SLOW_TIMEOUT_S if self.slow else TIMEOUT_S

    @property
    def heavy(self) -> bool:
        """Slow, or a score matrix past HEAVY_SCORES: its reference takes tens of GB (33-43 GB
        at Q=8000, KV=56K-80K on the H200, lab run of 2026-12-01), so only a few run at once."""
        return self.slow or max((q * k for q, k in self.spec.get("seqlens", [])), default=0) >= HEAVY_SCORES


# --------------------------------------------------------------------------------------------
# The grid. Every case is small unless marked slow (the H200 emulates Volta's mma.m8n8k4 at
# about 17 TFLOP/s).

PREFILL = [(1, 1), (37, 90), (128, 128), (0, 5), (5, 0)]
DECODE = [(1, 1), (1, 15), (1, 16), (1, 17), (1, 300), (1, 513)]  # block boundaries
CHUNKED = [(16, 300), (1, 17), (40, 40), (7, 513), (0, 33)]  # chunked prefill
NUMERICS: list[Case] = []


def case(family, name, slow=False, **spec):
    spec.setdefault("seed", len(NUMERICS) + 1)
    NUMERICS.append(Case(family, name, spec, slow))


def mode(causal):
    return "causal" if causal else "full"


# Head dims: the supported set, 80 (not a multiple of 32) and 40 (not a multiple of 16).
for d in (32, 40, 64, 80, 96, 128, 192, 256):
    for causal in (False, True):
        case("head_dims", f"d{d}-{mode(causal)}", seqlens=PREFILL, hq=4, hkv=2, d=d, causal=causal)

# GQA: hq/hkv in {1, 2, 6, 8} with two KV heads (a wrong head mapping shows), and the
# reference model's 6:1 at head dim 256.
for hq, hkv, d in ((2, 2, 64), (4, 2, 64), (12, 2, 64), (16, 2, 64), (6, 1, 256)):
    for causal in (False, True):
        case(
            "gqa",
            f"hq{hq}-hkv{hkv}-d{d}-{mode(causal)}",
            seqlens=[(1, 1), (33, 70), (96, 96), (3, 0), (100, 37)],
            hq=hq,
            hkv=hkv,
            d=d,
            causal=causal,
        )

# Sliding window.
WIN_SEQS = [*PREFILL, (60, 40)]
case("window", "16-0-causal-d128", seqlens=WIN_SEQS, hq=4, hkv=2, d=128, causal=True, window=[16, 0])
case("window", "16-0-full-d64", seqlens=WIN_SEQS, hq=4, hkv=2, d=64, window=[16, 0])
case("window", "8-8-full-d128", seqlens=WIN_SEQS, hq=4, hkv=2, d=128, window=[8, 8])
case("window", "8-8-causal-d64", seqlens=WIN_SEQS, hq=4, hkv=1, d=64, causal=True, window=[8, 8])
case("window", "0-0-full-d64", seqlens=WIN_SEQS, hq=2, hkv=2, d=64, window=[0, 0])
# Windows wider than a block: unmasked blocks between the masked edges of both sides.
case(
    "window",
    "100-0-causal-long-d128",
    seqlens=[(300, 700), (64, 64), (1, 500), (90, 33)],
    hq=4,
    hkv=2,
    d=128,
    causal=True,
    window=[100, 0],
)
case("window", "150-40-full-long-d64", seqlens=[(300, 700), (200, 180), (5, 400)], hq=4, hkv=1, d=64, window=[150, 40])
case(
    "window",
    "100-0-paged-p48-d256",
    seqlens=[(130, 600), (1, 97)],
    hq=6,
    hkv=1,
    d=256,
    causal=True,
    window=[100, 0],
    page_size=48,
)
case("window", "64-32-long-d96", seqlens=[(200, 300), (300, 200)], hq=2, hkv=1, d=96, window=[64, 32])
case(
    "window",
    "16-0-paged-decode",
    seqlens=[(1, 100), (1, 5), (1, 40)],
    hq=8,
    hkv=2,
    d=128,
    causal=True,
    window=[16, 0],
    page_size=16,
)  # a window disables the seqlen_q/ngroups swap

# Softcap.
for causal in (False, True):
    case("softcap", f"30-{mode(causal)}-d128", seqlens=PREFILL, hq=4, hkv=2, d=128, causal=causal, softcap=30.0)
case(
    "softcap", "30-saturated-d64", seqlens=PREFILL, hq=4, hkv=2, d=64, softcap=30.0, magnitude=10.0, ref_dtype="float64"
)
case("softcap", "30-paged-decode-d256", seqlens=DECODE, hq=8, hkv=4, d=256, causal=True, softcap=30.0, page_size=16)

# ALiBi (FA2's conventions: -slope*|i - j| without causal, slope*j with causal).
for d in (64, 128):
    for causal in (False, True):
        case("alibi", f"d{d}-{mode(causal)}", seqlens=PREFILL, hq=4, hkv=2, d=d, causal=causal, alibi=True)
# FA2 picks the ALiBi form from params.is_causal = (window_left < 0 && window_right == 0): a causal
# call with a left window gets -slope*|i - j|, a non-causal (-1, 0) window gets slope*j (sm70_cases.fa2_mask).
case("alibi", "window-16-0-causal", seqlens=WIN_SEQS, hq=4, hkv=2, d=64, causal=True, alibi=True, window=[16, 0])
case("alibi", "window-none-0-full", seqlens=WIN_SEQS, hq=4, hkv=2, d=64, alibi=True, window=[-1, 0])
case("alibi", "window-8-8-full", seqlens=WIN_SEQS, hq=4, hkv=2, d=128, alibi=True, window=[8, 8])
case("alibi", "masked-rows-causal", seqlens=[(70, 33), (16, 1), (9, 9)], hq=4, hkv=2, d=64, causal=True, alibi=True)
case("alibi", "paged-decode", seqlens=DECODE, hq=8, hkv=2, d=128, causal=True, alibi=True, page_size=16)

# Varlen batches with empty and 1-token sequences.
_rng = random.Random(7)
RANDOM_PREFIX = [(n, n + _rng.randint(0, 64)) for n in (_rng.randint(0, 48) for _ in range(64))]
RANDOM_FREE = [(_rng.randint(0, 48), _rng.randint(0, 80)) for _ in range(64)]
EMPTIES = [(0, 0), (1, 1), (0, 7), (1, 50), (7, 0), (1, 1), (33, 33), (0, 0)]
for causal in (False, True):
    case("varlen", f"empties-and-ones-{mode(causal)}", seqlens=EMPTIES, hq=4, hkv=1, d=64, causal=causal)
case("varlen", "ones-mha", seqlens=[(1, 1)] * 24 + [(1, 3)], hq=2, hkv=2, d=128)
case("varlen", "ones-gqa", seqlens=[(1, 1)] * 24 + [(1, 3)], hq=4, hkv=1, d=128)
case("varlen", "random64-prefix-causal", seqlens=RANDOM_PREFIX, hq=4, hkv=2, d=64, causal=True)
case("varlen", "random64-full", seqlens=RANDOM_FREE, hq=4, hkv=2, d=64)
case("varlen", "first-last-empty", seqlens=[(0, 10), (20, 20), (0, 0)], hq=4, hkv=2, d=128, causal=True)

# Paged KV (vLLM's call: block_table + seqused_k) with page sizes 16, 32, 256 and num_splits 0, 1, 4.
for page in (16, 32, 256):
    for splits in (0, 1, 4):
        case(
            "paged",
            f"p{page}-decode-s{splits}",
            seqlens=DECODE,
            hq=8,
            hkv=2,
            d=128,
            causal=True,
            page_size=page,
            num_splits=splits,
        )
        case(
            "paged",
            f"p{page}-prefill-s{splits}",
            seqlens=CHUNKED,
            hq=4,
            hkv=1,
            d=64,
            causal=True,
            page_size=page,
            num_splits=splits,
        )
# vLLM passes cu_seqlens_k = torch.empty_like(cu_seqlens_q) with a block table: seqused_k must win.
case(
    "paged", "p16-decode-cuk-zeros", seqlens=DECODE, hq=8, hkv=2, d=128, causal=True, page_size=16, cu_seqlens_k="zeros"
)
case(
    "paged",
    "p16-prefill-cuk-garbage",
    seqlens=CHUNKED,
    hq=4,
    hkv=1,
    d=64,
    causal=True,
    page_size=16,
    cu_seqlens_k="garbage",
)
case("paged", "p32-prefill-full-d128", seqlens=CHUNKED, hq=4, hkv=2, d=128, page_size=32)
case("paged", "p16-padded-table", seqlens=CHUNKED, hq=4, hkv=2, d=96, causal=True, page_size=16, extra_blocks=5)

# Decode: seqlen_q = 1 everywhere with hq > hkv (FA2's seqlen_q/ngroups swap on the host).
for hq, hkv, d in ((4, 2, 64), (12, 2, 128), (8, 1, 256)):
    case(
        "decode",
        f"contig-hq{hq}-hkv{hkv}-d{d}",
        seqlens=[(1, 1), (1, 77), (1, 256), (1, 1000)],
        hq=hq,
        hkv=hkv,
        d=d,
        causal=True,
    )
case("decode", "contig-hq6-hkv1-d128-full", seqlens=[(1, 1), (1, 77), (1, 1000)], hq=6, hkv=1, d=128)
case(
    "decode",
    "paged-hq6-hkv1-d256-p16",
    seqlens=[(1, 1), (1, 1000), (1, 4097)],
    hq=6,
    hkv=1,
    d=256,
    causal=True,
    page_size=16,
)
case("decode", "paged-hq8-hkv1-d64-p32-s4", seqlens=DECODE, hq=8, hkv=1, d=64, causal=True, page_size=32, num_splits=4)
case(
    "decode", "contig-window-32-0", seqlens=[(1, 1), (1, 77), (1, 256)], hq=8, hkv=2, d=128, causal=True, window=[32, 0]
)

# The decode kernel (patch 0002, switched on by FA2PATCH_SM70_DECODE=1, which the harness sets for
# ``decode_kernel``; the built-in rule: test_routing_gpu's decode_rule): every unsplit call of at
# most 16 rows per KV head (max_seqlen_q x the group: one query row per sequence, or speculative
# decoding's few) at head dim 64/128/256 takes it (route_stats counts it; 9-16 rows as two row
# blocks); more rows and other head dims keep the exact route. Each case runs twice: bitwise the same.
LENGTHS = [(1, n) for n in (1, 2, 15, 16, 17, 31, 32, 33, 127, 128, 129, 300, 513, 4097)]


def decode_case(name, route=routes.DECODE, slow=False, **spec):
    spec = {"seed": 2000 + len(NUMERICS), "repeats": 2, "causal": True, "decode_kernel": True, **spec}
    NUMERICS.append(Case("sm70-decode", name, spec, slow, expect={"route": route}))


for page in (16, 32, 784):
    decode_case(f"6-1-d256-p{page}", seqlens=LENGTHS, hq=6, hkv=1, d=256, page_size=page)
for hq, hkv, d in ((1, 1, 64), (2, 2, 128), (4, 2, 64), (8, 1, 128), (16, 2, 256), (32, 8, 128), (3, 1, 128)):
    decode_case(f"hq{hq}-hkv{hkv}-d{d}-p16", seqlens=LENGTHS[::2], hq=hq, hkv=hkv, d=d, page_size=16)
# Row blocks: 9 (5 + 4 rows), 12 (6 + 6) and 16 (8 + 8) rows per KV head; 18 stays on the exact route.
for hq, hkv, d in ((9, 1, 128), (24, 2, 256), (16, 1, 128), (32, 2, 64)):
    decode_case(f"rowblocks-hq{hq}-hkv{hkv}-d{d}-p16", seqlens=LENGTHS[::2], hq=hq, hkv=hkv, d=d, page_size=16)
decode_case("rowblocks-splits4-16-1-d256", seqlens=LENGTHS, hq=16, hkv=1, d=256, page_size=784, num_splits=4)
decode_case("rowblocks-alibi-12-1-d128", seqlens=LENGTHS[::2], hq=12, hkv=1, d=128, page_size=16, alibi=True)
decode_case("hq18-hkv1-d128-exact", routes.EXACT, seqlens=LENGTHS[::3], hq=18, hkv=1, d=128, page_size=16)
# Speculative decoding's verification: a few query rows per sequence (bottom-right causal per row),
# unsplit batches, at most 16 rows per KV head (max_seqlen_q x the group); 17 stay exact.
SPEC = [(q, n) for q, n in ((2, 2), (3, 17), (1, 40), (4, 300), (2, 513), (3, 4097), (4, 4))]
decode_case("spec-q4-4-2-d128", seqlens=SPEC, hq=4, hkv=2, d=128, page_size=16)  # 8 rows, dead rows
decode_case("spec-q2-6-1-d256", seqlens=[(2, n) for _, n in SPEC], hq=6, hkv=1, d=256, page_size=784)  # 2 blocks
decode_case("spec-q4-2-1-d64-full", seqlens=SPEC, hq=2, hkv=1, d=64, page_size=32, causal=False)
decode_case("spec-window-q3-4-1-d128", seqlens=[(3, n) for _, n in SPEC], hq=4, hkv=1, d=128, window=[32, 0])
decode_case("spec-alibi-q4-2-2-d128", seqlens=SPEC, hq=2, hkv=2, d=128, page_size=16, alibi=True)
decode_case("spec-alibi-full-q4-4-1-d64", seqlens=SPEC, hq=4, hkv=1, d=64, alibi=True, causal=False)
decode_case("spec-softcap-q3-2-1-d256", seqlens=[(3, n) for _, n in SPEC], hq=2, hkv=1, d=256, softcap=30.0)
decode_case("spec-q17-exact", routes.EXACT, seqlens=[(17, 300), (5, 40)], hq=1, hkv=1, d=128, page_size=16)
decode_case("hq6-hkv1-d96-exact", routes.EXACT, seqlens=LENGTHS[::3], hq=6, hkv=1, d=96, page_size=16)
decode_case("contig-6-1-d256", seqlens=LENGTHS, hq=6, hkv=1, d=256)
decode_case("full-6-1-d128", seqlens=LENGTHS[::2], hq=6, hkv=1, d=128, causal=False, page_size=32)
for splits in (1, 4, 128):
    decode_case(f"splits{splits}-8-2-d128", seqlens=LENGTHS, hq=8, hkv=2, d=128, page_size=16, num_splits=splits)
decode_case("window-32-0", seqlens=LENGTHS, hq=8, hkv=2, d=128, page_size=16, window=[32, 0])
decode_case("window-100-0-d256", seqlens=LENGTHS, hq=6, hkv=1, d=256, page_size=16, window=[100, 0])
decode_case("softcap-30-d256", seqlens=LENGTHS, hq=8, hkv=4, d=256, page_size=16, softcap=30.0)
decode_case("alibi-causal", seqlens=LENGTHS, hq=8, hkv=2, d=128, page_size=16, alibi=True)
decode_case("alibi-full", seqlens=LENGTHS, hq=8, hkv=2, d=64, page_size=16, alibi=True, causal=False)
RANDOM_DECODE = [(1, _rng.randint(0, 3000)) for _ in range(64)]
decode_case("random64", seqlens=RANDOM_DECODE, hq=8, hkv=2, d=128, page_size=16)
decode_case("no-keys", seqlens=[(1, 0), (1, 20), (1, 0)], hq=8, hkv=1, d=128, page_size=16)
decode_case("vllm-cache-views", seqlens=LENGTHS, hq=6, hkv=1, d=256, page_size=16, vllm_cache=True, extra_blocks=3)
decode_case("poisoned-slots", seqlens=LENGTHS, hq=8, hkv=2, d=128, page_size=16, poison=True)
decode_case("scores100", seqlens=LENGTHS, hq=6, hkv=1, d=256, page_size=16, magnitude=10.0, ref_dtype="float64")
decode_case("6-1-d256-131072", seqlens=[(1, 131072), (1, 1)], hq=6, hkv=1, d=256, page_size=784)
decode_case("6-1-d256-262080", seqlens=[(1, 262080)], hq=6, hkv=1, d=256, page_size=784)

# Adversarial inputs.
case(
    "adversarial",
    "scores100-full-d128",
    seqlens=[(37, 90), (128, 128), (1, 1)],
    hq=4,
    hkv=2,
    d=128,
    magnitude=10.0,
    ref_dtype="float64",
)
case(
    "adversarial",
    "scores100-causal-d64",
    seqlens=PREFILL,
    hq=4,
    hkv=2,
    d=64,
    causal=True,
    magnitude=10.0,
    ref_dtype="float64",
)
case(
    "adversarial",
    "scores100-paged-decode-d256",
    seqlens=[(1, 300), (1, 1000)],
    hq=6,
    hkv=1,
    d=256,
    causal=True,
    page_size=16,
    magnitude=10.0,
    ref_dtype="float64",
)
case("adversarial", "masked-rows-causal", seqlens=[(70, 33), (16, 1), (5, 0), (1, 1)], hq=4, hkv=2, d=64, causal=True)
case(
    "adversarial",
    "masked-rows-window-0-0-causal",
    seqlens=[(40, 20), (8, 8)],
    hq=4,
    hkv=2,
    d=128,
    causal=True,
    window=[0, 0],
)
case("adversarial", "no-keys-at-all", seqlens=[(3, 0), (5, 0)], hq=4, hkv=2, d=64)  # max_seqlen_k == 0
case(
    "adversarial",
    "paged-decode-no-keys",
    seqlens=[(1, 0), (1, 20), (1, 0)],
    hq=8,
    hkv=1,
    d=128,
    causal=True,
    page_size=16,
)
case(
    "adversarial", "paged-masked-rows", seqlens=[(40, 20), (1, 0), (3, 3)], hq=4, hkv=2, d=64, causal=True, page_size=16
)
case(
    "adversarial",
    "nan-in-unused-slots-paged-decode",
    seqlens=DECODE,
    hq=8,
    hkv=2,
    d=128,
    causal=True,
    page_size=16,
    poison=True,
)
case(
    "adversarial",
    "nan-in-unused-slots-paged-prefill",
    seqlens=CHUNKED,
    hq=4,
    hkv=1,
    d=64,
    causal=True,
    page_size=32,
    poison=True,
)
case("adversarial", "nan-after-last-key-contig", seqlens=[(37, 90), (5, 21)], hq=4, hkv=2, d=64, poison=True)
case("adversarial", "kv256k-q16", slow=True, seqlens=[(16, 262144)], hq=1, hkv=1, d=64, causal=True)
case(
    "adversarial", "kv256k-q16-paged16", slow=True, seqlens=[(16, 262144)], hq=1, hkv=1, d=64, causal=True, page_size=16
)

# Non-contiguous strides the schema allows (last dim contiguous): q from a packed qkv, k/v from packed kv.
case("strides", "packed-qkv-prefill", seqlens=PREFILL, hq=8, hkv=2, d=128, causal=True, strided=True)
case("strides", "packed-kv-paged-decode", seqlens=DECODE, hq=8, hkv=2, d=64, causal=True, page_size=16, strided=True)

# Determinism: 10 calls, bitwise identical out and softmax_lse.
case(
    "determinism",
    "prefill-gqa-d128",
    seqlens=[(37, 90), (128, 128), (200, 200), (1, 1)],
    hq=8,
    hkv=2,
    d=128,
    causal=True,
    repeats=10,
)
case(
    "determinism",
    "paged-decode-p16-s0",
    seqlens=[(1, 1000), (1, 4097), (1, 17)],
    hq=8,
    hkv=2,
    d=128,
    causal=True,
    page_size=16,
    repeats=10,
)
case(
    "determinism",
    "paged-decode-p16-s4",
    seqlens=[(1, 1000), (1, 4097), (1, 17)],
    hq=8,
    hkv=2,
    d=128,
    causal=True,
    page_size=16,
    num_splits=4,
    repeats=10,
)
case("determinism", "paged-prefill-p16", seqlens=CHUNKED, hq=6, hkv=1, d=256, causal=True, page_size=16, repeats=10)

# Head dims 32 and 96 (kernel_traits.h, Tile::kSplitKeys): the warps of a pair split a block's
# keys for PV and sum their partial O after the last block, and half the CTA copies V. Every
# feature through both kernels, and head dims 8..24 and 72..88 zero-padded on them.
for d in (8, 16, 24, 72, 88):
    case("split_keys", f"d{d}-causal", seqlens=PREFILL, hq=4, hkv=2, d=d, causal=True)
for d in (32, 96):
    kw = {"hkv": 2, "d": d}
    case("split_keys", f"window-16-0-causal-d{d}", seqlens=WIN_SEQS, hq=4, causal=True, window=[16, 0], **kw)
    case(
        "split_keys",
        f"window-150-40-long-d{d}",
        seqlens=[(300, 700), (200, 180), (5, 400)],
        hq=4,
        window=[150, 40],
        **kw,
    )
    case("split_keys", f"softcap-causal-d{d}", seqlens=PREFILL, hq=4, causal=True, softcap=30.0, **kw)
    case("split_keys", f"alibi-full-d{d}", seqlens=PREFILL, hq=4, alibi=True, **kw)
    case("split_keys", f"random-prefix-causal-d{d}", seqlens=RANDOM_PREFIX, hq=6, causal=True, **kw)
    case("split_keys", f"paged-p16-prefill-d{d}", seqlens=CHUNKED, hq=4, causal=True, page_size=16, **kw)
    case("split_keys", f"paged-p32-decode-s4-d{d}", seqlens=DECODE, hq=8, causal=True, page_size=32, num_splits=4, **kw)
    case(
        "split_keys",
        f"scores100-causal-d{d}",
        seqlens=PREFILL,
        hq=4,
        causal=True,
        magnitude=10.0,
        ref_dtype="float64",
        **kw,
    )
    case(
        "split_keys", f"determinism-paged-p16-d{d}", seqlens=CHUNKED, hq=6, causal=True, page_size=16, repeats=10, **kw
    )

# Split-KV on the exact route for prefill (patch 0004; the router's test hook forces N splits): FP32
# partials in q's rows and the deterministic combine, held to the same contract. Key counts that are
# multiples of nothing, causal bottom-right masks cut per split, splits with no visible key (short
# KV, masked rows, sequences with no keys or no queries), a prefill chunk batched with decode rows
# over vLLM's paged cache views, GQA 6/1 D=256 and 32/8 D=128. check_numerics also requires that
# every call took sm70-dense-splitkv.
CHUNK_AND_DECODES = [(300, 2049), (1, 17), (1, 300), (1, 1), (1, 513)]
case("split_prefill", "one-seq-causal-d128-s3", seqlens=[(200, 777)], hq=4, hkv=2, d=128, causal=True, prefill_splits=3)
case("split_prefill", "one-seq-causal-d32-s3", seqlens=[(200, 777)], hq=4, hkv=2, d=32, causal=True, prefill_splits=3)
case("split_prefill", "one-seq-full-d96-s2", seqlens=[(130, 1000)], hq=4, hkv=1, d=96, prefill_splits=2)
case("split_prefill", "one-seq-full-d64-s2", seqlens=[(130, 1000)], hq=4, hkv=1, d=64, prefill_splits=2)
case(
    "split_prefill",
    "chunk-and-decodes-p16-vllm-views-6-1-d256-s3",
    seqlens=CHUNK_AND_DECODES,
    hq=6,
    hkv=1,
    d=256,
    causal=True,
    page_size=16,
    cu_seqlens_k="garbage",
    vllm_cache=True,
    prefill_splits=3,
)
case(
    "split_prefill",
    "chunk-and-decodes-p16-6-1-d256-full-s4",
    seqlens=CHUNK_AND_DECODES,
    hq=6,
    hkv=1,
    d=256,
    page_size=16,
    prefill_splits=4,
)
case(
    "split_prefill",
    "gqa-32-8-d128-causal-s4",
    seqlens=[(129, 333), (1, 70), (64, 64)],
    hq=32,
    hkv=8,
    d=128,
    causal=True,
    prefill_splits=4,
)
case(
    "split_prefill",
    "gqa-32-8-d128-full-s2",
    seqlens=[(129, 333), (1, 70), (64, 64)],
    hq=32,
    hkv=8,
    d=128,
    prefill_splits=2,
)
case(
    "split_prefill",
    "empty-splits-causal-s4",
    seqlens=[(40, 45), (5, 5), (33, 0), (0, 10), (2, 3)],
    hq=4,
    hkv=1,
    d=64,
    causal=True,
    prefill_splits=4,
)
case(
    "split_prefill",
    "more-splits-than-blocks-s16",
    seqlens=[(64, 70), (3, 700)],
    hq=2,
    hkv=1,
    d=128,
    causal=True,
    prefill_splits=16,
)
case(
    "split_prefill",
    "masked-rows-causal-s3",
    seqlens=[(70, 33), (16, 1), (9, 9)],
    hq=4,
    hkv=2,
    d=64,
    causal=True,
    prefill_splits=3,
)
case(
    "split_prefill",
    "chunked-p16-cuk-garbage-s2",
    seqlens=CHUNKED,
    hq=4,
    hkv=1,
    d=64,
    causal=True,
    page_size=16,
    cu_seqlens_k="garbage",
    prefill_splits=2,
)
case(
    "split_prefill",
    "window-softcap-alibi-d128-s2",
    seqlens=[(100, 500), (1, 40)],
    hq=4,
    hkv=2,
    d=128,
    causal=True,
    window=[64, 0],
    softcap=30.0,
    alibi=True,
    prefill_splits=2,
)
case(
    "split_prefill",
    "scores100-causal-d256-s3",
    seqlens=[(96, 400), (37, 90)],
    hq=6,
    hkv=1,
    d=256,
    causal=True,
    magnitude=10.0,
    ref_dtype="float64",
    prefill_splits=3,
)
case(
    "split_prefill",
    "strided-views-d96-s3",
    seqlens=[(77, 301), (1, 9)],
    hq=8,
    hkv=2,
    d=96,
    causal=True,
    strided=True,
    prefill_splits=3,
)
case(
    "split_prefill",
    "determinism-p16-6-1-d256-s3",
    seqlens=CHUNK_AND_DECODES,
    hq=6,
    hkv=1,
    d=256,
    causal=True,
    page_size=16,
    prefill_splits=3,
    repeats=10,
)
# Realistic: the long-prefill range's smallest chunk, and issue 17's production chunk (Q=4096 over 32K
# cached keys, 6/1, D=256, scale 1/16) with 3 splits.
case(
    "split_prefill",
    "q1024-kv16384-p16-6-1-d256-s3",
    seqlens=[(1024, 16384)],
    hq=6,
    hkv=1,
    d=256,
    scale=1 / 16,
    causal=True,
    page_size=16,
    prefill_splits=3,
    repeats=2,
)
case(
    "split_prefill",
    "q4096-kv32768-p16-6-1-d256-s3",
    seqlens=[(4096, 32768)],
    hq=6,
    hkv=1,
    d=256,
    scale=1 / 16,
    causal=True,
    page_size=16,
    vllm_cache=True,
    prefill_splits=3,
)


# fwd_kvcache (kvcache_cases.py): contiguous and paged caches, seqlens_k, split-KV, appended k/v
# with rotary (both pairings, per-row and uniform query positions), cache_batch_idx, leftpad_k.
def kv_case(name, **spec):
    spec.setdefault("seed", len(NUMERICS) + 1)
    NUMERICS.append(Case("kvcache", name, spec, script=KVCACHE_SCRIPT))


KV_DECODE = [1, 15, 16, 17, 300, 1000]
for splits in (0, 1, 5):
    kv_case(f"contig-decode-gqa-s{splits}", cache=KV_DECODE, num_splits=splits)
kv_case("paged-p16-decode-hq6-hkv1-d256", cache=KV_DECODE, hq=6, hkv=1, d=256, page_size=16)
kv_case("paged-p32-decode-s3-d64", cache=KV_DECODE, hq=8, hkv=1, d=64, page_size=32, num_splits=3)
kv_case("append1-rotary-contig", cache=[0, 16, 40, 299], seqlen_new=1, rotary_dim=64)
kv_case(
    "append1-rotary-interleaved-paged-p16",
    cache=[0, 15, 40, 299],
    seqlen_new=1,
    rotary_dim=128,
    interleaved=True,
    page_size=16,
)
kv_case("append4-rotary-causal-prefill", cache=[3, 60, 100], seqlen_q=4, seqlen_new=4, hq=4, hkv=4, d=64, rotary_dim=32)
kv_case(
    "append4-rotary-noncausal",
    cache=[3, 60, 100],
    seqlen_q=4,
    seqlen_new=4,
    hq=4,
    hkv=2,
    d=64,
    causal=False,
    rotary_dim=64,
    interleaved=True,
)
kv_case("append2-paged-p16-s4", cache=[14, 33, 500], seqlen_q=2, seqlen_new=2, page_size=16, num_splits=4)
kv_case("cache-batch-idx-append", cache=[5, 70, 200], seqlen_new=1, cache_batch_idx=True, rotary_dim=64)
kv_case("leftpad-causal", cache=[20, 40, 64, 9], leftpad=[0, 3, 10, 9], seqlen_q=2, hq=4, hkv=2, d=128)
kv_case("whole-cache-no-seqlens", cache=[50, 50], capacity=50, with_seqlens_k=False, seqlen_q=3, hq=4, hkv=2, d=96)
kv_case("window-32-0-append-rotary", cache=[10, 100, 300], seqlen_new=1, window=[32, 0], rotary_dim=64)
kv_case("alibi-softcap-append", cache=[10, 100, 300], seqlen_new=1, alibi=True, softcap=30.0, d=256, hq=6, hkv=1)
for d in (32, 96):  # split-key kernels (kernel_traits.h)
    kv_case(
        f"append1-rotary-paged-p16-s3-d{d}",
        cache=[0, 15, 40, 299],
        seqlen_new=1,
        d=d,
        rotary_dim=d,
        page_size=16,
        num_splits=3,
    )
kv_case(
    "determinism-paged-append-s4",
    cache=[1000, 4097, 17],
    seqlen_new=1,
    page_size=16,
    num_splits=4,
    rotary_dim=64,
    repeats=10,
)


# fwd_kvcache with the decode kernel switched on: calls of one query row, and unsplit calls of a few
# (speculative verification, appended k/v and rotary running before it, as before the exact kernel);
# FA2's own swap, which fwd_kvcache does not mark in params, arrives as rows that all see every key.
def kv_decode_case(name, **spec):
    spec = {"seed": 3000 + len(NUMERICS), "decode_kernel": True, "repeats": 2, "hq": 4, "hkv": 4, **spec}
    NUMERICS.append(Case("kvcache-decode-kernel", name, spec, script=KVCACHE_SCRIPT))


kv_decode_case("contig-mha-d128", cache=KV_DECODE)
kv_decode_case("paged-p16-mha-d256", cache=KV_DECODE, hq=2, hkv=2, d=256, page_size=16)
kv_decode_case("paged-p32-mha-d64-s3", cache=KV_DECODE, d=64, page_size=32, num_splits=3)
kv_decode_case(
    "append1-rotary-paged-p16-s3", cache=[0, 15, 40, 299], seqlen_new=1, rotary_dim=128, page_size=16, num_splits=3
)
kv_decode_case("cache-batch-idx-append", cache=[5, 70, 200], seqlen_new=1, cache_batch_idx=True, rotary_dim=64)
kv_decode_case("leftpad", cache=[20, 40, 64, 9], leftpad=[0, 3, 10, 9], d=128)
kv_decode_case(
    "window-32-0-gqa-append-rotary", cache=[10, 100, 300], seqlen_new=1, window=[32, 0], rotary_dim=64, hq=8, hkv=2
)
kv_decode_case(
    "alibi-softcap-gqa-append", cache=[10, 100, 300], seqlen_new=1, alibi=True, softcap=30.0, d=256, hq=6, hkv=1
)
kv_decode_case("swapped-gqa-unsplit", cache=[10, 100, 4097], hq=8, hkv=2, num_splits=1)  # FA2's swap: 4 rows
kv_decode_case(  # 3 x 4 rows per KV head: two row blocks
    "spec-q3-gqa-append-rotary-paged-p16",
    cache=[10, 100, 300],
    seqlen_q=3,
    seqlen_new=3,
    rotary_dim=64,
    page_size=16,
    hq=8,
    hkv=2,
    num_splits=1,
)
kv_decode_case(  # 4 x 4 rows
    "spec-q4-gqa-window", cache=[5, 77, 300], seqlen_q=4, seqlen_new=4, hq=4, hkv=1, window=[32, 0], num_splits=1
)

# The endpoints of the reference long-prefill workload (docs/DESIGN.md §4, the target of patch
# 0003), through the routes this build has: Q=8000 new tokens.
for kv in (40000, 128000):
    for page in (None, 16):
        case(
            "workload",
            f"q8000-kv{kv}-{'paged16' if page else 'contig'}",
            slow=True,
            seqlens=[(8000, kv)],
            hq=6,
            hkv=1,
            d=256,
            scale=1 / 16,
            causal=True,
            page_size=page,
        )


# Bad inputs: a typed error before any launch, the process and the device still usable.
BAD: list[Case] = []


def bad(name, expect, sanitize=False, **spec):
    BAD.append(
        Case(
            "bad_input", name, {"expect_error": True, "seed": 1000 + len(BAD), **spec}, expect=expect, sanitize=sanitize
        )
    )


for d in (264, 260, 36):
    bad(
        f"head-dim-{d}",
        {"out_untouched": True, "message": "head"},
        sanitize=d == 264,
        seqlens=[(8, 40)],
        hq=4,
        hkv=2,
        d=d,
    )
bad(
    "head-dim-264-decode",
    {"out_untouched": True, "message": "head"},
    seqlens=[(1, 40), (1, 9)],
    hq=8,
    hkv=2,
    d=264,
    causal=True,
    page_size=16,
)
bad("hq6-hkv4-prefill", {"out_untouched": True}, seqlens=[(8, 40)], hq=6, hkv=4, d=64)
bad("hq6-hkv4-decode", {"out_untouched": True}, seqlens=[(1, 40), (1, 9)], hq=6, hkv=4, d=64, causal=True)
bad("hq2-hkv4", {"out_untouched": True}, seqlens=[(8, 40)], hq=2, hkv=4, d=64)
for value, label in ((-1, "minus1"), ("num_blocks", "num-blocks"), (2**31 - 1, "int32-max")):
    for d, suffix in ((64, ""), (32, "-d32")):  # 32: the split-key kernel's K/V copy
        bad(
            f"block-table-{label}-prefill{suffix}",
            {},
            seqlens=[(8, 40), (4, 20)],
            hq=4,
            hkv=2,
            d=d,
            causal=True,
            page_size=16,
            bad_block_table=[0, 1, value],
        )
    bad(
        f"block-table-{label}-decode",
        {},
        sanitize=value == -1,
        seqlens=[(1, 40), (1, 70)],
        hq=8,
        hkv=2,
        d=128,
        causal=True,
        page_size=16,
        bad_block_table=[1, 4, value],
    )


# Index tensors out of range, and strides the kernels cannot read with 16-byte vectors.
bad(
    "cu-seqlens-q-decreasing",
    {"out_untouched": True, "message": "cu_seqlens_q"},
    seqlens=[(8, 40), (4, 20), (6, 9)],
    bad_cu_seqlens_q=[0, 8, 6, 18],
)
bad(
    "cu-seqlens-q-beyond-q",
    {"out_untouched": True, "message": "cu_seqlens_q"},
    seqlens=[(8, 40), (4, 20)],
    bad_cu_seqlens_q=[0, 8, 13],
)
bad(
    "cu-seqlens-k-beyond-k",
    {"out_untouched": True, "message": "cu_seqlens_k"},
    sanitize=True,
    seqlens=[(8, 40), (4, 20)],
    bad_cu_seqlens_k=[0, 40, 61],
)
bad(
    "cu-seqlens-k-negative",
    {"out_untouched": True, "message": "cu_seqlens_k"},
    seqlens=[(8, 40), (4, 20)],
    bad_cu_seqlens_k=[-5, 40, 60],
)
bad(
    "seqused-k-beyond-paged-cache",
    {"out_untouched": True, "message": "seqused_k"},
    sanitize=True,
    seqlens=[(1, 40), (1, 70)],
    hq=8,
    hkv=2,
    d=128,
    page_size=16,
    bad_seqused_k=[40, 81],
)
bad(
    "seqused-k-beyond-contiguous-keys",
    {"out_untouched": True, "message": "seqused_k"},
    seqlens=[(8, 40), (4, 20)],
    bad_seqused_k=[41, 20],
)
bad(
    "seqused-k-negative",
    {"out_untouched": True, "message": "seqused_k"},
    seqlens=[(1, 40), (1, 70)],
    hq=8,
    hkv=2,
    d=128,
    page_size=16,
    bad_seqused_k=[-1, 70],
)
bad("misaligned-q-strides", {"out_untouched": True, "message": "aligned"}, seqlens=[(8, 40), (4, 20)], misaligned="q")
bad(
    "misaligned-k-strides",
    {"out_untouched": True, "message": "aligned"},
    sanitize=True,
    seqlens=[(8, 40), (4, 20)],
    misaligned="k",
)


def kv_bad(name, expect, sanitize=False, **spec):
    BAD.append(
        Case(
            "bad_input",
            name,
            {"expect_error": True, "seed": 1000 + len(BAD), **spec},
            expect={"out_untouched": True, "cache_untouched": True, **expect},
            script=KVCACHE_SCRIPT,
            sanitize=sanitize,
        )
    )


kv_bad("kvcache-append-beyond-cache", {"message": "exceed"}, sanitize=True, cache=[5, 20], capacity=20, seqlen_new=1)
kv_bad("kvcache-seqlens-negative", {"message": "exceed"}, cache=[5, 20], bad_seqlens_k=[5, -1])
kv_bad(
    "kvcache-cache-batch-idx-out-of-range",
    {"message": "cache_batch_idx"},
    sanitize=True,
    cache=[5, 20],
    seqlen_new=1,
    cache_batch_idx=True,
    bad_cache_batch_idx=[0, 4],
)
kv_bad("kvcache-leftpad-beyond-seqlens", {"message": "leftpad"}, cache=[5, 20], bad_leftpad=[6, 0])
kv_bad("kvcache-rotary-table-short", {"message": "rotary"}, cache=[5, 20], seqlen_new=1, rotary_dim=64, rotary_rows=20)
kv_bad(
    "kvcache-block-table-minus1", {"message": "block_table"}, cache=[40, 70], page_size=16, bad_block_table=[1, 2, -1]
)
kv_bad("kvcache-append-without-seqlens", {"message": "seqlens_k"}, cache=[5, 20], seqlen_new=1, with_seqlens_k=False)
kv_bad("kvcache-bf16", {"message": "bf16"}, cache=[5, 20], dtype="bfloat16")


_ids = [c.id for c in NUMERICS + BAD]
assert len(_ids) == len(set(_ids)), "case ids must be unique"


# --------------------------------------------------------------------------------------------
# Running the cases.


def _slow_enabled() -> bool:
    return os.environ.get("FA2PATCH_SLOW") == "1"  # the same switch as conftest.py's marker skip


class CaseRunner:
    """Runs cases in subprocesses, a few at a time (heavy ones, which need tens of GB for the
    reference, at most ``slow_jobs`` at a time); a test waits for its own case."""

    def __init__(self, artifact: Path, jobs: int, slow_jobs: int = 2):
        self.artifact = artifact
        self.pool = ThreadPoolExecutor(max_workers=jobs)
        self.slow_pool = ThreadPoolExecutor(max_workers=slow_jobs)
        self.futures = {}
        pythonpath = os.pathsep.join(p for p in (str(TOOLS), os.environ.get("PYTHONPATH")) if p)
        self.env = {**os.environ, **FORCE, "PYTHONPATH": pythonpath}

    def submit(self, c: Case) -> None:
        if c.id not in self.futures:
            self.futures[c.id] = (self.slow_pool if c.heavy else self.pool).submit(self._run, c)

    def result(self, c: Case) -> dict:
        self.submit(c)
        return self.futures[c.id].result()

    def _run(self, c: Case) -> dict:
        t0 = time.monotonic()
        try:
            proc = subprocess.run(
                [sys.executable, str(c.script), str(self.artifact), json.dumps(c.spec)],
                capture_output=True,
                text=True,
                env=self.env,
                timeout=c.timeout,
            )
        except subprocess.TimeoutExpired:
            return {"ok": False, "error": f"timed out after {c.timeout} s"}
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            return {
                "ok": False,
                "error": f"exit status {proc.returncode} (a crash or a harness error)",
                "stderr": proc.stderr[-4000:],
                "seconds": round(time.monotonic() - t0, 1),
            }
        return json.loads(lines[-1])

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.slow_pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def sm70_build_info(build_info) -> dict:
    if not build_info.get("sm70_kernels"):
        pytest.skip(
            "this build has no SM70 kernels (build_info().sm70_kernels is false): nothing to check numerically yet"
        )
    return build_info


@pytest.fixture(scope="module")
def runner(request, gpu_build, sm70_build_info):
    jobs = max(1, int(os.environ.get("FA2PATCH_GPU_JOBS", "6")))
    r = CaseRunner(gpu_build, jobs, max(1, int(os.environ.get("FA2PATCH_GPU_SLOW_JOBS", "2"))))
    # Start every selected case now, a few at a time; with FA2PATCH_SLOW unset the slow ones are
    # skipped, so they are not started.
    for item in request.session.items:
        if getattr(item, "module", None) is not request.module or not hasattr(item, "callspec"):
            continue
        c = item.callspec.params.get("c")
        if isinstance(c, Case) and (not c.slow or _slow_enabled()):
            r.submit(c)
    yield r
    r.close()


def _params(cases):
    return [pytest.param(c, id=c.id, marks=[pytest.mark.slow] if c.slow else []) for c in cases]


def _brief(r: dict) -> str:
    keep = {k: v for k, v in r.items() if k not in ("stderr",)}
    text = json.dumps(keep, default=str)
    if r.get("stderr"):
        text += "\n--- stderr ---\n" + r["stderr"]
    return text


@pytest.mark.parametrize("c", _params(NUMERICS))
def test_numerics(c: Case, runner, numerics_summary):
    check_numerics(c, runner.result(c), numerics_summary)


def check_numerics(c: Case, r: dict, numerics_summary) -> None:
    """The numerics contract for one case's result (the harness output keys of sm70_cases.py)."""
    numerics_summary.record(c.family, c.name, r)
    where = f"{c.id} spec={json.dumps(c.spec)}\nresult={_brief(r)}"
    assert r.get("error") is None, where
    assert r["raised"] is None, f"the op raised {r['raised']}: {r['message']}\n{where}"
    assert r["returns_out"], f"varlen_fwd must return [out, softmax_lse] with the caller's out\n{where}"
    assert r["guard_ok"], f"the op wrote outside out\n{where}"
    assert r["inputs_unchanged"], f"the op modified q, k or v\n{where}"
    assert r["finite"], f"non-finite output (NaN left in out, or inf)\n{where}"
    assert r["lse_max_err"] <= LSE_ABS_MAX, f"softmax_lse off by {r['lse_max_err']}\n{where}"
    assert r["ratio"] <= 1.0, f"max|out-ref| above FA2's bar (ratio = max over sequences)\n{where}"
    assert r["rel_l2"] <= REL_L2_MAX and r["rel_l2_worst_seq"] <= REL_L2_MAX, f"relative L2 above {REL_L2_MAX}\n{where}"
    if "cache_ok" in r:
        assert r["cache_ok"], f"the KV cache after the call is not the cache with the appended rows\n{where}"
    if c.spec.get("repeats", 1) > 1:
        assert r.get("deterministic") is True, f"{c.spec['repeats']} calls are not bitwise identical\n{where}"
    if c.family == "sm70-decode":
        calls = c.spec.get("repeats", 1)
        assert r.get("routes") == {c.expect["route"]: calls}, f"not every call took {c.expect['route']}\n{where}"
    if c.spec.get("prefill_splits", 0) > 1:
        assert r.get("routes") == {"sm70-dense-splitkv": c.spec.get("repeats", 1)}, (
            f"not every call took the split-KV route\n{where}"
        )
    assert r["ok"], where


@pytest.mark.parametrize("c", _params(BAD))
def test_bad_input_is_a_typed_error(c: Case, runner, numerics_summary):
    check_bad_input(c, runner.result(c), numerics_summary)


def check_bad_input(c: Case, r: dict, numerics_summary) -> None:
    """A typed error before any launch; the process and the device still usable."""
    numerics_summary.record(c.family, c.name, {**r, "ok": _bad_ok(c, r)})
    where = f"{c.id} spec={json.dumps(c.spec)}\nresult={_brief(r)}"
    assert r.get("error") is None, f"the process did not survive\n{where}"
    assert r["raised"] is not None, f"no error raised (an invalid input was accepted)\n{where}"
    assert r["raised"] in TYPED_ERRORS, f"not a typed check error\n{where}"
    assert r["device_ok"], f"the device is unusable after the call (a fault, not a check)\n{where}"
    if c.expect.get("message"):
        assert c.expect["message"] in r["message"].lower(), where
    if c.expect.get("out_untouched"):
        assert r["out_untouched"] and r["guard_ok"], f"out was written before the error\n{where}"
    if c.expect.get("cache_untouched"):
        assert r["cache_untouched"], f"the KV cache was written before the error\n{where}"


def _bad_ok(c: Case, r: dict) -> bool:
    return bool(
        r.get("error") is None
        and r.get("raised") in TYPED_ERRORS
        and r.get("device_ok")
        and (not c.expect.get("message") or c.expect["message"] in (r.get("message") or "").lower())
        and (not c.expect.get("out_untouched") or (r.get("out_untouched") and r.get("guard_ok")))
        and (not c.expect.get("cache_untouched") or r.get("cache_untouched"))
    )
