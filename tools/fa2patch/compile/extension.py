# SPDX-License-Identifier: BSD-3-Clause
"""The built extension as the other commands see it, without compiling anything.

- **The manifest** (``manifest.json`` beside the artifact): ``build`` writes it (``write_manifest``),
  ``verify``, ``smoke``, ``bench``, ``tune``, ``report`` and ``package`` read it (``load_manifest``:
  the artifact it names, its sha256 checked); an extension built elsewhere (vLLM's CMake) gets the
  part verify needs from ``manifest_for_artifact``.
- **What the extension says of itself**, read in a subprocess with torch and no GPU:
  ``build_info()`` (``load_build_info``: routes, kernels and their launch configurations) and the
  long-prefill op's block plan and launch sequence for given sizes (``gqa_prefill_plan``), both in
  one process by ``read_extension``.
- **Route entries** (``route_entry``): a build_info() route is a name reached through varlen_fwd (the
  exact route, pinned to itself by the routing test hook) or an object naming its op and environment
  (the decode kernel: varlen_fwd with its switch on).
- **Probes**: the GPU torch sees (``probe_gpu``), nvidia-smi's values (``smi``, ``mhz``), and the one
  way to run Python in a subprocess and read its last line as JSON (``python_json``).
"""

import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from fa2patch.common.digest import sha256_file
from fa2patch.common.errors import CheckFailed, EnvironmentProblem, mismatch
from fa2patch.common.routes import DECODE_ENV
from fa2patch.compile.sass import name_part_glob

MANIFEST = "manifest.json"


# --- the manifest -----------------------------------------------------------------------------------


def manifest_path(build_dir: Path) -> Path:
    return Path(build_dir) / MANIFEST


def write_manifest(build_dir: Path, manifest: dict) -> Path:
    path = manifest_path(build_dir)
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return path


def clear_manifest(build_dir: Path) -> None:
    """Before a build: a failed one must not leave the previous manifest describing a new tree."""
    manifest_path(build_dir).unlink(missing_ok=True)


def load_manifest(build_dir: Path) -> tuple[dict, Path]:
    """The manifest of ``build_dir`` and the artifact it names, whose sha256 must match it."""
    mpath = manifest_path(build_dir)
    if not mpath.is_file():
        raise EnvironmentProblem(f"{mpath}: no build here (run fa2patch build)")
    manifest = json.loads(mpath.read_text())
    artifact = Path(build_dir) / manifest["artifact"]["file"]
    if not artifact.is_file():
        raise CheckFailed(f"{artifact}: listed in {mpath} but missing")
    actual = sha256_file(artifact)
    if actual != manifest["artifact"]["sha256"]:
        raise CheckFailed(mismatch("sha256", str(artifact), manifest["artifact"]["sha256"], actual))
    return manifest, artifact


def manifest_for_artifact(artifact: Path, arch: str, lab: bool, tensor_core_kernels: list[str]) -> dict:
    """What verify needs to know about an extension built without ``fa2patch build`` (by the CMake
    of ``fa2patch package --vllm-src``): its arch, whether it is a lab build and the tensor-core
    kernel globs (from the tree's build description), its sha256; no ptxas log."""
    if not artifact.is_file():
        raise EnvironmentProblem(f"{artifact}: no such file")
    return {
        "arch": arch,
        "lab": lab,
        "tensor_core_kernels": tensor_core_kernels,
        "ptxas_kernels": None,
        "artifact": {"file": str(artifact), "sha256": sha256_file(artifact)},
    }


# --- subprocesses and probes --------------------------------------------------------------------------


def python_json(code: str, *args, env: dict | None = None, python: str = sys.executable) -> dict:
    """Run ``code`` with ``args`` in a subprocess (``env`` added to this environment); its last
    line of stdout as JSON, or {"error": the end of its stderr} when it fails."""
    proc = subprocess.run(
        [python, "-c", code, *args], capture_output=True, text=True, env={**os.environ, **(env or {})}
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()[-3000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


GPU_PROBE = r"""
import json, torch
info = {"cuda": torch.cuda.is_available()}
if info["cuda"]:
    p = torch.cuda.get_device_properties(0)
    info.update(name=p.name, capability=f"sm_{p.major}{p.minor}", major=p.major, minor=p.minor,
                sms=p.multi_processor_count, torch=torch.__version__, cuda_version=torch.version.cuda)
print(json.dumps(info))
"""


def probe_gpu() -> dict:
    """torch's first GPU: {cuda: False} without one, {error} where torch does not import."""
    return python_json(GPU_PROBE)


def smi(fields: str) -> str:
    """First GPU's nvidia-smi values (CSV, no units header); empty without nvidia-smi."""
    try:
        proc = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"], capture_output=True, text=True
        )
    except FileNotFoundError:
        return ""
    return (proc.stdout.strip().splitlines() or [""])[0]


def mhz(text: str | None) -> float | None:
    """The number of a clock as nvidia-smi prints it ("1530 MHz"), None when there is none."""
    m = re.match(r"\s*(\d+(?:\.\d+)?)", text or "")
    return float(m.group(1)) if m else None


# --- what the extension says of itself ----------------------------------------------------------------

EXTENSION_PROBE = r"""
import json, sys, torch
torch.ops.load_library(sys.argv[1])
ops = torch.ops._vllm_fa2_C
plans = []
for sizes in json.loads(sys.argv[2]):
    if not hasattr(ops, "gqa_prefill_plan"):
        plans.append({"error": "this extension has no gqa_prefill_plan op (a build before it)"})
        continue
    try:
        plans.append(json.loads(ops.gqa_prefill_plan(*sizes)))
    except Exception as exc:    # sizes the op refuses: its typed error, first line
        plans.append({"error": f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}", "refused": True})
print(json.dumps({"build_info": json.loads(ops.build_info()), "gqa_plans": plans}))
"""


def read_extension(artifact: Path, gqa_sizes: Sequence[tuple[int, int, int, int]] = ()) -> dict:
    """{build_info, gqa_plans} read in one subprocess (torch, no GPU): build_info() and, for each
    (seqlen_q, seqlen_k, num_heads_q, num_heads_k) of ``gqa_sizes``, gqa_prefill_plan's JSON, or
    {error, refused: true} where the op refuses the sizes, or {error} where the build has no such op;
    {error} when the extension does not load."""
    return python_json(EXTENSION_PROBE, str(artifact), json.dumps([list(s) for s in gqa_sizes]))


def load_build_info(artifact: Path) -> dict:
    """The extension's build_info() JSON; {"error": ...} if it cannot load."""
    got = read_extension(artifact)
    return got if "error" in got else got["build_info"]


def require_build_info(artifact: Path) -> dict:
    """build_info(), or EnvironmentProblem when the extension does not load (bench needs it; smoke
    and verify report a failed load as a failed row instead)."""
    info = load_build_info(artifact)
    if "error" in info:
        raise EnvironmentProblem(f"{artifact}: cannot load it: {info['error']}")
    return info


def launches_of(build_info: dict) -> dict[str, tuple[int, int]]:
    """{demangled-name glob: (threads per block, dynamic shared bytes)} from build_info(), whose
    kernel entries are parts of demangled names."""
    return {name_part_glob(k["kernel"]): (k["threads"], k["dynamic_smem"]) for k in build_info.get("kernels", [])}


# --- route entries -------------------------------------------------------------------------------------

# The routing test hook that pins varlen_fwd to the exact route with this many splits (patch 0004;
# 1 = unsplit, 0 = off).
PIN_SPLITS_HOOK = "_routing_prefill_splits_for_testing"


FORCE_SM70 = {"FA2PATCH_FORCE_SM70": "1"}  # the lab switch: the SM70 route on any GPU


def route_entry(entry) -> dict:
    """A build_info route: a name reached through varlen_fwd (the exact route: on prefill calls
    pinned to itself unsplit with ``pin_splits`` 1, whatever the router would choose; decode calls
    keep the decode swap's split; the decode kernel's switch off whatever the caller's environment
    says), or an object naming its op and environment; varlen_fwd's routes run with the lab switch."""
    if isinstance(entry, str):
        return {"name": entry, "op": "varlen_fwd", "env": {**FORCE_SM70, DECODE_ENV: "0"}, "pin_splits": 1}
    if entry["op"] == "varlen_fwd":
        return {**entry, "env": {**FORCE_SM70, **entry.get("env", {})}}
    return entry


def routes_of(build_info: dict) -> dict[str, dict]:
    """{name: route entry} of every route build_info() lists, in its order."""
    return {r["name"]: r for r in map(route_entry, build_info.get("routes", []))}


def pin_route(ops, route: dict) -> None:
    """Subprocess side: pin varlen_fwd to the route (see ``route_entry``) where the build has the hook."""
    if route.get("pin_splits") and hasattr(ops, PIN_SPLITS_HOOK):
        getattr(ops, PIN_SPLITS_HOOK)(route["pin_splits"])


def varlen_fwd(
    op, q, k, v, out, cu_q, cu_k, max_q: int, max_k: int, scale: float, causal: bool, seqused_k=None, block_table=None
) -> None:
    """Subprocess side: ``op`` (varlen_fwd) without dropout, ALiBi, window or softcap, FA2's own split
    choice, on contiguous sequences or (``block_table``, ``seqused_k``) a paged cache: the call smoke
    and bench make."""
    op(
        q,
        k,
        v,
        out,
        cu_q,
        cu_k,
        seqused_k,
        None,
        block_table,
        None,
        max_q,
        max_k,
        0.0,
        scale,
        False,
        causal,
        -1,
        -1,
        0.0,
        False,
        0,
        None,
    )
