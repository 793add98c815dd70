import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _gpu_arch():
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(0)
    return f"sm_{major}{minor}"


@pytest.fixture(scope="session")
def gpu_build() -> Path:
    """The extension built for this GPU's architecture (ci/gpu-lab.sh builds it)."""
    arch = _gpu_arch()
    if arch is None:
        pytest.skip("no CUDA GPU visible to torch: GPU tests run on the lab machine (ci/gpu-lab.sh)")
    root = Path(os.environ.get("FA2PATCH_ROOT") or REPO)
    manifest = root / "build" / arch / "manifest.json"
    if not manifest.is_file():
        message = f"{manifest}: no build for this GPU ({arch}); run ci/gpu-lab.sh"
        if os.environ.get("FA2PATCH_REQUIRE_GPU_BUILD") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return root / "build" / arch / json.loads(manifest.read_text())["artifact"]["file"]


CALL = r"""
import json, sys, torch
torch.ops.load_library(sys.argv[1])
kw = json.loads(sys.argv[2])
dtype = getattr(torch, kw.get("dtype", "float16"))
sq, sk, hq, hk, d = kw.get("shape", [8, 8, 2, 1, 64])
q = torch.randn(sq, hq, d, dtype=dtype, device="cuda")
page = kw.get("page")
if page:
    nblocks = (sk + page - 1) // page
    k = torch.randn(nblocks, page, hk, d, dtype=dtype, device="cuda")
    table = torch.arange(nblocks, dtype=torch.int32, device="cuda").view(1, -1)
else:
    k = torch.randn(sk, hk, d, dtype=dtype, device="cuda")
    table = None
v = torch.randn_like(k)
cu_q = torch.tensor([0, sq], dtype=torch.int32, device="cuda")
cu_k = torch.tensor([0, sk], dtype=torch.int32, device="cuda")
out = torch.full_like(q, 7.0)
gen = torch.zeros(2, dtype=torch.int64, device="cuda") if kw.get("gen") else None
try:
    torch.ops._vllm_fa2_C.varlen_fwd(q, k, v, out, cu_q, cu_k, None, None, table, None, sq, sk,
                                     kw.get("p_dropout", 0.0), d ** -0.5, False, True, -1, -1, 0.0,
                                     False, 0, gen)
    torch.cuda.synchronize()
    result = {"raised": None}
except Exception as exc:
    result = {"raised": type(exc).__name__, "message": str(exc).splitlines()[0]}
result["out_untouched"] = bool((out == 7.0).all())
torch.cuda.synchronize()  # the process and the device are still usable after the error
print(json.dumps(result))
"""


@pytest.fixture
def call_op(gpu_build):
    def run(env=None, **kw):
        proc = subprocess.run([sys.executable, "-c", CALL, str(gpu_build), json.dumps(kw)],
                              capture_output=True, text=True, env={**os.environ, **(env or {})})
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])
    return run
