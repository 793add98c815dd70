# SPDX-License-Identifier: BSD-3-Clause
"""The GPU lab scripts' logic: ci/gpu-lab.sh, ci/gpu-sanitize.sh and ci/gpu-vllm.sh orchestrate, these
functions decide (tests/test_labtools.py runs them on the CPU).

    python3 -m fa2patch.lab.labtools COMMAND ...   (python3 -m fa2patch.lab.labtools --help lists them)

Runs with the lab machine's python3 (torch, no network; tomlkit and gitpython from the .lab wheels):
only `banner` and `gpu-arch` import torch, only `sdist-name` reads the lock (tomlkit), and only
`vllm-prepare` needs the network (it runs where `bash ci/gpu-vllm.sh prepare` runs).
"""

import argparse
import json
import os
import re
import shlex
import sys
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path

# --- ci/gpu-lab.sh --------------------------------------------------------------------------------


def sdist_name(root: Path) -> str:
    """The baseline sdist's file name, as baseline.lock pins it (what .lab/ carries)."""
    from fa2patch.common.lockfile import Lock
    from fa2patch.common.project import LOCK_NAME

    return Lock.load(root / LOCK_NAME).baseline.archive


def merge_sanitizer(summary: dict, sanitize: dict) -> dict:
    """gpu-summary.json with the sanitizer's verdicts (sanitize-summary.json) under "sanitizer"."""
    families = {f: "clean" if v["clean"] else "dirty" for f, v in sanitize["families"].items()}
    return {**summary, "sanitizer": {"clean": sanitize["clean"], "families": families}}


# The host compilers the lab image may name (its /opt/gcc links libstdc++ statically, which breaks the
# extension): the banner records them, ci/gpu-lab.sh unsets them.
COMPILER_VARIABLES = ("CXX", "CC", "CUDAHOSTCXX", "NVCC_CCBIN")


def banner() -> str:
    """The lab's Python, torch and GPU, and the compiler variables it was started with, one line (imports torch)."""
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    compilers = " ".join(f"{v}={os.environ[v]}" for v in COMPILER_VARIABLES if v in os.environ) or "none set"
    return f"[lab] python {sys.version.split()[0]} torch {torch.__version__} {gpu}; compiler variables: {compilers}"


# tests/gpu runs as several pytest sessions at once: the numerics file has its own pool of cases, every
# other test runs its op in a subprocess of its own (seconds each), so one serial session outgrows a
# 10-minute device call. These files get a session each; the rest share one.
OWN_SESSION = ("test_sm70_numerics.py", "test_routing_gpu.py", "test_tune_gpu.py")


def session_groups(gpu_tests: Path) -> list[list[Path]]:
    """tests/gpu's test files in groups, one pytest session per group (OWN_SESSION first, then the rest)."""
    files = sorted(gpu_tests.glob("test_*.py"))
    own = [[f] for name in OWN_SESSION for f in files if f.name == name]
    rest = [f for f in files if f.name not in OWN_SESSION]
    return own + ([rest] if rest else [])


def _badness(value) -> tuple[int, float]:
    """A summary metric's order of badness; JSON spells NaN and infinities as strings (tests/gpu/conftest.py)."""
    if isinstance(value, str):
        return (1, 0.0) if value == "nan" else (0, float(value))
    return (0, float(value))


def merge_summaries(parts: list[dict]) -> dict:
    """One gpu-summary.json from the summaries of several pytest sessions (a family in several parts: its
    cases together, its worst metrics the worst of them)."""
    families: dict[str, dict] = {}
    for part in parts:
        for name, fam in part.get("families", {}).items():
            if name not in families:
                families[name] = json.loads(json.dumps(fam))
                continue
            into = families[name]
            into["cases"] += fam["cases"]
            into["ok"] = into["ok"] and fam["ok"]
            into["failed"] += fam["failed"]
            into["results"] += fam["results"]
            for metric, value in fam["worst"].items():
                if isinstance(value, bool):
                    into["worst"][metric] = into["worst"].get(metric, True) and value
                elif metric not in into["worst"] or _badness(value) > _badness(into["worst"][metric]):
                    into["worst"][metric] = value
                    into["worst_case"][metric] = fam["worst_case"][metric]
    cases = sum(part.get("cases", 0) for part in parts)
    oks = [part["ok"] for part in parts if part.get("ok") is not None]
    merged = {
        "cases": cases,
        "ok": all(oks) if oks else None,
        "failed": [f for part in parts for f in part.get("failed", [])],
        "families": families,
    }
    if not cases:
        merged["note"] = "no numerics case ran in any session"
    return merged


# --- ci/gpu-sanitize.sh ---------------------------------------------------------------------------

# Cases are tests/gpu/sanitize_cases.py's lines: family|harness|spec (spec: JSON).
SANITIZER_SUMMARY_LINE = re.compile(r"ERROR SUMMARY|RACECHECK SUMMARY")
SANITIZER_INTERNAL_ERROR = "Internal Sanitizer Error"


def filter_cases(lines: Iterable[str], families: str) -> list[str]:
    """The case lines whose family matches the regular expression ``families`` as a whole."""
    pattern = re.compile(families)
    return [line for line in lines if line.strip() and pattern.fullmatch(line.split("|", 1)[0])]


def sanitize_record(tool: str, case: str, rc: int, log: str) -> dict:
    """One sanitizer run's record: the case, the exit status and the verdict read from its log.

    clean: exit status 0; dirty: any other; sanitizer-internal-error: the log says so (whatever the
    status). summary: the log's first ERROR/RACECHECK SUMMARY line, '"' and '=' removed."""
    family, harness, spec = case.rstrip("\n").split("|", 2)
    verdict = "clean" if rc == 0 else "dirty"
    if SANITIZER_INTERNAL_ERROR in log:
        verdict = "sanitizer-internal-error"
    summary = next((line for line in log.splitlines() if SANITIZER_SUMMARY_LINE.search(line)), "")
    return {
        "tool": tool,
        "family": family,
        "harness": Path(harness).name,
        "spec": json.loads(spec),
        "rc": rc,
        "verdict": verdict,
        "summary": summary.replace('"', "").replace("=", ""),
    }


def append_line(path: Path, record: dict) -> None:
    """Append ``record`` as one JSON line with one write (parallel runs append to one file)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def sanitize_summary(rows: list[dict]) -> dict:
    """Per family the number of runs and whether all were clean; clean overall only if every run
    was (and there was one: no run proves nothing)."""
    families: dict[str, dict] = {}
    for r in rows:
        fam = families.setdefault(r["family"], {"runs": 0, "clean": True})
        fam["runs"] += 1
        fam["clean"] &= r["verdict"] == "clean"
    return {"clean": bool(rows) and all(r["verdict"] == "clean" for r in rows), "families": families, "runs": rows}


# --- ci/gpu-vllm.sh -------------------------------------------------------------------------------

# The vLLM source files the lab needs beside its Python package (tests/conftest.py's vllm_src too):
# its FA2 kernel test, and the CMake files LAB_VLLM_CMAKE=1 builds with.
VLLM_LAB_FILES = (
    "tests/kernels/attention/test_flash_attn.py",
    "CMakeLists.txt",
    "cmake/utils.cmake",
    "cmake/external_projects/vllm_flash_attn.cmake",
)
# vLLM 0.33.0's test_varlen_with_paged_kv, FA2 with fp16 and no quantized query: 2 use_out x 2 seq_lens
# x 2 num_heads x 5 head sizes x 2 sliding windows x 2 num_blocks.
EXPECTED_FA2_FP16 = 2 * 2 * 2 * 5 * 2 * 2
# ci/vllm-lab/test_kv_cache_views.py: 2 seq_lens x 3 num_heads x 3 head sizes x 2 block sizes.
EXPECTED_KV_VIEWS = 2 * 3 * 3 * 2
# ci/vllm-lab/test_per_request_backend.py: 3 batches with long chunks, 3 batches of one call.
BACKEND_TESTS = (
    "test_every_chunk_on_the_long_prefill_route",
    "test_one_call_where_nothing_can_take_the_long_prefill_route",
)
EXPECTED_BACKEND = 3 + 3
FP16_ONLY = ("DTYPES = [torch.bfloat16]\n", "DTYPES = [torch.float16]\n")


# The releases the lab runs vLLM's FA2 test for by default: the primary one and the source-build one.
SOURCE_BUILD_RELEASE = "0.33.0"


def vllm_versions() -> list[str]:
    """The primary release and the source-build release (packaging/vllm-releases.toml)."""
    from fa2patch.common.project import Project
    from fa2patch.vllm import releases

    matrix = releases.load(Project.find())
    return list(dict.fromkeys([matrix.primary.version, SOURCE_BUILD_RELEASE]))


def vllm_prepare(archive: Path, version: str) -> str:
    """Write ``archive`` (.tar.gz): a supported vLLM release's Python sources and VLLM_LAB_FILES, from
    its sha256-pinned sdist (fetched through the package index). Returns a line saying what."""
    from fa2patch.common.errors import EnvironmentProblem
    from fa2patch.common.project import Project
    from fa2patch.vllm import releases
    from fa2patch.vllm.sdist import extract_vllm_sources

    project = Project.find()
    matrix = releases.load(project)
    release = matrix.get(version)
    if release is None:
        raise EnvironmentProblem(f"vLLM {version}: not in {matrix.path} (supported: {', '.join(matrix.versions())})")
    with tempfile.TemporaryDirectory() as tmp:
        src = extract_vllm_sources(project, Path(tmp), VLLM_LAB_FILES, release)
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(src, arcname=src.name)
    return f"[vllm] {archive}: {archive.stat().st_size / 2**20:.1f} MiB ({src.name})"


def fp16_only(text: str, where: str) -> str:
    """vLLM's test_flash_attn.py with DTYPES = [torch.float16] (V100 has no bf16 tensor cores)."""
    old, new = FP16_ONLY
    if text.count(old) != 1:
        raise ValueError(f"{where}: expected one line {old!r}, found {text.count(old)}: vLLM's test changed")
    return text.replace(old, new)


def fa2_cases(rows: list[dict]) -> list[dict]:
    """vLLM's FA2 cases without a quantized query."""
    return [
        c for c in rows if c["test"] == "test_varlen_with_paged_kv" and c["fa_version"] == 2 and c["q_dtype"] == "None"
    ]


def view_cases(rows: list[dict]) -> list[dict]:
    return [c for c in rows if c["test"] == "test_vllm_kv_cache_views"]


def backend_cases(rows: list[dict]) -> list[dict]:
    return [c for c in rows if c["test"] in BACKEND_TESTS]


def through_vllm(summary: dict) -> bool:
    """vLLM's interface imported the extension from vllm/vllm_flash_attn/ (nothing loaded it by hand)."""
    return bool(summary["imported_by_vllm_interface"] and summary["extension"] == summary["expected_extension"])


def collect_verdict(summary: dict) -> tuple[bool, str]:
    """`collect` (the CPU check): every expected case collected, the extension where vLLM installs it."""
    rows = summary["collected"]
    fa2 = [c for c in fa2_cases(rows) if c["dtype"] == "torch.float16"]
    views, ours = view_cases(rows), backend_cases(rows)
    line = (
        f"[vllm] collected {len(rows)}: {len(fa2)} vLLM FA2 fp16 cases, {len(views)} KV-view cases, "
        f"{len(ours)} per-request backend cases; extension {summary['extension']}"
    )
    ok = (
        (len(fa2), len(views), len(ours)) == (EXPECTED_FA2_FP16, EXPECTED_KV_VIEWS, EXPECTED_BACKEND)
        and through_vllm(summary)
        and bool(summary["fa2patch_ops"])
    )
    return ok, line


def run_verdict(summary: dict, pytest_rc: int) -> dict[str, bool]:
    """`run`: the checks, by name (they go into vllm-summary.json as "verdict")."""
    cases = summary["cases"]
    fa2, views, ours = fa2_cases(cases), view_cases(cases), backend_cases(cases)
    passed = lambda rows: sum(c["outcome"] == "passed" for c in rows)  # noqa: E731
    checks = {
        "vLLM's interface imported the extension from vllm/vllm_flash_attn/": through_vllm(summary),
        "the operators are fa2patch's (build_info)": summary["fa2patch_ops"],
        "SM70 kernels forced": summary["force_sm70"] == "1",
        f"vLLM FA2 fp16 cases: {EXPECTED_FA2_FP16} passed (got {passed(fa2)} of {len(fa2)})": len(fa2)
        == EXPECTED_FA2_FP16
        and passed(fa2) == len(fa2)
        and all(c["dtype"] == "torch.float16" for c in fa2),
        f"KV-cache view cases: {EXPECTED_KV_VIEWS} passed (got {passed(views)} of {len(views)})": len(views)
        == EXPECTED_KV_VIEWS
        and passed(views) == len(views),
        f"per-request backend cases: {EXPECTED_BACKEND} passed (got {passed(ours)} of {len(ours)})": len(ours)
        == EXPECTED_BACKEND
        and passed(ours) == len(ours),
        "no failure anywhere": pytest_rc == 0 and not [c for c in cases if c["outcome"] == "failed"],
    }
    return {k: bool(v) for k, v in checks.items()}


def gpu_arch() -> str | None:
    """sm_XY of this machine's first GPU, None without one (imports torch)."""
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


# --- command line ---------------------------------------------------------------------------------


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fa2patch.lab.labtools", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("banner", help="print the lab's Python, torch and GPU (imports torch)")
    p = sub.add_parser("sdist-name", help="print the baseline sdist's file name (baseline.lock)")
    p.add_argument("--root", type=Path, default=Path.cwd())
    p = sub.add_parser("test-groups", help="print tests/gpu's files, one line per pytest session")
    p.add_argument("gpu_tests", type=Path)
    p = sub.add_parser("merge-summaries", help="write OUT from the sessions' summaries (missing ones: an error)")
    p.add_argument("out", type=Path)
    p.add_argument("parts", type=Path, nargs="+")
    p = sub.add_parser("merge-sanitizer", help="add sanitize-summary.json's verdicts to gpu-summary.json")
    p.add_argument("summary", type=Path)
    p.add_argument("sanitize", type=Path)
    p = sub.add_parser("sanitize-filter", help="stdin's case lines whose family matches REGEX (a whole match)")
    p.add_argument("families", metavar="REGEX")
    p = sub.add_parser("sanitize-record", help="append one run's record (JSON line) to --out")
    p.add_argument("--tool", required=True)
    p.add_argument("--case", required=True, help="family|harness|spec")
    p.add_argument("--rc", type=int, required=True)
    p.add_argument("--log", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p = sub.add_parser("sanitize-summary", help="write the summary of a results file; exit 0 iff every run is clean")
    p.add_argument("results", type=Path)
    p.add_argument("summary", type=Path)
    sub.add_parser("vllm-versions", help="print the vLLM releases the lab tests by default")
    p = sub.add_parser("vllm-prepare", help="write the vLLM source archive the lab carries (needs the network)")
    p.add_argument("archive", type=Path)
    p.add_argument("--release", required=True, help="a version of packaging/vllm-releases.toml")
    p = sub.add_parser("vllm-fp16-test", help="copy vLLM's test_flash_attn.py with DTYPES = [torch.float16]")
    p.add_argument("source", type=Path)
    p.add_argument("dest", type=Path)
    p = sub.add_parser("shell-words", help="print TEXT's words as a POSIX shell splits them, one per line")
    p.add_argument("text")
    sub.add_parser("gpu-arch", help="print sm_XY of this GPU; exit 3 without a GPU (imports torch)")
    p = sub.add_parser("vllm-verdict", help="judge vllm-summary.json: --collected, or a run with --pytest-rc")
    p.add_argument("summary", type=Path)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--collected", action="store_true")
    mode.add_argument("--pytest-rc", type=int)
    args = ap.parse_args(argv)

    if args.command == "banner":
        print(banner())
    elif args.command == "sdist-name":
        print(sdist_name(args.root))
    elif args.command == "test-groups":
        for group in session_groups(args.gpu_tests):
            print(" ".join(str(f) for f in group))
    elif args.command == "merge-summaries":
        missing = [str(p) for p in args.parts if not p.is_file()]
        if missing:
            print(f"merge-summaries: no summary written by {', '.join(missing)}", file=sys.stderr)
            return 1
        _write_json(args.out, merge_summaries([_read_json(p) for p in args.parts]))
    elif args.command == "merge-sanitizer":
        _write_json(args.summary, merge_sanitizer(_read_json(args.summary), _read_json(args.sanitize)))
    elif args.command == "sanitize-filter":
        for line in filter_cases(sys.stdin, args.families):
            print(line.rstrip("\n"))
    elif args.command == "sanitize-record":
        log = args.log.read_text(errors="replace") if args.log.is_file() else ""
        append_line(args.out, sanitize_record(args.tool, args.case, args.rc, log))
    elif args.command == "sanitize-summary":
        text = args.results.read_text()
        summary = sanitize_summary([json.loads(line) for line in text.splitlines() if line.strip()])
        _write_json(args.summary, summary)
        print("[sanitize]", {f: v["clean"] for f, v in summary["families"].items()})
        print("[sanitize] clean runs:", sum(r["verdict"] == "clean" for r in summary["runs"]))
        print("[sanitize] runs:", len(summary["runs"]))
        return 0 if summary["clean"] else 1
    elif args.command == "vllm-versions":
        print(" ".join(vllm_versions()))
    elif args.command == "vllm-prepare":
        print(vllm_prepare(args.archive, args.release))
    elif args.command == "vllm-fp16-test":
        args.dest.write_text(fp16_only(args.source.read_text(), str(args.source)))
    elif args.command == "shell-words":  # LAB_PYTEST_ARGS="-k 'a or b'" keeps its quoted words
        for word in shlex.split(args.text):
            print(word)
    elif args.command == "gpu-arch":
        arch = gpu_arch()
        if arch is None:
            return 3
        print(arch)
    elif args.command == "vllm-verdict":
        summary = _read_json(args.summary)
        if args.collected:
            ok, line = collect_verdict(summary)
            print(line)
            return 0 if ok else 1
        summary["verdict"] = run_verdict(summary, args.pytest_rc)
        summary["ok"] = all(summary["verdict"].values())
        _write_json(args.summary, summary)
        for k, v in summary["verdict"].items():
            print(f"[vllm] {'ok  ' if v else 'FAIL'} {k}")
        return 0 if summary["ok"] else 1
    return 0


if __name__ == "__main__":
    from fa2patch.common.errors import Fa2PatchError

    try:
        sys.exit(main())
    except Fa2PatchError as exc:
        print(f"[lab] error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except ValueError as exc:
        print(f"[lab] error: {exc}", file=sys.stderr)
        sys.exit(2)
