# SPDX-License-Identifier: BSD-3-Clause
"""Issue 24's decode peer (peers/onecat_decode.py): the sawtooth graph's partition kernel by length,
the one shape its kernels are built for, and the estimate the decode anchors were fitted with."""

import pytest

from fa2patch.common.errors import EnvironmentProblem
from fa2patch.common.shapes import Shape
from fa2patch.model import calibration as c
from fa2patch.model.v100model import Card, load_data
from fa2patch.peers import onecat_decode as peer


def decode(kv: int, **change) -> Shape:
    return Shape(**{"q": 1, "kv": kv, "hq": 6, "hkv": 1, "d": 256, "causal": True, "scale": 1 / 16, **change})


def test_the_graph_picks_its_partition_kernel_by_length_as_published():
    # "[1, 111104) p256, [111104, 147841) p1024, [147841, 258176) p256, [258176, max] p1024"
    picks = {n: peer.partition_kernel(n) for n in (1, 111103, 111104, 147840, 147841, 258175, 258176, 262080)}
    long, short = "1Cat decode p1024 T192", "1Cat decode p256"
    assert picks == {
        1: short,
        111103: short,
        111104: long,
        147840: long,
        147841: short,
        258175: short,
        258176: long,
        262080: long,
    }


@pytest.mark.parametrize(
    "change, why",
    [({"q": 2}, "Q=2"), ({"hq": 8}, "Hq/Hkv=8/1"), ({"d": 128}, "D=128"), ({"b": 2}, "B=2")],
)
def test_other_shapes_are_refused_with_the_reason(change, why):
    with pytest.raises(EnvironmentProblem, match=why):
        peer.check(decode(131072, **change))


def test_at_an_anchor_the_peer_is_the_anchor_as_calibrated():
    cal = c.calibrate()
    data = load_data("anchors.toml")
    anchor = next(a for a in data["anchor"] if a["name"] == "1Cat decode graph, 131K keys")
    row = next(r for r in cal["anchors"] if r["name"] == anchor["name"])
    est = peer.peer_estimate(decode(131072), Card(72, 1530.0, 1128.5), calibration=cal)
    assert est["calibrated_ms"] == pytest.approx(row["calibrated"], rel=1e-9)
    assert est["published_ms"] == anchor["measured_ms"] == 0.38863
    assert est["plan"]["partition_kernel"] == anchor["kernel"]
    assert est["calibrated_ms_high"] > est["calibrated_ms"] > est["calibrated_ms_low"]


def test_report_prints_the_peer_beside_our_routes(built_sm70, real_project):
    """`report --peer 1cat-decode` on the real build, on the peer's card: the peer's row (its kernel, its
    calibrated range, the published gate time) and our exact route's decode beside it with a verdict;
    a shape its kernels are not built for fails the command, naming why."""
    args = ("report", "--arch", "sm_70", "--sms", "72", "--dram-gbs", "1128.5", "--splits", "", "--peer")
    out = real_project.run(*args, "1cat-decode", "--shapes", "q=1,kv=131072,hq=6,hkv=1,d=256").stdout
    assert "Peer 1cat-decode" in out and "DRAM peak 1128.5 GB/s" in out
    row = next(line for line in out.splitlines() if line.startswith("Q=1 KV=131072") and "1Cat decode" in line)
    assert "1Cat decode p1024 T192" in row and "0.38863" in row and "sm70-dense " in row
    bad = real_project.run(*args, "1cat-decode", "--shapes", "q=1,kv=4096,hq=32,hkv=8,d=128", check_rc=2)
    assert "1cat-decode" in bad.stderr and "Hq/Hkv=32/8" in bad.stderr
