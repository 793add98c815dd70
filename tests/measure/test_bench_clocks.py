# SPDX-License-Identifier: BSD-3-Clause
"""bench's record of the card: NVML sampling with a fake NVML module, throttle decoding, summary
statistics, the Markdown summary and report's estimate beside each time (CPU only)."""

import statistics
import sys
import time
import types

import pytest

from fa2patch.common.errors import EnvironmentProblem
from fa2patch.common.routes import EXACT, GQA
from fa2patch.common.shapes import Shape
from fa2patch.measure import bench, bench_text, gpu_clocks

# NVML's clocks-event reason bits, copied by hand from nvml.h's documentation
# ("NvmlClocksEventReasons"), independent of gpu_clocks.REASONS.
NVML_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}


class NVMLError(Exception):
    pass


class FakeNVML(types.SimpleNamespace):
    """pynvml's surface that gpu_clocks uses; readings come from lists, one item per call (the
    last repeats). ``None`` in a list raises NVMLError (a quantity the card does not report)."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def __init__(
        self, sm=(1530,), mem=(877,), power_mw=(250000,), temp=(60,), reasons=(0,), handles=None, event_api=True
    ):
        super().__init__()
        self.series = {
            "sm": list(sm),
            "mem": list(mem),
            "power": list(power_mw),
            "temp": list(temp),
            "reasons": list(reasons),
        }
        self.handles = handles or {"index": {0: "h0"}}
        self.calls = []
        if event_api:
            self.nvmlDeviceGetCurrentClocksEventReasons = lambda h: self._next("reasons")

    def _next(self, key):
        values = self.series[key]
        value = values.pop(0) if len(values) > 1 else values[0]
        if value is None:
            raise NVMLError("Not Supported")
        return value

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlDeviceGetClockInfo(self, h, which):
        return self._next("sm" if which == self.NVML_CLOCK_SM else "mem")

    def nvmlDeviceGetPowerUsage(self, h):
        return self._next("power")

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self._next("temp")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        self.calls.append("throttle-api")
        return self._next("reasons")

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return self._lookup("uuid", uuid)

    def nvmlDeviceGetHandleByPciBusId(self, bus):
        return self._lookup("pci", bus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self._lookup("index", i)

    def _lookup(self, kind, key):
        try:
            return self.handles[kind][key]
        except KeyError:
            raise NVMLError(f"no {kind} {key}") from None

    def nvmlSystemGetDriverVersion(self):
        return b"570.86.15"

    def nvmlDeviceGetName(self, h):
        return "Tesla V100-SXM2-32GB"

    def nvmlDeviceGetMaxClockInfo(self, h, which):
        return 1530

    def nvmlDeviceGetPowerManagementLimit(self, h):
        return 300000


@pytest.mark.parametrize(
    "names",
    [
        [],
        ["gpu_idle"],
        ["gpu_idle", "sw_power_cap"],
        ["applications_clocks_setting", "hw_slowdown", "display_clock_setting"],
        list(NVML_BITS),
    ],
)
def test_throttle_reasons_decode_to_nvml_names(names):
    mask = sum(NVML_BITS[n] for n in names)
    assert gpu_clocks.decode_reasons(mask) == sorted(names, key=NVML_BITS.get)


def test_an_undocumented_bit_is_named_not_dropped():
    assert gpu_clocks.decode_reasons(0x200 | 0x4) == ["sw_power_cap", "unknown_0x200"]


def _sample(sm, reasons, power=250.0, mem=877, temp=60):
    return {
        "t": 0.0,
        "sm_clock_mhz": sm,
        "mem_clock_mhz": mem,
        "power_w": power,
        "temperature_c": temp,
        "reasons": reasons,
    }


def test_summary_statistics_and_throttle_verdict():
    sms = [1530, 1380, 1290, 1312, 1267]
    samples = [_sample(s, r) for s, r in zip(sms, [0x1, 0x0, 0x4, 0x4, 0x0], strict=True)]
    s = gpu_clocks.summarize(samples, 0.01)
    assert s["sm_clock_mhz"] == {"min": 1267, "median": statistics.median(sms), "max": 1530}
    assert s["samples"] == 5 and s["interval_ms"] == 10.0
    assert s["throttle_reasons_seen"] == ["gpu_idle", "sw_power_cap"]
    assert s["throttled_by"] == ["sw_power_cap"] and s["throttled"] is True


@pytest.mark.parametrize(
    "masks, throttled",
    [([0x1, 0x2, 0x0], False), ([0x0, 0x20], True), ([0x10], True), ([None, None], None), ([0x100, 0x1], True)],
)
def test_only_reasons_other_than_idle_and_application_clocks_count(masks, throttled):
    assert gpu_clocks.summarize([_sample(1000, m) for m in masks])["throttled"] is throttled


def test_a_quantity_the_card_does_not_report_is_none():
    s = gpu_clocks.summarize([_sample(1000, 0, power=None), _sample(1100, 0, power=None)])
    assert s["power_w"] is None and s["sm_clock_mhz"]["max"] == 1100


def test_sampler_reads_on_entry_exit_and_in_between():
    nvml = FakeNVML(sm=[1530, 1400, 1300, 1290], power_mw=[251000, 299500], temp=[None], reasons=[0x1, 0x4])
    with gpu_clocks.Sampler(nvml, "h0", interval_s=0.002) as sampler:
        time.sleep(0.05)
    samples = sampler.samples
    assert len(samples) >= 3
    assert samples[0]["sm_clock_mhz"] == 1530 and samples[-1]["sm_clock_mhz"] == 1290
    assert samples[0]["power_w"] == 251.0 and samples[-1]["power_w"] == 299.5
    assert all(x["temperature_c"] is None for x in samples)
    assert [x["t"] for x in samples] == sorted(x["t"] for x in samples)
    summary = sampler.summary()
    assert summary["throttled_by"] == ["sw_power_cap"] and summary["temperature_c"] is None
    assert "throttle-api" not in nvml.calls  # the current API name is preferred


def test_sampler_falls_back_to_the_deprecated_throttle_api():
    nvml = FakeNVML(reasons=[0x40], event_api=False)
    with gpu_clocks.Sampler(nvml, "h0", interval_s=1.0) as sampler:
        pass
    assert "throttle-api" in nvml.calls and sampler.summary()["throttled_by"] == ["hw_thermal_slowdown"]


def test_device_handle_by_uuid_then_pci_then_index():
    nvml = FakeNVML(handles={"uuid": {"GPU-abc": "hu"}, "pci": {"00000000:3b:00.0": "hp"}, "index": {0: "hi"}})
    assert gpu_clocks.device_handle(nvml, "abc", None) == ("hu", "uuid GPU-abc")
    assert gpu_clocks.device_handle(nvml, "zzz", "00000000:3b:00.0")[0] == "hp"
    assert gpu_clocks.device_handle(nvml, None, None)[0] == "hi"


def test_without_nvml_the_note_says_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    module, note = gpu_clocks.load_nvml()
    assert module is None and "nvidia-ml-py" in note
    broken = FakeNVML()
    broken.nvmlInit = lambda: (_ for _ in ()).throw(NVMLError("Driver Not Loaded"))
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    module, note = gpu_clocks.load_nvml()
    assert module is None and "Driver Not Loaded" in note


def test_bench_worker_finds_torchs_gpu_in_nvml(monkeypatch):
    nvml = FakeNVML(handles={"uuid": {"GPU-1234": "h"}, "index": {0: "wrong"}})
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    props = types.SimpleNamespace(uuid="1234", pci_domain_id=0, pci_bus_id=0x3B, pci_device_id=0)
    torch = types.SimpleNamespace(
        cuda=types.SimpleNamespace(current_device=lambda: 0, get_device_properties=lambda i: props)
    )
    module, handle, info = gpu_clocks.open_for_torch(torch)
    assert module is nvml and handle == "h"
    assert info["available"] and info["driver"] == "570.86.15" and info["power_limit_w"] == 300.0


def test_merge_summaries():
    a = gpu_clocks.summarize([_sample(1500, 0), _sample(1400, 0)])
    b = gpu_clocks.summarize([_sample(1300, 0x4), _sample(1200, 0x1)])
    m = gpu_clocks.merge([a, None, b])
    assert m["cases"] == 2 and m["cases_throttled"] == 1
    assert m["sm_clock_mhz"] == {"min": 1200, "median": statistics.median([1450, 1250]), "max": 1500}
    assert m["throttle_reasons_seen"] == ["gpu_idle", "sw_power_cap"]


# --- bench's result: table, Markdown, model estimates ------------------------------------------


def _result(is_v100=True, throttled=True):
    clocks = gpu_clocks.summarize([_sample(1312, 0x4 if throttled else 0), _sample(1267, 0x0, power=299.0)], 0.01)
    shape = Shape(4096, 32768, 6, 1, 256, True, 1 / 16)
    rows = []
    for route, ms in ((EXACT, 12.0), (GQA, 11.0)):
        rows.append(
            {
                "route": route,
                "shape": vars(shape).copy(),
                "label": shape.label,
                "median_ms": ms,
                "min_ms": ms - 0.1,
                "max_ms": ms + 0.2,
                "tflops": 50.0,
                "envelope_ok": True,
                "contract_ok": True,
                "sm_clock_after": "1267 MHz",
                "clocks": clocks,
                "throttled": clocks["throttled"],
            }
        )
    return {
        "gpu": "Tesla V100-SXM2-32GB" if is_v100 else "NVIDIA H200",
        "capability": "sm_70" if is_v100 else "sm_90",
        "sms": 80,
        "torch": "2.9.1+cu128",
        "cuda": "12.8",
        "fa2patch": "0.1.0",
        "sm_clock_idle": "135 MHz",
        "sm_clock_max": "1530 MHz",
        "driver": "570.86.15",
        "manifest_sha256": "ab" * 32,
        "routes": [EXACT, GQA],
        "is_v100": is_v100,
        "nvml": {
            "available": True,
            "device": "uuid GPU-1",
            "interval_ms": 10.0,
            "max_sm_clock_mhz": 1530,
            "power_limit_w": 300.0,
        },
        "results": rows,
    }


def _fake_report(monkeypatch, with_range: bool, fail=False):
    import fa2patch.model.report as report

    seen = {}

    def fake(artifact, arch, launch, shapes, card):
        if fail:
            raise EnvironmentProblem("cuobjdump: not found")
        seen.update(card=card, shapes=shapes)
        preds = []
        for s in shapes:
            for route, ms in ((EXACT, 10.0), (GQA, 12.5)):
                p = {"label": s.label, "route": route, "calibrated_ms": ms, "model_ms": ms / 1.2}
                if with_range:
                    p.update(calibrated_ms_low=ms * 0.9, calibrated_ms_high=ms * 1.1)
                preds.append(p)
        return {"predictions": preds}

    monkeypatch.setattr(report, "report", fake)
    return seen


def test_model_estimate_beside_each_time_as_a_point(monkeypatch):
    seen = _fake_report(monkeypatch, with_range=False)
    result = _result()
    bench.attach_model(result, "x.so")
    assert seen["card"].sms == 80 and seen["card"].clock_mhz == 1530
    dense, gqa = result["results"]
    assert dense["measured_over_model"] == {"point": 12.0 / 10.0}
    assert gqa["measured_over_model"] == {"point": 11.0 / 12.5}
    text = bench_text.render(result)
    assert "1.20" in text and "0.88" in text and "V100 with 80 SMs at 1530 MHz" in text
    assert "V100 with 80 SMs at 1530 MHz (an estimate, not a measurement" in bench_text.markdown(result)


def test_model_estimate_prints_the_range_when_report_gives_one(monkeypatch):
    _fake_report(monkeypatch, with_range=True)
    result = _result()
    bench.attach_model(result, "x.so")
    dense = result["results"][0]
    assert dense["measured_over_model"]["low"] == pytest.approx(12.0 / 11.0)
    assert dense["measured_over_model"]["high"] == pytest.approx(12.0 / 9.0)
    text = bench_text.render(result)
    assert "9.00-11.00" in text and f"{12 / 11:.2f}-{12 / 9:.2f}" in text
    assert "9.00-11.00" in bench_text.markdown(result)


def test_without_report_the_table_says_why(monkeypatch):
    _fake_report(monkeypatch, with_range=False, fail=True)
    result = _result()
    bench.attach_model(result, "x.so")
    assert "model" not in result["results"][0]
    assert "no model estimate: cuobjdump: not found" in bench_text.render(result)


def test_table_marks_throttled_cases_and_lists_the_card():
    text = bench_text.render(_result())
    assert "12.00 (11.90-12.20)*" in text and "ran throttled" in text
    assert "SM 1267-1289.5-1312 MHz" in text and "throttled: sw_power_cap" in text
    assert "12.00*" not in bench_text.render(_result(throttled=False))


def test_markdown_summary_for_an_issue_report():
    md = bench_text.markdown(_result(is_v100=False))
    lines = md.splitlines()
    assert lines[0] == "### fa2patch bench: NVIDIA H200"
    header = next(line for line in lines if line.startswith("| shape"))
    cells = [c.strip() for c in header.strip("|").split("|")]
    row = next(line for line in lines if "sm70-gqa-prefill |" in line)
    values = dict(zip(cells, (c.strip() for c in row.strip("|").split("|")), strict=True))
    assert values["median ms"] == "11.000" and values["min-max ms"] == "10.900-11.200"
    assert values["SM MHz min-med-max"] == "1267-1289.5-1312" and values["power W"] == "250-274.5-299"
    assert values["throttle reasons"] == "sw_power_cap" and values["throttled"] == "**yes**"
    assert "| driver | 570.86.15 |" in md and "sampled every 10 ms" in md
    assert bench_text.WARNING in md and "gpu_idle or applications_clocks_setting" in md


def test_markdown_without_nvml_says_so():
    result = _result(throttled=False)
    result["nvml"] = {"available": False, "note": "NVML not sampled: the nvidia-ml-py package is not installed"}
    for r in result["results"]:
        r["clocks"], r["throttled"] = None, None
    md = bench_text.markdown(result)
    assert "| NVML | NVML not sampled: the nvidia-ml-py package is not installed |" in md
    assert "NVML not sampled" in bench_text.render(result)
