# SPDX-License-Identifier: BSD-3-Clause
"""What `fa2patch tune` measures: the attention calls a vLLM deployment makes, from the model's
Hugging Face ``config.json``, the tensor-parallel size and vLLM's chunked-prefill settings.

- Heads and head dim (``read_model_config``): ``num_attention_heads``; ``num_key_value_heads``,
  absent (or null) for multi-head attention, where it equals the query heads; ``head_dim``, absent
  (or null) = ``hidden_size / num_attention_heads``. Multimodal and some newer configs (Gemma-3,
  Qwen3.5, Llava-style) nest the language model's fields under ``text_config``; those win.
- Tensor parallelism (``per_rank``): vLLM's ``QKVParallelLinear`` (vllm/model_executor/layers/
  linear.py) gives each rank ``divide(total_heads, tp)`` query heads; when ``tp >= total_kv_heads``
  each rank keeps ONE KV head, replicated over ``divide(tp, total_kv_heads)`` ranks, else
  ``divide(total_kv_heads, tp)`` KV heads. ``divide`` asserts exact division, so a head count that
  the rule cannot split is refused here as vLLM refuses it.
- Chunked prefill (``chunk_plan``): with ``--max-num-batched-tokens`` C a prompt of L tokens runs as
  ceil(L / C) chunks; chunk i (from 0) attends its Q = min(C, L - i C) queries to the KV = i C + Q
  keys cached so far (bottom-right causal), so every chunk but the last has Q = C.
- The grid (``grid_points``): not every chunk. Per Q point, the KV points are the chunk ends
  nearest to Q, Q sqrt(2), 2Q, ... and the longest one (``kv_points``). At a fixed Q a route's time
  grows about linearly with KV, while the ranking of two routes changes with KV only through fixed
  costs (extra launches, the split combine, the long-prefill route's per-block steps) whose share
  falls like 1/KV: equal steps in log KV sample equal changes of that share, so a geometric grid
  places points wherever the ranking can change, and a step of sqrt(2) (boundaries known to within
  a factor 1.19 either way) costs about 11 points for 4K..128K. Q points: the chunk C
  (the bulk of the prefill work) and C/2, C/4, ... down to 1024 (last chunks and short prompts,
  where the exact route's grid fills its waves differently and other routes can win).
- Decode (``decode_points``): calls of one query row per sequence, B sequences of KV keys each, as
  vLLM's decode batches run them, where the decode kernel (``sm70-decode``) and the exact kernel
  compete. Which one wins moves with the K/V bytes per wave of the exact route's CTAs (B x Hkv of
  them; README "The decode kernel's rule"), so both B and KV are sampled: B in --decode-batches
  (default 1, 8, 64: one sequence, a small and a full batch), KV doubling from 256 to the longest
  (and the longest), each point only where its K/V (B x KV x Hkv x D x 4 bytes) fits
  DECODE_KV_BYTES (a V100 of 16 GB holds it beside the model, and a larger batch at that length
  is not a call one card makes). None where the decode kernel has no instantiation for the rank's
  heads (its head dims, at most 16 rows per KV head: fa2patch.common.routes).
"""

import json
import math
from dataclasses import dataclass
from pathlib import Path

from fa2patch.common.errors import EnvironmentProblem
from fa2patch.common.routes import DECODE, DECODE_HEAD_DIMS, DECODE_MAX_ROWS, EXACT, GQA
from fa2patch.common.values import whole_number

MIN_Q_POINT = 1024
KV_STEP = 2**0.5
DECODE_BATCHES = (1, 8, 64)
DECODE_MIN_KV = 256
DECODE_KV_BYTES = 4 << 30


@dataclass(frozen=True)
class ModelHeads:
    """A model's attention, all ranks together."""

    heads: int
    kv_heads: int
    head_dim: int
    max_position_embeddings: int | None
    source: str  # where the fields came from ("config.json" or "config.json text_config")


@dataclass(frozen=True)
class RankHeads:
    """What one tensor-parallel rank's attention call sees."""

    hq: int
    hkv: int
    d: int

    @property
    def group(self) -> int:
        return self.hq // self.hkv


def read_model_config(path: Path) -> ModelHeads:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise EnvironmentProblem(f"{path}: cannot read it as JSON: {exc}") from None
    return parse_model_config(doc, str(path))


def parse_model_config(doc: dict, where: str = "config.json") -> ModelHeads:
    if not isinstance(doc, dict):
        raise EnvironmentProblem(f"{where}: expected a JSON object")
    source = where
    text = doc.get("text_config")
    if isinstance(text, dict) and "num_attention_heads" in text:
        doc, source = {**{k: v for k, v in doc.items() if k != "text_config"}, **text}, f"{where} text_config"
    heads = _positive(doc, "num_attention_heads", source)
    kv = doc.get("num_key_value_heads")
    kv_heads = heads if kv is None else _positive(doc, "num_key_value_heads", source)
    if doc.get("head_dim") is not None:
        d = _positive(doc, "head_dim", source)
    else:
        hidden = _positive(doc, "hidden_size", source)
        if hidden % heads:
            raise EnvironmentProblem(
                f"{source}: no head_dim, and hidden_size {hidden} is not a multiple of num_attention_heads {heads}"
            )
        d = hidden // heads
    if heads % kv_heads:
        raise EnvironmentProblem(
            f"{source}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
        )
    mpe = doc.get("max_position_embeddings")
    return ModelHeads(heads, kv_heads, d, mpe if isinstance(mpe, int) and mpe > 0 else None, source)


def _positive(doc: dict, key: str, where: str) -> int:
    value = doc.get(key)
    if not whole_number(value, 1):
        raise EnvironmentProblem(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


def per_rank(model: ModelHeads, tp: int) -> RankHeads:
    """One rank's heads under vLLM's tensor parallelism (QKVParallelLinear)."""
    if tp < 1:
        raise EnvironmentProblem(f"--tp must be >= 1, got {tp}")
    if model.heads % tp:
        raise EnvironmentProblem(
            f"--tp {tp}: vLLM splits the {model.heads} query heads evenly over the ranks; "
            f"{model.heads} is not a multiple of {tp}"
        )
    if tp >= model.kv_heads:
        if tp % model.kv_heads:
            raise EnvironmentProblem(
                f"--tp {tp}: vLLM replicates the {model.kv_heads} KV heads over the ranks; "
                f"{tp} is not a multiple of {model.kv_heads}"
            )
        hkv = 1
    else:
        if model.kv_heads % tp:
            raise EnvironmentProblem(
                f"--tp {tp}: vLLM splits the {model.kv_heads} KV heads evenly over the ranks; "
                f"{model.kv_heads} is not a multiple of {tp}"
            )
        hkv = model.kv_heads // tp
    return RankHeads(model.heads // tp, hkv, model.head_dim)


def chunk_plan(prompt_len: int, chunk: int) -> list[tuple[int, int]]:
    """(Q, KV) of each chunk of one prompt under chunked prefill."""
    if prompt_len < 1 or chunk < 1:
        raise EnvironmentProblem(f"prompt length and chunk size must be >= 1, got {prompt_len} and {chunk}")
    return [(min(chunk, prompt_len - start), min(start + chunk, prompt_len)) for start in range(0, prompt_len, chunk)]


def q_points(chunk: int, max_len: int) -> list[int]:
    """The chunk (or the whole prompt when it is shorter), then halves of it down to MIN_Q_POINT."""
    first = min(chunk, max_len)
    out, q = [first], first // 2
    while q >= MIN_Q_POINT:
        out.append(q)
        q //= 2
    return out


def kv_points(q: int, chunk: int, max_len: int) -> list[int]:
    """KV values a chunk with Q = q takes (q + n chunk <= max_len, n >= 0), nearest to q KV_STEP^j
    (j = 0, 1, ...; a tie goes to the longer), plus the longest."""
    if q > max_len:
        return []
    longest = q + (max_len - q) // chunk * chunk

    def snap(target: int) -> int:
        n = max(0, math.floor((target - q) / chunk + 0.5))
        return min(q + n * chunk, longest)

    points, j = {longest}, 0
    while q * KV_STEP**j <= max_len:
        points.add(snap(round(q * KV_STEP**j)))
        j += 1
    return sorted(points)


def grid_points(chunk: int, max_len: int) -> list[tuple[int, int]]:
    """(Q, KV) points to measure, by Q descending then KV ascending."""
    return [(q, kv) for q in q_points(chunk, max_len) for kv in kv_points(q, chunk, max_len)]


def decode_kv_points(max_len: int) -> list[int]:
    """KV of the decode points: DECODE_MIN_KV doubling below max_len, then max_len."""
    out, kv = [], DECODE_MIN_KV
    while kv < max_len:
        out.append(kv)
        kv *= 2
    return [*out, max_len]


def decode_points(heads: RankHeads, max_len: int, batches: tuple) -> list[tuple[int, int]]:
    """(KV, B) decode points, by B then KV ascending, whose K/V fits DECODE_KV_BYTES; none where the
    decode kernel cannot take the heads' calls."""
    if heads.d not in DECODE_HEAD_DIMS or heads.group > DECODE_MAX_ROWS:
        return []
    kv_bytes = heads.hkv * heads.d * 4
    kvs = decode_kv_points(max_len)
    return [(kv, b) for b in sorted(batches) for kv in kvs if b * kv * kv_bytes <= DECODE_KV_BYTES]


@dataclass(frozen=True)
class Plan:
    heads: RankHeads
    chunk: int
    max_model_len: int
    block_size: int = 16
    warmup: int = 2
    reps: int = 7
    splits: tuple = (2, 3, 4)
    decode_batches: tuple = DECODE_BATCHES

    @property
    def points(self) -> list[tuple[int, int]]:
        return grid_points(self.chunk, self.max_model_len)

    @property
    def decode_points(self) -> list[tuple[int, int]]:
        return decode_points(self.heads, self.max_model_len, self.decode_batches)

    decode_routes = ((EXACT, 1), (DECODE, 1))  # a decode call keeps FA2's decode split on either kernel

    def routes_at(self, q: int, kv: int, gqa: dict | None) -> list[tuple[str, int]]:
        """(route, splits) to run at a point: the exact route, split-KV, and the long-prefill op
        where it takes the call (its head dim, whole groups of at most max_group, KV >= Q)."""
        routes = [(EXACT, 1)] + [(EXACT, s) for s in self.splits]
        h = self.heads
        if gqa and h.d == gqa["head_dim"] and h.hq % h.hkv == 0 and h.group <= gqa["max_group"] and kv >= q:
            routes.append((GQA, 1))
        return routes
