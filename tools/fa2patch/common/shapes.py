# SPDX-License-Identifier: BSD-3-Clause
"""Problem shapes: what `report --shapes` and `bench --shapes` take (``parse_shapes``), and the
work they carry (``attended_pairs``, ``useful_flops``)."""

import itertools
import math
import re
from dataclasses import dataclass

from fa2patch.common.errors import EnvironmentProblem


@dataclass(frozen=True)
class Shape:
    q: int
    kv: int
    hq: int
    hkv: int
    d: int
    causal: bool
    scale: float
    b: int = 1  # sequences of this shape in the batch
    decode: int = 0  # decode rows in the same call (one query each, after vLLM's chunked prefill)
    decode_kv: int = 0  # keys each decode row attends to (0: kv)
    page: int = 0  # bench: K/V in a paged cache of this many tokens per block (0: contiguous)

    @property
    def dkv(self) -> int:
        return self.decode_kv or self.kv

    @property
    def label(self) -> str:
        decode = f" +{self.decode} decode KV={self.dkv}" if self.decode else ""
        return (
            f"{f'B={self.b} ' if self.b > 1 else ''}Q={self.q} KV={self.kv} Hq={self.hq} Hkv={self.hkv} "
            f"D={self.d}{' causal' if self.causal else ''}{decode}{f' page={self.page}' if self.page else ''}"
        )


def parse_shapes(text: str) -> list[Shape]:
    """``key=value`` pairs joined by commas, ';' between groups; a value ``a:b:step`` sweeps
    a..b inclusive. Keys: q, kv, hq, hkv, d, causal (0/1), scale (default d**-0.5), b (batch:
    sequences of that shape, default 1), decode (decode rows in the same varlen call, one query
    each: vLLM's chunked prefill batches a prefill chunk with running requests' decodes; default
    0), dkv (the keys each decode row attends to, default kv) and page (bench: K/V in a paged cache
    of that many tokens per block, a multiple of 16 as FA2's paged KV needs; default 0, contiguous;
    the model does not see it). Each key once per group; q, kv, hq, hkv, d and b at least 1; scale a
    positive finite number. Anything else is refused, naming the key, what it takes and the value."""
    keys = ("q", "kv", "hq", "hkv", "d", "causal", "scale", "b", "decode", "dkv", "page")
    shapes = []
    for group in filter(None, (g.strip() for g in text.split(";"))):
        fields = {}
        for item in group.split(","):
            key, sep, value = item.strip().partition("=")
            if not sep or key not in keys:
                raise EnvironmentProblem(f"--shapes: expected key=value with key in {', '.join(keys)}; got {item!r}")
            if key in fields:
                raise EnvironmentProblem(f"--shapes: {key} given twice in {group!r}: expected it once")
            fields[key] = value
        missing = {"q", "kv", "hq", "hkv", "d"} - set(fields)
        if missing:
            raise EnvironmentProblem(f"--shapes: {group!r} lacks {', '.join(sorted(missing))}")
        if fields.get("causal", "1") not in ("0", "1"):
            raise EnvironmentProblem(f"--shapes: causal: expected 0 or 1, got {fields['causal']!r}")
        sweeps = {k: _values(k, v) for k, v in fields.items() if k not in ("causal", "scale")}
        scale = _scale(fields["scale"]) if "scale" in fields else None
        for b, q, kv, hq, hkv, d, decode, dkv, page in itertools.product(
            sweeps.get("b", [1]),
            sweeps["q"],
            sweeps["kv"],
            sweeps["hq"],
            sweeps["hkv"],
            sweeps["d"],
            sweeps.get("decode", [0]),
            sweeps.get("dkv", [0]),
            sweeps.get("page", [0]),
        ):
            if hq % hkv:
                raise EnvironmentProblem(f"--shapes: hq={hq} is not a multiple of hkv={hkv}")
            if page % 16:
                raise EnvironmentProblem(f"--shapes: page={page} is not a multiple of 16 (FA2's paged KV)")
            if decode and q < 2:
                raise EnvironmentProblem(
                    f"--shapes: decode={decode} rows ride with a prefill chunk: q must be >= 2, got q={q}"
                )
            shapes.append(
                Shape(
                    q,
                    kv,
                    hq,
                    hkv,
                    d,
                    fields.get("causal", "1") == "1",
                    scale if scale is not None else d**-0.5,
                    b,
                    decode,
                    dkv if decode else 0,
                    page,
                )
            )
    if not shapes:
        raise EnvironmentProblem("--shapes: no shape given")
    return shapes


# The keys whose values count something and must be at least 1 (decode, dkv and page may be 0: none).
POSITIVE = ("q", "kv", "hq", "hkv", "d", "b")


def _values(key: str, value: str) -> list[int]:
    m = re.fullmatch(r"([0-9]+)(?::([0-9]+):([0-9]+))?", value)
    if not m or (m.group(3) and int(m.group(3)) <= 0):
        raise EnvironmentProblem(f"--shapes: {key}={value!r} is not N or START:END:STEP")
    values = [int(m.group(1))] if not m.group(2) else list(range(int(m.group(1)), int(m.group(2)) + 1, int(m.group(3))))
    if not values:
        raise EnvironmentProblem(f"--shapes: {key}={value!r} sweeps nothing: expected START <= END")
    if key in POSITIVE and values[0] < 1:
        raise EnvironmentProblem(f"--shapes: {key}: expected an integer >= 1, got {value!r}")
    return values


def _scale(value: str) -> float:
    try:
        scale = float(value)
    except ValueError:
        scale = math.nan
    if not math.isfinite(scale) or scale <= 0:
        raise EnvironmentProblem(f"--shapes: scale: expected a positive finite number, got {value!r}")
    return scale


def attended_pairs(q: int, kv: int, causal: bool) -> int:
    """Query/key pairs that attention uses: bottom-right causal keeps key j for row i when
    j <= i + kv - q."""
    if not causal:
        return q * kv
    return sum(max(0, min(kv, i + kv - q + 1)) for i in range(q)) if q > kv else q * (kv - q) + q * (q + 1) // 2


def useful_flops(shape: Shape) -> float:
    """2 FLOPs per multiply-add, two GEMMs (Q K^T and P V), attended pairs only (a decode row
    attends to all its keys)."""
    pairs = shape.b * attended_pairs(shape.q, shape.kv, shape.causal) + shape.decode * shape.dkv
    return 4.0 * shape.hq * shape.d * pairs
