# SPDX-License-Identifier: BSD-3-Clause
"""Issue 24's peer: 1Cat-vLLM's promoted q=1 decode (the four-node sawtooth CUDA graph of
docs/design/sm70_tp4_nomtp_long_context_decode.md @ 65c9f1fc), through the same calibrated model as
our routes.

One call: the p256 or the p1024 partition kernel, picked on the device from the length (p256 below
111,104 keys and in [147,841, 258,176), p1024 otherwise), its stats and output reducers, and four graph
nodes. The kernels are the decode anchors' own records (data/anchors.toml, compiled from the open
source for sm_70), so the estimate is what the decode anchors were fitted with; it applies to the
shape the kernels are built for only (B=1, q=1, 6 query heads on one KV head, D=256, 784-token pages).
"""

from collections.abc import Sequence

from fa2patch.common.errors import EnvironmentProblem
from fa2patch.common.shapes import Shape
from fa2patch.model.calibration import decode_launches
from fa2patch.model.report import route_estimate
from fa2patch.model.v100model import Card, load_data, load_v100

NAME = "1cat-decode"
REDUCERS = ["1Cat decode stats reducer", "1Cat decode output reducer"]
GRAPH_NODES = 4
# The sawtooth graph's routing intervals (the document's "final default routing intervals").
P1024_FROM = ((111104, 147841), (258176, None))
GROUP, HEAD_DIM = 6, 256
HEADERS = ["shape", "partition kernel", "peer calibrated ms (range)", "published ms", "our routes (range): verdict"]


def partition_kernel(keys: int) -> str:
    """The partition kernel the graph runs at ``keys`` keys."""
    long = any(keys >= lo and (hi is None or keys < hi) for lo, hi in P1024_FROM)
    return "1Cat decode p1024 T192" if long else "1Cat decode p256"


def check(shape: Shape) -> None:
    """The one shape the peer's kernels are built for."""
    problems = [
        what
        for what, bad in (
            (f"Q={shape.q} (decode: q=1)", shape.q != 1),
            (f"Hq/Hkv={shape.hq}/{shape.hkv} (6 query heads on 1 KV head)", (shape.hq, shape.hkv) != (GROUP, 1)),
            (f"D={shape.d} (D={HEAD_DIM})", shape.d != HEAD_DIM),
            (f"B={shape.b} (one sequence)", shape.b != 1),
            (f"{shape.decode} decode rows beside a chunk", shape.decode),
        )
        if bad
    ]
    if problems:
        raise EnvironmentProblem(f"--peer {NAME}: {shape.label}: the peer has no kernel for {'; '.join(problems)}")


def published(keys: int) -> float | None:
    """The fixed-graph operator gate's time at ``keys`` (the decode anchors), if one is published."""
    for a in load_data("anchors.toml")["anchor"]:
        w = a["workload"]
        if w["kind"] == "paged-decode" and w.get("graph_nodes") and w["keys"] == keys:
            return a["measured_ms"]
    return None


def peer_estimate(shape: Shape, card: Card, *, calibration: dict, v100: dict | None = None) -> dict:
    """The peer's call for ``shape`` on ``card``: model and calibrated time with the decode class's
    range (report.route_estimate under ``calibration``), each graph node's cost added."""
    check(shape)
    v100 = v100 or load_v100()
    data = load_data("anchors.toml")
    kernels = {k["name"]: k for k in data["kernel"]}
    kernel = partition_kernel(shape.kv)
    launches = decode_launches(kernel, {"keys": shape.kv, "reducers": REDUCERS}, kernels)
    est = route_estimate(launches, card, v100, calibration, NAME)
    nodes_ms = GRAPH_NODES * data["graph_node"]["us"] / 1e3
    for key in ("model_ms", "calibrated_ms", "calibrated_ms_low", "calibrated_ms_high"):
        est[key] += nodes_ms
    return {
        "peer": NAME,
        "label": shape.label,
        "card": {"sms": card.sms, "clock_mhz": card.clock_mhz, "dram_gbs": card.dram_peak(v100)},
        "plan": {"partition_kernel": kernel, "graph_nodes": GRAPH_NODES},
        "published_ms": published(shape.kv),
        **est,
    }


def render(rows: list[dict], predictions: Sequence[dict] = ()) -> str:
    """The peer's section of `report`: per shape its calibrated time with its range beside each of our
    routes', and whether the ranges separate."""
    from fa2patch.common.tables import table
    from fa2patch.model.ranges import range_text
    from fa2patch.peers.beside import our_routes

    cells = [
        [
            e["label"],
            e["plan"]["partition_kernel"],
            range_text(e["calibrated_ms"], e["calibrated_ms_low"], e["calibrated_ms_high"], 3),
            "-" if e["published_ms"] is None else f"{e['published_ms']:.5f}",
            our_routes(e, predictions, 3),
        ]
        for e in rows
    ]
    card = rows[0]["card"] if rows else {"sms": "-", "clock_mhz": "-", "dram_gbs": "-"}
    head = (
        f"Peer {NAME}: 1Cat-vLLM's promoted q=1 decode graph (p256/p1024 partition kernels and two reducers from "
        f"their compiled sm_70 SASS, four graph nodes), calibrated like our routes, {card['sms']} SMs at "
        f"{card['clock_mhz']:g} MHz, DRAM peak {card['dram_gbs']:g} GB/s; published: its fixed-graph operator gate "
        f"(72-SM PG503-216, 1,128.5 GB/s), fitted as decode anchors. docs/report-model.md, 'The memory side'."
    )
    return "\n".join(
        [
            head,
            table(
                cells,
                [
                    "shape",
                    "partition kernel",
                    "peer calibrated ms (range)",
                    "published ms",
                    "our routes (range): verdict",
                ],
            ),
        ]
    )
