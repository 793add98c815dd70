# SPDX-License-Identifier: BSD-3-Clause
"""vLLM's real engine on the GPU lab (issue 23 item 4; issue 25's engine target): what travels there
and how its outputs are judged. ci/gpu-engine.sh orchestrates; ci/vllm-lab/engine_run.py runs the engine.

The lab has torch 2.11.0 and no network. vLLM 0.26.0 pins that torch and its wheel carries sm_90
kernels (docs/DESIGN.md section 10). The wheel (~300 MB) is larger than one device call carries, so
``pack`` strips what a FLASH_ATTN run never imports (vLLM's own ``_vllm_fa2_C``, which ours replaces,
and the MoE, FlashMLA, DeepGEMM, SM100 FMHA and qutlass parts), xz-compresses the rest and splits it
into parts of at most ``--part-mib``; each part travels in its own back-to-back call and waits
outside the work tree while the machine stays warm; ``assemble`` checks every part's sha256 and
unpacks them. ``judge`` compares fa2patch's run with vLLM's own backends on the same model.

    python3 -m fa2patch.lab.engine pack WHEEL DIR [--part-mib N]    (here: needs the wheel only)
    python3 -m fa2patch.lab.engine assemble DIR SITE                (on the lab)
    python3 -m fa2patch.lab.engine judge RESULTS.json               (anywhere)
"""

import argparse
import io
import json
import sys
import tarfile
import zipfile
from pathlib import Path

from fa2patch.common.digest import sha256_bytes as sha256
from fa2patch.common.errors import mismatch

RELEASE = "0.26.0"
# The wheel `prepare` downloads (vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl, 303,698,761 bytes):
# the lab run of docs/lab/2026-12-02-series-0001-0004-vllm-engine/ used these bytes.
WHEEL_SHA256 = "adb1e4c9b46d0dfdb094121ae5aad670a42412dd813ed4e5db069ed6a15006de"

# Members of vLLM's wheel that a FLASH_ATTN / FA3 / TRITON_ATTN run of a dense model does not import.
STRIPPED = (
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",  # ours goes here
    "vllm/_moe_C_stable_libtorch.abi3.so",
    "vllm/_flashmla_C.abi3.so",
    "vllm/_flashmla_extension_C.abi3.so",
    "vllm/_qutlass_C.abi3.so",
    "vllm/vllm-rs",
    "vllm/third_party/deep_gemm/",
    "vllm/third_party/fmha_sm100/",
)

MANIFEST = "engine-manifest.json"


def stripped(name: str) -> str | None:
    """The STRIPPED entry that leaves ``name`` out, if one does."""
    return next((s for s in STRIPPED if name == s or (s.endswith("/") and name.startswith(s))), None)


def pack(wheel: Path, out: Path, part_bytes: int, expected_sha256: str | None = WHEEL_SHA256) -> dict:
    """The wheel's kept members as one .tar.xz split into parts of at most ``part_bytes`` in
    ``out``, and the manifest (the wheel's and every part's sha256, what was left out). A wheel
    whose sha256 is not ``expected_sha256`` (None: any) is refused."""
    raw = wheel.read_bytes()
    if expected_sha256 is not None and sha256(raw) != expected_sha256:
        raise SystemExit(mismatch("sha256", str(wheel), expected_sha256, sha256(raw)))
    buffer = io.BytesIO()
    left_out = dict.fromkeys(STRIPPED, 0)
    with zipfile.ZipFile(io.BytesIO(raw)) as z, tarfile.open(fileobj=buffer, mode="w:xz") as tar:
        for info in z.infolist():
            if info.is_dir():
                continue
            pattern = stripped(info.filename)
            if pattern:
                left_out[pattern] += 1
                continue
            member = tarfile.TarInfo(info.filename)
            data = z.read(info)
            member.size, member.mode = len(data), (info.external_attr >> 16) & 0o777 or 0o644
            tar.addfile(member, io.BytesIO(data))
    packed = buffer.getvalue()
    out.mkdir(parents=True, exist_ok=True)
    parts: list[dict] = []
    for i in range(0, len(packed), part_bytes):
        chunk = packed[i : i + part_bytes]
        name = f"vllm-{RELEASE}.tar.xz.part{len(parts):02d}"
        (out / name).write_bytes(chunk)
        parts.append({"name": name, "bytes": len(chunk), "sha256": sha256(chunk)})
    manifest = {
        "wheel": wheel.name,
        "wheel_sha256": sha256(raw),
        "tar_sha256": sha256(packed),
        "parts": parts,
        "left_out": left_out,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def assemble(parts_dir: Path, site: Path) -> dict:
    """Unpack the parts in ``parts_dir`` (its manifest's, each checked) into ``site``; an error
    names the part that is missing or differs."""
    manifest = json.loads((parts_dir / MANIFEST).read_text())
    data = bytearray()
    for part in manifest["parts"]:
        path = parts_dir / part["name"]
        if not path.is_file():
            raise SystemExit(f"{path}: missing (send every part of {MANIFEST} first)")
        chunk = path.read_bytes()
        if sha256(chunk) != part["sha256"]:
            raise SystemExit(f"{path}: sha256 {sha256(chunk)}, expected {part['sha256']}")
        data += chunk
    if sha256(bytes(data)) != manifest["tar_sha256"]:
        raise SystemExit(f"{parts_dir}: the joined parts' sha256 is not {manifest['tar_sha256']}")
    site.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(bytes(data)), mode="r:xz") as tar:
        tar.extractall(site, filter="data")
    return manifest


# --- the verdict ------------------------------------------------------------------------------------


def max_abs_gap(a: list[list[float]], b: list[list[float]]) -> float:
    """The largest |a - b| over the prompts' positions (lists per prompt, the same lengths)."""
    gaps = [abs(x - y) for pa, pb in zip(a, b, strict=True) for x, y in zip(pa, pb, strict=True)]
    return max(gaps, default=0.0)


LONG_PREFILL = "sm70-gqa-prefill"


def long_prefill_heads(heads: dict, limits: dict) -> bool:
    """The model's heads are the long-prefill route's (head dim 256, whole groups of at most
    route_stats()'s max_group): only then does the V100 backend plan a split."""
    group, rest = divmod(heads["num_attention_heads"], heads["num_key_value_heads"])
    return heads["head_dim"] == 256 and rest == 0 and group <= limits["max_group"]


def route_check(run: dict, layers: int, heads: dict) -> dict:
    """For a run of fa2patch's V100 backend: on a model whose heads the long-prefill route serves,
    every prefill chunk that route takes by route_stats()'s thresholds (rows and keys logged per
    batch) had a segment of its own, and the extension counted one long-prefill call per such chunk
    and layer; on any other model, no split and no long-prefill call. Other runs: the long-prefill
    calls counted, nothing judged."""
    stats = run.get("route_stats")
    if stats is None:
        return {}
    calls = sum(d["routes"].get(LONG_PREFILL, 0) for d in stats["devices"].values())
    if "segments" not in run:
        return {"long_prefill_calls": calls}
    limits = stats["long_prefill"]
    eligible = long_prefill_heads(heads, limits)
    qualifying = eligible * sum(
        rows >= limits["min_seqlen_q"] and keys >= limits["min_seqlen_k"]
        for batch in run["segments"]
        for rows, keys in zip(batch["rows"], batch["keys"], strict=True)
    )
    own = sum(batch["segments"].count("long_prefill") for batch in run["segments"])
    expected = (own > 0 or not limits["enabled"]) if eligible else not run["segments"]
    return {
        "long_prefill_calls": calls,
        "qualifying_chunks": qualifying,
        "own_segments": own,
        "routes_ok": qualifying == own and calls == own * layers and expected,
    }


def judge(results: dict) -> dict:
    """fa2patch's runs against vLLM's own backends on the same model and prompts.

    ``results``: {"runs": {label: {"backend", "mode", "tokens": [[ids] per prompt], "prompt_logprobs":
    [[float] per prompt], "route_stats": ...}}, "references": [label, label]} with the two references
    (vLLM's FA3 and TRITON_ATTN). fa2patch passes where, for every run of its own, the largest
    prompt-logprob gap to either reference is at most the gap between the two references (their
    spread) plus 1e-3, its greedy tokens agree with a reference wherever the references agree
    with each other, and a V100-backend run passes ``route_check`` (``results["layers"]``: the
    model's attention layers; ``results["heads"]``: its num_attention_heads, num_key_value_heads
    and head_dim)."""
    missing = [k for k in ("runs", "references", "layers", "heads") if k not in results]
    if missing:
        raise ValueError(
            f"missing {', '.join(missing)}: ci/vllm-lab/engine_run.py writes runs, references, layers and "
            "heads ({num_attention_heads, num_key_value_heads, head_dim})"
        )
    runs, (r1, r2) = results["runs"], results["references"]
    ref_a, ref_b = runs[r1], runs[r2]
    spread = max_abs_gap(ref_a["prompt_logprobs"], ref_b["prompt_logprobs"])
    verdicts: dict[str, dict] = {}
    for label, run in runs.items():
        if label in (r1, r2):
            continue
        gap = max(max_abs_gap(run["prompt_logprobs"], ref["prompt_logprobs"]) for ref in (ref_a, ref_b))
        tokens_ok = all(
            ta != tb or t == ta for t, ta, tb in zip(run["tokens"], ref_a["tokens"], ref_b["tokens"], strict=True)
        )
        routes = route_check(run, results["layers"], results["heads"])
        verdicts[label] = {
            "max_logprob_gap": gap,
            "within_spread": gap <= spread + 1e-3,
            "tokens_agree": tokens_ok,
            **routes,
            "pass": gap <= spread + 1e-3 and tokens_ok and routes.get("routes_ok", True),
        }
    passed = bool(verdicts) and all(r["pass"] for r in verdicts.values())
    return {"reference_spread": spread, "runs": verdicts, "pass": passed}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m fa2patch.lab.engine", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="strip, compress and split vLLM's wheel into DIR")
    p.add_argument("wheel", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--part-mib", type=int, default=46)
    p = sub.add_parser("assemble", help="check and unpack DIR's parts into SITE")
    p.add_argument("parts", type=Path)
    p.add_argument("site", type=Path)
    p = sub.add_parser("judge", help="judge an engine run's results JSON; exit 0 iff it passes")
    p.add_argument("results", type=Path)
    args = ap.parse_args(argv)
    if args.command == "pack":
        m = pack(args.wheel, args.out, args.part_mib << 20)
        size = sum(p["bytes"] for p in m["parts"]) >> 20
        print(f"{args.out}: {len(m['parts'])} parts, {size} MiB; left out {sum(m['left_out'].values())} files")
        return 0
    if args.command == "assemble":
        m = assemble(args.parts, args.site)
        print(f"{args.site}: {m['wheel']} ({len(m['parts'])} parts)")
        return 0
    try:
        verdict = judge(json.loads(args.results.read_text()))
    except ValueError as exc:
        print(f"{args.results}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(verdict, indent=1))
    return 0 if verdict["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
