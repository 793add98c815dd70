# SPDX-License-Identifier: BSD-3-Clause
"""What the card did while a case was timed: SM and memory clock, power, temperature and clock
event ("throttle") reasons, sampled through NVML (the ``nvidia-ml-py`` package, import name
``pynvml``) by a thread at a fixed interval around the timed calls.

Throttle reasons are NVML's clocks-event reason bits (nvml.h, "NvmlClocksEventReasons"; the same
bits as the older "NvmlClocksThrottleReasons"). A case counts as throttled when any reason other
than these two was seen during its timed window:

- ``gpu_idle`` ("Nothing is running on the GPU and the clocks are dropping to Idle state"): the
  card waiting between calls, at the edges of the window; no timed work ran slowed by it;
- ``applications_clocks_setting`` ("GPU clocks are limited by current setting of applications
  clocks"): a clock the user chose (``nvidia-smi -ac`` / locked clocks). The measurement is made
  at that setting, which the samples record; it is not the card reacting to its load.

Every other reason means the clock was held below the one requested because of the card's
condition (power: ``sw_power_cap``, "SW Power Scaling algorithm is reducing the clocks below
requested clocks"; heat: ``sw_thermal_slowdown``, ``hw_thermal_slowdown``; hardware protection:
``hw_slowdown``, ``hw_power_brake_slowdown``, "reducing the core clocks by a factor of 2 or more";
another GPU or the display: ``sync_boost``, ``display_clock_setting``): the time then depends on
the card's state, not only on the kernel. A 300 W V100 under sustained tensor load usually shows
``sw_power_cap`` (its clock settles near 1,270 MHz, docs/DESIGN.md §11).

Everything here takes the NVML module as an argument, so tests use a fake one.
"""

import statistics
import threading
import time
from typing import Any

REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
NOT_THROTTLING = frozenset({"gpu_idle", "applications_clocks_setting"})
QUANTITIES = ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temperature_c")
DEFAULT_INTERVAL_S = 0.01


def decode_reasons(mask: int) -> list[str]:
    """NVML's reason bit mask as names, lowest bit first; bits NVML did not document when this was
    written appear as ``unknown_0x...``."""
    names, bit = [], 1
    while bit <= mask:
        if mask & bit:
            names.append(REASONS.get(bit, f"unknown_{bit:#x}"))
        bit <<= 1
    return names


def load_nvml():
    """(the pynvml module, initialised) or (None, why not)."""
    try:
        import pynvml
    except ImportError:
        return None, "NVML not sampled: the nvidia-ml-py package (import pynvml) is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return None, f"NVML not sampled: nvmlInit failed ({exc})"
    return pynvml, None


def device_handle(nvml, uuid: str | None = None, pci_bus_id: str | None = None, index: int = 0):
    """(NVML handle of the GPU torch uses, how it was found): by UUID, else by PCI bus id, else by
    index (which is torch's only without CUDA_VISIBLE_DEVICES reordering)."""
    if uuid:
        uuid = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
        try:
            return nvml.nvmlDeviceGetHandleByUUID(uuid), f"uuid {uuid}"
        except Exception:
            pass
    if pci_bus_id:
        try:
            return nvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id), f"pci {pci_bus_id}"
        except Exception:
            pass
    return nvml.nvmlDeviceGetHandleByIndex(index), f"index {index} (assumed to be torch's device)"


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def card_facts(nvml, handle) -> dict:
    """Driver version, name, max SM clock and power limit, where NVML answers."""
    facts = {}
    for key, read in (
        ("driver", lambda: _text(nvml.nvmlSystemGetDriverVersion())),
        ("name", lambda: _text(nvml.nvmlDeviceGetName(handle))),
        ("max_sm_clock_mhz", lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM)),
        ("power_limit_w", lambda: nvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000.0),
    ):
        try:
            facts[key] = read()
        except Exception:
            facts[key] = None
    return facts


class Sampler:
    """A context manager: one reading on entry, one every ``interval_s`` from a thread, one on
    exit. ``samples``: dicts with t (s since entry), the QUANTITIES (None where NVML does not
    answer) and ``reasons`` (the bit mask, or None)."""

    def __init__(self, nvml, handle, interval_s: float = DEFAULT_INTERVAL_S, clock=time.monotonic):
        self.nvml, self.handle, self.interval_s, self.clock = nvml, handle, interval_s, clock
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    def _read(self, fn):
        try:
            return fn()
        except Exception:
            return None

    def sample(self) -> dict:
        n, h = self.nvml, self.handle
        reasons = (
            getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or n.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        power = self._read(lambda: n.nvmlDeviceGetPowerUsage(h))
        return {
            "t": self.clock() - self._t0,
            "sm_clock_mhz": self._read(lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
            "mem_clock_mhz": self._read(lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)),
            "power_w": None if power is None else power / 1000.0,
            "temperature_c": self._read(lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
            "reasons": self._read(lambda: reasons(h)),
        }

    def _run(self):
        while not self._stop.wait(self.interval_s):
            self.samples.append(self.sample())

    def __enter__(self):
        self._t0 = self.clock()
        self.samples = [self.sample()]
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.samples.append(self.sample())
        return False

    def summary(self) -> dict:
        return summarize(self.samples, self.interval_s)


def spread(values: list[float | None]) -> dict | None:
    """min / median / max of the values that are not None; None when there are none."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    return {"min": min(present), "median": statistics.median(present), "max": max(present)}


def summarize(samples: list[dict], interval_s: float | None = None) -> dict:
    """Per quantity min/median/max, the reasons seen (names, in bit order), the ones that count as
    throttling, and ``throttled``."""
    masks = [s["reasons"] for s in samples if s.get("reasons") is not None]
    seen = decode_reasons(_or(masks))
    counted = [r for r in seen if r not in NOT_THROTTLING]
    return {
        "samples": len(samples),
        "interval_ms": None if interval_s is None else interval_s * 1e3,
        **{q: spread([s.get(q) for s in samples]) for q in QUANTITIES},
        "throttle_reasons_seen": seen,
        "throttled_by": counted,
        "throttled": bool(counted) if masks else None,
    }


def _or(masks: list[int]) -> int:
    out = 0
    for m in masks:
        out |= int(m)
    return out


def merge(summaries: list[dict | None]) -> dict | None:
    """One summary over several cases' summaries: the extremes of their mins and maxes, the median
    of their medians, the union of their reasons, and how many cases ran throttled."""
    present = [s for s in summaries if s]
    if not present:
        return None
    out: dict[str, Any] = {"cases": len(present), "samples": sum(s["samples"] for s in present)}
    for q in QUANTITIES:
        parts = [s[q] for s in present if s.get(q)]
        out[q] = (
            {
                "min": min(p["min"] for p in parts),
                "median": statistics.median(p["median"] for p in parts),
                "max": max(p["max"] for p in parts),
            }
            if parts
            else None
        )
    seen = {r for s in present for r in s["throttle_reasons_seen"]}
    order = list(REASONS.values())
    out["throttle_reasons_seen"] = sorted(seen, key=lambda r: order.index(r) if r in order else len(order))
    out["cases_throttled"] = sum(1 for s in present if s.get("throttled"))
    return out


def describe(summary: dict | None) -> str:
    """One line: 'SM 1290-1312-1380 MHz, mem 877 MHz, 251-300 W, 61-66 C; throttled: sw_power_cap'."""
    if not summary:
        return "no NVML samples"
    parts = []
    for q, label, unit in (
        ("sm_clock_mhz", "SM", " MHz"),
        ("mem_clock_mhz", "mem", " MHz"),
        ("power_w", "", " W"),
        ("temperature_c", "", " C"),
    ):
        s = summary.get(q)
        if s:
            parts.append(f"{label + ' ' if label else ''}{_range(s)}{unit}")
    reasons = summary.get("throttled_by")
    tail = f"; throttled: {', '.join(reasons)}" if reasons else ""
    return ", ".join(parts) + tail


def _range(s: dict) -> str:
    lo, mid, hi = (f"{round(s[k], 1):g}" for k in ("min", "median", "max"))
    return lo if lo == hi else f"{lo}-{mid}-{hi}"


def open_for_torch(torch):
    """(pynvml, the handle of torch's current GPU, info) or (None, None, info with a note): found
    by UUID, else PCI bus id, else index (device_handle)."""
    nvml, note = load_nvml()
    if nvml is None:
        return None, None, {"available": False, "note": note}
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    uuid = str(getattr(props, "uuid", "") or "") or None
    pci = None
    if all(hasattr(props, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
        pci = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    try:
        handle, how = device_handle(nvml, uuid, pci, torch.cuda.current_device())
    except Exception as exc:
        return None, None, {"available": False, "note": f"NVML not sampled: no handle for torch's GPU ({exc})"}
    return (
        nvml,
        handle,
        {"available": True, "device": how, "interval_ms": DEFAULT_INTERVAL_S * 1e3, **card_facts(nvml, handle)},
    )


# The rule bench flags a case by, in words (its results carry it).
THROTTLE_RULE = (
    "throttled: NVML reported a clock event reason other than gpu_idle or applications_clocks_setting "
    "during the timed calls (power cap, thermal or hardware slowdown, sync boost, display clocks; "
    "this module says why)"
)
