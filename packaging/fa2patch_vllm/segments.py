# SPDX-License-Identifier: BSD-3-Clause
"""Per-request routing of a vLLM scheduler batch, from host values only (README "Under load").

vLLM's FLASH_ATTN backend makes one varlen call per layer for the whole batch, and fa2patch's
router decides per call: a batch of several sequences takes the exact route. ``plan`` splits a
batch into segments of consecutive requests that each become one call: each prefill chunk that the
long-prefill route can take alone (``Thresholds``), and the runs of other requests (decode rows,
short prefill chunks) between them, which the exact route computes together as one call. The
builder asks vLLM to put decode requests first, so decode rows form one run. A segment's call is
routed by the extension as its requests would be alone, so its output is the same, bit for bit
(the exact route computes each sequence of a call on its own). The standard library only: the CPU
tests run it without vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Thresholds:
    """When a prefill chunk may take the long-prefill route alone (route_stats()'s "long_prefill")."""

    min_seqlen_q: int
    min_seqlen_k: int


@dataclass(frozen=True)
class Segment:
    first_request: int  # requests [first_request, last_request)
    last_request: int
    first_token: int  # query rows [first_token, last_token)
    last_token: int
    max_seqlen_q: int
    max_seqlen_k: int
    kind: str  # "long_prefill" (one request) or "exact" (a run of other requests)


def plan(query_start: list[int], seq_lens: list[int], limits: Thresholds) -> list[Segment]:
    """The segments of one batch: ``query_start`` (num_reqs + 1 offsets) and ``seq_lens`` (keys per
    request, query rows included) are vLLM's host copies. A prefill chunk with at least
    ``min_seqlen_q`` rows and ``min_seqlen_k`` keys gets a segment of its own; runs of other
    requests share one. One segment: no split."""
    if len(query_start) != len(seq_lens) + 1:
        raise ValueError(f"query_start has {len(query_start)} offsets for {len(seq_lens)} requests")
    kinds = []
    for i, keys in enumerate(seq_lens):
        rows = query_start[i + 1] - query_start[i]
        if rows < 0 or keys < rows:
            raise ValueError(f"request {i}: {rows} query rows and {keys} keys (query rows are among the keys)")
        kinds.append("long_prefill" if rows >= limits.min_seqlen_q and keys >= limits.min_seqlen_k else "exact")
    out: list[Segment] = []
    start = 0
    for i in range(1, len(kinds) + 1):
        if i < len(kinds) and kinds[i] == kinds[start] and kinds[i] != "long_prefill":
            continue
        run_rows = max(query_start[r + 1] - query_start[r] for r in range(start, i))
        out.append(
            Segment(start, i, query_start[start], query_start[i], run_rows, max(seq_lens[start:i]), kinds[start])
        )
        start = i
    return out


def worth_splitting(segments: list[Segment]) -> bool:
    """Split only where a chunk can take the long-prefill route alone: any other split costs launches
    and gains nothing (the exact route computes every request of a batch on its own)."""
    return len(segments) > 1 and any(s.kind == "long_prefill" for s in segments)
