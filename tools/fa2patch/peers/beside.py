# SPDX-License-Identifier: BSD-3-Clause
"""A calibrated peer beside our routes in `report`'s peer section: per shape, each of our routes'
calibrated time with its range and whether it separates from the peer's (ranges.faster_if_separated)."""

from collections.abc import Sequence

from fa2patch.model.ranges import faster_if_separated, range_text

VERDICT = {"a": "peer faster", "b": "route faster", "not separated": "not separated"}


def our_routes(peer: dict, predictions: Sequence[dict], digits: int) -> str:
    """The cell for ``peer``'s shape: "route [xN splits] time (range): verdict; ..." or "-"."""
    return (
        "; ".join(
            f"{p['route']}{f' x{n}' if (n := p['plan'].get('splits', 1)) > 1 else ''} "
            f"{range_text(p['calibrated_ms'], p['calibrated_ms_low'], p['calibrated_ms_high'], digits)}: "
            f"{VERDICT[faster_if_separated(peer, p)]}"
            for p in predictions
            if p["label"] == peer["label"]
        )
        or "-"
    )
