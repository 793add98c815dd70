# SPDX-License-Identifier: BSD-3-Clause
"""The decode profile's pure part (fa2patch.lab.decode_profile): device activities from a profiler's
events, by hand (host events left out, start order, offsets from the first), and its arguments."""

from types import SimpleNamespace

import pytest

from fa2patch.lab import decode_profile as dp


def event(name: str, kind: str, start: float, end: float):
    span = SimpleNamespace(start=start, end=end, elapsed_us=lambda: end - start)
    return SimpleNamespace(name=name, device_type=SimpleNamespace(name=kind), time_range=span)


def test_device_activities_are_the_device_events_in_start_order():
    prof = SimpleNamespace(
        events=lambda: [
            event("combine", "CUDA", 130.0, 134.5),
            event("aten::empty", "CPU", 0.0, 50.0),
            event("decode", "CUDA", 100.0, 125.0),
        ]
    )
    assert dp.device_activities(prof) == [
        {"name": "decode", "us": 25.0, "start_us": 0.0},
        {"name": "combine", "us": 4.5, "start_us": 30.0},
    ]
    assert dp.device_activities(SimpleNamespace(events=list)) == []


def test_the_profile_needs_a_json_file_unless_once(capsys):
    with pytest.raises(SystemExit) as exit_info:
        dp.main(["--artifact", "x.so"])
    assert exit_info.value.code == 2
    assert "--json-file is required unless --once" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        dp.main(["--once"])
    assert "--artifact is required unless --ncu-csv" in capsys.readouterr().err


def test_ncu_summary_keeps_the_key_metrics_of_the_csv_rows():
    log = "\n".join(
        [
            "==PROF== Connected to process 1",
            '"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"',
            '"0","decode<256, 6>(params)","SOL","Duration","us","25.31"',
            '"0","decode<256, 6>(params)","SOL","L1/TEX Hit Rate","%","1.0"',
            '"1","combine_wide(params)","Occupancy","Achieved Occupancy","%","12.5"',
            "==PROF== Disconnected from process 1",
        ]
    )
    assert dp.ncu_summary(log) == [
        {"id": "0", "kernel": "decode<256, 6>(params)", "metric": "Duration",
         "value": "25.31", "unit": "us"},
        {"id": "1", "kernel": "combine_wide(params)",
         "metric": "Achieved Occupancy", "value": "12.5", "unit": "%"},
    ]  # fmt: skip
