# SPDX-License-Identifier: BSD-3-Clause
"""The tests' one oracle of the long-prefill op's plan: a walk written from the rules the op
documents (gqa_prefill.h, gqa_prefill_api.h), row by row, in the shape of gqa_prefill_plan's JSON.

The real build's gqa_prefill_plan is checked against it (test_real_series), it is checked against
values counted by hand (test_report_gqa), and CPU tests of report use it as the op's answer.

- Query heads of a KV head are packed: packed row r is query r // group of that group; rows are
  padded to whole qk row tiles. Bottom-right causal: packed row r sees key j <= r // group + kv - q.
- The block size: the largest multiple of the qk tile's keys in [min, max] whose two fp16 score
  buffers (every KV head's padded rows x block keys) fit the budget, no larger than the keys rounded
  up to that multiple (at least one tile).
- Launch s = 0 .. blocks: the pv tiles of block s-1 (per KV head, per pv row tile: the pv key chunks
  its last row sees of the block; idle when none unless the block is the first or the last), then
  the qk tiles of block s (per KV head, per qk row tile from the first that sees a key of the block,
  per key tile: qk when the tile's last row sees its first key, else idle).
"""

QK = {"rows": 128, "keys": 128, "stages": 256 // 32}  # qk tile: head dim 256 in stages of 32
PV = {"rows": 64, "keys": 32}
MIN_KEYS, MAX_KEYS, BUDGET = 256, 8192, 768 << 20


def up(x: int, m: int) -> int:
    return -(-x // m) * m


def plan(q: int, kv: int, hq: int, hkv: int) -> dict:
    group = hq // hkv
    rows = group * q
    rows_pad = up(rows, QK["rows"])
    fits = [n for n in range(MIN_KEYS, MAX_KEYS + 1, QK["keys"]) if 2 * hkv * rows_pad * n * 2 <= BUDGET]
    block = min(max(fits, default=MIN_KEYS), max(QK["keys"], up(kv, QK["keys"])))
    blocks = max(1, -(-kv // block))

    def bound(row: int) -> int:  # the causal bound of packed row ``row``: keys j <= it
        return row // group + kv - q

    def last_key(row: int) -> int:  # the last key packed row ``row`` sees
        return min(kv - 1, bound(row))

    steps = []
    for s in range(blocks + 1):
        ctas, pv, qk = [], None, None
        if s > 0:
            key0 = (s - 1) * block
            keys = min(block, kv - key0)
            pv = {"block": s - 1, "key0": key0, "num_keys": keys, "first": s == 1, "last": s == blocks}
            for _head in range(hkv):
                for row0 in range(0, rows_pad, PV["rows"]):
                    seen = max(0, min(keys, last_key(row0 + PV["rows"] - 1) + 1 - key0))
                    chunks = -(-seen // PV["keys"])
                    idle = chunks == 0 and not pv["first"] and not pv["last"]
                    ctas.append(("idle", 0) if idle else ("pv", chunks))
            pv["ctas"] = len(ctas)
        if s < blocks:
            key0 = s * block
            keys = min(block, kv - key0)
            tiles = -(-keys // QK["keys"])
            row_tiles = [
                t
                for t in range(rows_pad // QK["rows"])  # those reaching the block's first key
                if any(bound(r) >= key0 for r in range(t * QK["rows"], (t + 1) * QK["rows"]))
            ]
            first = row_tiles[0] if row_tiles else rows_pad // QK["rows"]
            for _head in range(hkv):
                for t in range(first, rows_pad // QK["rows"]):
                    for k in range(tiles):
                        sees = last_key((t + 1) * QK["rows"] - 1) >= key0 + k * QK["keys"]
                        ctas.append(("qk", QK["stages"]) if sees else ("idle", 0))
            qk = {
                "block": s,
                "key0": key0,
                "num_keys": keys,
                "tiles": max(1, tiles),
                "row_tile0": first,
                "row_tiles": rows_pad // QK["rows"] - first if tiles else 0,
            }
            qk["ctas"] = qk["tiles"] * qk["row_tiles"] * hkv
        steps.append({"ctas": len(ctas), "pv": pv, "qk": qk, "runs": runs(ctas)})
    return {
        "group": group,
        "rows": rows,
        "rows_pad": rows_pad,
        "block_keys": block,
        "num_blocks": blocks,
        "steps": steps,
    }


def runs(ctas: list[tuple[str, int]]) -> list[list]:
    """[kind, count, iterations] of consecutive equal CTAs."""
    out: list[list] = []
    for kind, its in ctas:
        if out and out[-1][0] == kind and out[-1][2] == its:
            out[-1][1] += 1
        else:
            out.append([kind, 1, its])
    return out


def ctas(step: dict) -> list[tuple[str, int]]:
    """A step's CTAs one by one, from its runs."""
    return [(kind, its) for kind, count, its in step["runs"] for _ in range(count)]
