"""The `fa2patch` command line. Exit codes: 0 ok, 1 a check or build step failed,
2 usage or environment error, 3 nothing to launch on this machine (see README.md).

With --json every command writes exactly one JSON object to stdout, with an "ok" field, also
when it fails ({"ok": false, "error": ..., "exit_code": ...}); progress and compiler output go
to stderr. The exit code is the same with and without --json.
"""

import contextlib
import json
import sys
from dataclasses import asdict
from pathlib import Path

import click

from . import __version__, routes
from .errors import EXIT_CHECK_FAILED, EXIT_USAGE, Fa2PatchError
from .lockfile import Lock
from .project import Project
from .tables import table

ARCH_HELP = "target architecture declared by the tree's fa2patch-build.toml (sm_70; sm_90 = H200 lab)"


def _finish(as_json: bool, result: dict, text) -> int:
    """Print the result (JSON, or ``text()``), and return the exit code its "ok" implies."""
    if as_json:
        click.echo(json.dumps(result, indent=1))
    else:
        click.echo(text())
    return 0 if result["ok"] else EXIT_CHECK_FAILED


class Context:
    def __init__(self):
        self._project = None

    @property
    def project(self) -> Project:
        if self._project is None:
            self._project = Project.find()
        return self._project

    def lock(self) -> Lock:
        return Lock.load(self.project.lock_path)

    def workspace(self, given: str | None) -> Path:
        return Path(given).resolve() if given else self.project.default_workspace


pass_ctx = click.make_pass_decorator(Context, ensure=True)
workspace_option = click.option("--workspace", "workspace", type=click.Path(file_okay=False),
                                help="the git workspace [default: <project>/work/flash-attn]")
json_option = click.option("--json", "as_json", is_flag=True,
                           help="print one JSON object (with an \"ok\" field) on stdout, errors included")
python_option = click.option("--python", type=click.Path(dir_okay=False, exists=True), default=None,
                              help="the Python interpreter whose torch to build against / load with "
                                   "(e.g. your vLLM venv's bin/python) [default: the one running fa2patch]")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fa2patch")
def cli():
    """Build vLLM's `_vllm_fa2_C` for V100 (sm_70) from a locked FlashAttention release and
    an ordered patch series.

    Pipeline: fetch -> replay -> build -> verify -> smoke; export writes workspace commits
    back to patches/. Exit codes: 0 ok, 1 a check or build step failed, 2 usage or
    environment error, 3 nothing to launch on this machine (smoke, bench, tune). With --json, every
    command prints one JSON object with an "ok" field, errors included.
    """


@cli.command()
@click.option("--sdist", type=click.Path(dir_okay=False, path_type=Path),
              help="use this local archive (offline); it is verified and replaces the cached one")
@click.option("--index-url", help="package index to use instead of pip's configured ones")
@click.option("--force", is_flag=True, help="download again even if the cache holds the archive")
@json_option
@pass_ctx
def fetch(ctx, sdist, index_url, force, as_json):
    """Download the pristine baseline archive, verify its sha256 and cache it."""
    from .fetch import fetch as do_fetch

    lock = ctx.lock()
    path = do_fetch(lock, sdist=sdist, index_url=index_url, force=force, quiet=as_json)
    return _finish(as_json, {"ok": True, "archive": str(path), "sha256": lock.baseline.sha256},
                   lambda: f"{path}: sha256 {lock.baseline.sha256} verified")


@cli.command()
@workspace_option
@click.option("--force", is_flag=True, help="discard a dirty or diverging workspace")
@click.option("--sdist", type=click.Path(dir_okay=False, path_type=Path),
              help="use this local archive (offline); it is verified and replaces the cached one")
@json_option
@pass_ctx
def replay(ctx, workspace, force, sdist, as_json):
    """Import the pristine tree and apply every patch as one deterministic commit each."""
    from . import gitws
    from .replay import replay as do_replay

    lock, ws = ctx.lock(), ctx.workspace(workspace)
    outcome = do_replay(lock, ctx.project.patches_dir, ws, force=force, sdist=sdist,
                        echo=(lambda m: None) if as_json else click.echo)
    commits = [c.hexsha for c in gitws.series_commits(gitws.open_repo(ws))]
    return _finish(as_json, {"ok": True, "workspace": str(ws), "outcome": outcome, "commits": commits,
                             "tree_digest": lock.final_digest()},
                   lambda: f"{ws}: {outcome}; {len(commits) - 1} patch(es) on the pristine import; "
                           f"HEAD {commits[-1][:12]}, tree {lock.final_digest()}")


@cli.command()
@workspace_option
@json_option
@pass_ctx
def export(ctx, workspace, as_json):
    """Write the workspace commits back to patches/ and update baseline.lock."""
    from .export import export as do_export

    lock, ws = ctx.lock(), ctx.workspace(workspace)
    changed = do_export(lock, ws, ctx.project.patches_dir)
    return _finish(as_json, {"ok": True, "changed": changed, "patches": [asdict(p) for p in lock.patches]},
                   lambda: f"exported {len(lock.patches)} patch(es); changed: {', '.join(changed) or 'nothing'}")


@cli.command()
@workspace_option
@json_option
@pass_ctx
def check(ctx, workspace, as_json):
    """Verify that the lock, patches/, pyproject.toml's pins, the cached archive and the workspace agree."""
    from .check import check as do_check

    findings = do_check(ctx.lock(), ctx.project.patches_dir, ctx.workspace(workspace),
                        ctx.project.pyproject_path)
    return _finish(as_json, {"ok": all(f.ok for f in findings), "findings": [asdict(f) for f in findings]},
                   lambda: table([[f.item, "ok" if f.ok else "FAIL", f.detail] for f in findings],
                                  ["item", "status", "detail"]))


@cli.command()
@click.option("--vllm", "vllm_python", type=click.Path(dir_okay=False, exists=True), default=None,
              metavar="PYTHON", help="instead: check that interpreter's environment for the vLLM path (vLLM and "
                                     "the torch it pins, their sm_70 code, nvcc, the fa2patch plugin) and print "
                                     "the next command or why it cannot work (exit 1 unless ready)")
@json_option
@pass_ctx
def doctor(ctx, vllm_python, as_json):
    """List the tools the build needs against the lock's pins: what is present, what is missing
    and how to install it. Fails (exit 2) when a required one is missing; optional ones warn.
    With --vllm PYTHON: is that vLLM environment ready for FlashAttention-2 on a V100, and if not,
    the exact next command or the exact reason it cannot work."""
    if vllm_python:
        return _doctor_vllm(ctx, vllm_python, as_json)
    from .toolchain import doctor as do_doctor

    items = do_doctor(ctx.lock().toolchain)
    missing = [i.name for i in items if i.required and not i.found]
    result = {"ok": not missing, "missing": missing, "items": [asdict(i) for i in items]}

    def text():
        return table([[i.name, "ok" if i.found else ("MISSING" if i.required else "missing, optional"),
                        i.required_for, i.detail + ("" if i.found else f"\ninstall: {i.install}")]
                       for i in items], ["component", "status", "needed for", "detail"])

    _finish(as_json, result, text)
    return 0 if result["ok"] else EXIT_USAGE


def _doctor_vllm(ctx, python: str, as_json: bool) -> int:
    from .vllm_sdist import vllm_release
    from .vllm_doctor import diagnose

    result = diagnose(python, ctx.project.root, vllm_release(ctx.project))

    def text():
        lines = [table([[c["name"], {True: "ok", False: "NO", None: "-"}[c["ok"]], c["detail"]]
                         for c in result["checks"]], ["check", "status", "detail"]), ""]
        if result["verdict"] == "ready":
            lines.append("ready: " + result["ready"])
        elif result["verdict"] == "next":
            lines.append("next: " + result["next"])
        else:
            lines += ["cannot work: " + result["reason"], "instead: " + result["instead"]]
        return "\n".join(lines)

    return _finish(as_json, result, text)


@cli.command()
@click.option("--arch", default="sm_70", show_default=True, help=ARCH_HELP)
@click.option("--cuda-compiler", type=click.Choice(["auto", "nvcc", "clang"]), default="auto",
              show_default=True, help="auto: nvcc if it can target --arch, else clang-22 + wheels")
@click.option("-j", "--jobs", type=click.IntRange(min=1), help="parallel compile jobs [default: CPUs]")
@click.option("--allow-torch-without-sm70", "check_only", is_flag=True,
              help="build and verify against a torch that cannot run the result (no code for --arch, or "
                   "another CUDA major, e.g. the package index's torch 2.14.0+cu130): a check that the sources "
                   "build and load with it; recorded in the manifest, and `package` refuses the build")
@python_option
@workspace_option
@json_option
@pass_ctx
def build(ctx, arch, cuda_compiler, jobs, check_only, python, workspace, as_json):
    """Compile `_vllm_fa2_C` from the workspace for one architecture; write manifest.json.

    With --python, build against the torch of another environment (headers, C++ ABI flag and
    CUDA version read from that interpreter; a torch without code for --arch is refused unless
    --allow-torch-without-sm70). The sources are compiled as C++20 (torch >= 2.10 requires it)."""
    from .build import build as do_build

    lock, ws = ctx.lock(), ctx.workspace(workspace)
    out = ctx.project.build_dir(arch)
    manifest = do_build(ws, arch, out, lock.toolchain, cuda_compiler, jobs, expected_digest=lock.final_digest(),
                        echo=lambda m: click.echo(m, err=as_json), python=python or sys.executable,
                        check_only=check_only)
    if manifest["source_matches_lock"] is False:
        click.echo("warning: the workspace tree differs from the lock (uncommitted or unexported "
                   "work); this build is not the locked series", err=True)
    return _finish(as_json, {"ok": True, "build_dir": str(out), "manifest": manifest},
                   lambda: f"{out / manifest['artifact']['file']}: sha256 {manifest['artifact']['sha256']}, "
                           f"{len(manifest['ptxas_kernels'])} kernel(s), {manifest['wall_seconds']} s"
                           + (" (check-only: not for packaging)" if manifest["check_only"] else ""))


@cli.command()
@click.option("--arch", default="sm_70", show_default=True, help=ARCH_HELP)
@click.option("--artifact", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="verify this extension instead of build/<arch> (one built without fa2patch build, "
                   "e.g. by the --vllm-src CMake); its tensor-core kernels come from --workspace's "
                   "fa2patch-build.toml, spills from its stack frames")
@python_option
@workspace_option
@json_option
@pass_ctx
def verify(ctx, arch, artifact, python, workspace, as_json):
    """Check the operator schemas, the artifact's hygiene (libraries, RPATH, build paths, CPython
    ABI) and every kernel's registers, spills, shared memory and SASS. The extension is loaded
    with the interpreter it was built for (manifest), or --python."""
    from . import verify as v
    from .build import artifact_manifest

    p = ctx.project
    if artifact is None:
        manifest, rows = v.verify(p.build_dir(arch), p.schemas_path, p.budgets_path, python,
                                  (p.root, ctx.workspace(workspace)))
    else:
        tree = ctx.workspace(workspace)
        manifest = artifact_manifest(artifact.resolve(), tree, arch)
        python = python or sys.executable
        rows = v.verify_artifact(artifact.resolve(), manifest, p.schemas_path, p.budgets_path, python,
                                 v.machine_folders(p.root, tree, artifact.resolve().parent, python=python))

    def text():
        lines = [table([[r.name, "ok" if r.ok else "FAIL", r.detail] for r in rows
                         if r.kind in ("link", "schema")], ["check", "status", "detail"]), ""]
        kernels = [r for r in rows if r.kind == "kernel"]
        if kernels:
            lines.append(table([[r.name[:90], _n(r, "registers"), _n(r, "spill_bytes"), _n(r, "stack"),
                                  _n(r, "shared"), _n(r, "hmma"), _n(r, "traps"),
                                  "ok" if r.ok else "FAIL", r.detail] for r in kernels],
                                ["kernel", "regs", "spill", "stack", "smem", "HMMA", "trap", "status", "detail"]))
        else:
            lines.append(f"{arch}: this build contains no device kernels")
        return "\n".join(lines)

    return _finish(as_json, {"ok": all(r.ok for r in rows), "arch": arch, "artifact": manifest["artifact"],
                             "rows": [asdict(r) for r in rows]}, text)


def _n(row, key):
    value = (row.numbers or {}).get(key)
    return "-" if value is None else value


@cli.command()
@click.option("--arch", default="sm_70", show_default=True, help=ARCH_HELP)
@click.option("--vllm-src", "vllm_src", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="instead of the wheel: write the source tree for a vLLM source build here "
                   "(VLLM_FLASH_ATTN_SRC_DIR), plus a plugin-only wheel")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="folder for the wheel [default: <project>/dist]")
@click.option("--force", is_flag=True, help="replace a non-empty --vllm-src folder")
@workspace_option
@json_option
@pass_ctx
def package(ctx, arch, vllm_src, out, force, workspace, as_json):
    """Package for vLLM: a wheel with the verified extension of build/<arch> and a vLLM plugin
    that enables it on compute capability 7.0; or, with --vllm-src, a source tree that vLLM's
    own build compiles (VLLM_FLASH_ATTN_SRC_DIR) and a plugin-only wheel."""
    from . import package as pk

    p = ctx.project
    out = (out or p.root / "dist").resolve()
    if vllm_src is None:
        from .verify import verify as do_verify

        pk.packageable(p, arch)  # a lab or check-only build is refused before anything runs
        _, rows = do_verify(p.build_dir(arch), p.schemas_path, p.budgets_path, None,
                            (p.root, ctx.workspace(workspace)))
        result = {"wheel": str(pk.wheel(p, arch, out, rows))}
    else:
        result = pk.vllm_source_tree(p, ctx.workspace(workspace), vllm_src, arch, ctx.lock(), force)
        result["wheel"] = str(pk.plugin_wheel(p, out, result["source_tree_digest"]))
    if result.get("source_matches_lock") is False:
        click.echo("warning: the workspace tree differs from the lock (unexported work); this source "
                   "tree is not the locked series", err=True)
    return _finish(as_json, {"ok": True, **result},
                   lambda: "\n".join(f"{k.replace('_', '-')}: {result[k]}" for k in ("vllm_src", "wheel")
                                      if k in result))


@cli.command()
@click.option("--arch", "archs", multiple=True, help="built architecture(s) to try [default: all built]")
@json_option
@pass_ctx
def smoke(ctx, archs, as_json):
    """Launch each registered route on small problems and compare with an FP32 reference."""
    from .smoke import smoke as do_smoke

    root = ctx.project.root / "build"
    dirs = [ctx.project.build_dir(a) for a in archs] or sorted(p for p in root.glob("*") if p.is_dir())
    results = do_smoke(dirs)
    return _finish(as_json, {"ok": all(r["ok"] for r in results), "results": results},
                   lambda: table([[r["arch"], r["route"], "ok" if r["ok"] else "FAIL",
                                    r.get("detail") or r.get("error") or
                                    f"{len(r.get('cases', []))} cases, worst max_abs "
                                    f"{max((c['max_abs'] for c in r.get('cases', [])), default=0):.2e}"]
                                   for r in results], ["arch", "route", "status", "detail"]))


@cli.command()
@click.option("--arch", default="sm_70", show_default=True, help="the built architecture to read")
@click.option("--launch", "launches", multiple=True, metavar="GLOB=THREADS[:DYN_SMEM]",
              help="launch configuration of kernels whose demangled name matches GLOB, for occupancy "
                   "[default: the extension's build_info()]")
@click.option("--shapes", default=None, metavar="SPEC",
              help=f"also estimate the {routes.EXACT} route's time and TFLOP/s on V100 for these shapes "
                   "(bench's syntax: q=..,kv=..,hq=..,hkv=..,d=..[,causal=0|1][,b=batch]; a:b:step sweeps; "
                   "';' separates groups) [default: no prediction]")
@click.option("--sms", type=click.Choice(["80", "72"]), default="80", show_default=True,
              help="the V100's SM count: 80 (V100-SXM2) or 72 (the GV100 of the published anchors)")
@click.option("--clock", "clock_mhz", type=click.FloatRange(min=100, max=2000), default=1530.0, show_default=True,
              help="the card's boost (or locked) SM clock in MHz: bounds use it, estimates run at the lower "
                   "of it and the sustained clock under tensor load")
@click.option("--splits", default="2,3,4", show_default=True,
              help=f"with --shapes, also the exact route with split-KV ({routes.SPLITKV}) at each of these split "
                   "counts on prefill shapes (q >= 2); empty: none")
@click.option("--anchors", "anchor_files", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="a bench JSON file from a V100 (`fa2patch bench --json-file`): its cases join the calibration "
                   "as anchors at their measured clocks; repeat for more files")
@click.option("--peer", type=click.Choice(["vllm-triton"]), default=None,
              help="with --shapes, also the model's time of what a V100 runs without fa2patch: vLLM 0.33's "
                   "TRITON_ATTN kernels, from their recorded sm_70 SASS (no tensor cores; "
                   "docs/peer-vllm-triton.md)")
@json_option
@pass_ctx
def report(ctx, arch, launches, shapes, sms, clock_mhz, splits, anchor_files, peer, as_json):
    """Static V100 report from the SASS: resources, occupancy, hot-loop mix and cycle bounds;
    with --shapes, per shape and route a bound, the model's time and a calibrated estimate with
    its range (two parameters fitted to published V100 measurements and --anchors, listed with
    their residuals)."""
    from .shapes import parse_shapes
    from .report import report as do_report
    from .report_text import render
    from .v100model import Card
    from .extension import load_manifest

    shape_list = parse_shapes(shapes) if shapes is not None else []
    launch = {}
    for item in launches:
        glob, _, value = item.rpartition("=")
        threads, _, dyn = value.partition(":")
        if not glob or not threads.isdigit() or (dyn and not dyn.isdigit()):
            raise click.BadParameter(f"expected GLOB=THREADS[:DYN_SMEM], got {item!r}", param_hint="--launch")
        launch[glob] = (int(threads), int(dyn or 0))
    manifest, artifact = load_manifest(ctx.project.build_dir(arch))
    if peer and not shape_list:
        raise click.BadParameter("needs --shapes", param_hint="--peer")
    try:
        split_list = tuple(sorted({int(x) for x in splits.split(",") if x.strip()}))
    except ValueError:
        raise click.BadParameter(f"expected integers like 2,3,4, got {splits!r}", param_hint="--splits") from None
    if any(not 2 <= x <= 16 for x in split_list):
        raise click.BadParameter(f"each split count must be 2..16, got {splits!r}", param_hint="--splits")
    result = do_report(artifact, arch, launch, shape_list, Card(int(sms), clock_mhz), split_list, list(anchor_files))
    if peer:
        from . import peer as peer_model

        result["peer"] = [peer_model.peer_estimate(s, Card(int(sms), clock_mhz)) for s in shape_list]
    if as_json:
        click.echo(json.dumps({"ok": True, "artifact": manifest["artifact"], **result}, indent=1))
    else:
        click.echo(render(result))
        if peer:
            click.echo("\n" + peer_model.render(result["peer"], result.get("predictions", [])))


@cli.command()
@click.option("--arch", default=None, help="the build to time [default: the one for this GPU]")
@click.option("--routes", default=None, metavar="A[,B]",
              help=f"routes to compare [default: {routes.EXACT}, and the first other registered route]")
@click.option("--shapes", default=None, metavar="SPEC",
              help="q=..,kv=..,hq=..,hkv=..,d=..[,causal=0|1][,scale=..]; a:b:step sweeps; ';' "
                   "separates groups [default: Q=8000, KV=40000..128000 step 8000, Hq=6, Hkv=1, "
                   "D=256, causal, scale 1/16]")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True)
@click.option("--reps", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--json-file", type=click.Path(dir_okay=False, writable=True, path_type=Path), default=None,
              help="also write the JSON result to this file (one run gives the table and the JSON)")
@click.option("--markdown-file", type=click.Path(dir_okay=False, writable=True, path_type=Path), default=None,
              help="also write a Markdown summary (machine, timings, clocks, power, throttling, estimates) "
                   "to paste into an issue report")
@json_option
@pass_ctx
def bench(ctx, arch, routes, shapes, warmup, reps, json_file, markdown_file, as_json):
    """Time routes of the extension over a shape sweep (CUDA events) with numerics, and record the
    card: SM/memory clock, power, temperature and throttle reasons sampled through NVML during every
    timed case; on an SM70 card, report's calibrated estimate beside each time."""
    from . import bench as b
    from .digest import sha256_file
    from .extension import load_manifest, manifest_path
    from .shapes import parse_shapes

    shape_list = parse_shapes(shapes or b.DEFAULT_SHAPES)
    gpu = b.gpu_or_nothing()
    arch = arch or gpu["capability"]
    build_dir = ctx.project.build_dir(arch)
    manifest, artifact = load_manifest(build_dir)
    route_list = [r.strip() for r in routes.split(",") if r.strip()] if routes else None
    if route_list is not None and not 1 <= len(route_list) <= 2:
        raise click.BadParameter("give one or two routes", param_hint="--routes")

    def progress(items):
        if as_json:
            yield from items
            return
        with click.progressbar(items, label="bench", file=sys.stderr,
                               item_show_func=lambda it: it and f"{it[1]} {it[0].label}") as bar:
            yield from bar

    result = b.bench(gpu, artifact, sha256_file(manifest_path(build_dir)), route_list, shape_list,
                     warmup, reps, progress=progress)
    if result["is_v100"]:
        b.attach_model(result, artifact, arch)
    result = {"ok": all(r.get("contract_ok") for r in result["results"]), **result}
    if json_file is not None:
        json_file.write_text(json.dumps(result, indent=1) + "\n")
    if markdown_file is not None:
        markdown_file.write_text(b.markdown(result))
    return _finish(as_json, result, lambda: b.render(result))


@cli.command()
@click.option("--model-config", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="the model's Hugging Face config.json (heads, KV heads, head dim; text_config when nested)")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True,
              help="tensor-parallel size: one rank's heads as vLLM splits them")
@click.option("--max-num-batched-tokens", "chunk", type=click.IntRange(min=16), default=2048, show_default=True,
              help="vLLM's chunked-prefill chunk (its `vllm serve` default on GPUs below 70 GiB)")
@click.option("--max-model-len", type=click.IntRange(min=16), default=None,
              help="the longest prompt [default: the config's max_position_embeddings]")
@click.option("--block-size", type=click.IntRange(min=16), default=16, show_default=True,
              help="vLLM's KV-cache block size (tokens per page; a multiple of 16)")
@click.option("--splits", default="2,3,4", show_default=True, help="split-KV counts to measure (2..16)")
@click.option("--warmup", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--reps", type=click.IntRange(min=3), default=7, show_default=True,
              help="timed rounds (one call of each route per round)")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="the profile file [default: routing-profile,device_name=<GPU>,hq=..,hkv=..,d=...json here]")
@click.option("--artifact", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="the extension to tune (the one vLLM loads: the profile is keyed by its sha256) "
                   "[default: build/<arch>]; with --check: compare the profile's extension_sha256 with it")
@click.option("--arch", default=None, help="the build to tune [default: the one for this GPU]")
@click.option("--sms", type=click.Choice(["80", "72"]), default="80", show_default=True,
              help="the V100 SM count of the run-time estimate when this GPU is not a V100")
@click.option("--estimate-only", is_flag=True, help="print the plan and the run-time estimate; measure nothing")
@click.option("--check", "check_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="validate this profile file against the format (and --artifact, --this-gpu) instead")
@click.option("--this-gpu", is_flag=True, help="with --check: also compare the profile's device with this GPU")
@json_option
@pass_ctx
def tune(ctx, model_config, tp, chunk, max_model_len, block_size, splits, warmup, reps, out, artifact, arch, sms,
         estimate_only, check_path, this_gpu, as_json):
    """Measure every route on this GPU over the calls a vLLM deployment makes (heads from
    --model-config and --tp, chunked prefill of --max-num-batched-tokens up to --max-model-len) and
    write a routing profile for FA2PATCH_ROUTING_PROFILE; or --check a profile file."""
    from . import tune as t
    from .extension import load_manifest, manifest_path, mhz, probe_gpu, smi
    from .tune_plan import per_rank, read_model_config
    from .v100model import Card

    if check_path is not None:
        return _tune_check(check_path, artifact, this_gpu, as_json)
    if model_config is None:
        raise click.BadParameter("give the model's config.json (or --check PROFILE)", param_hint="--model-config")
    model = read_model_config(model_config)
    max_len = max_model_len or model.max_position_embeddings
    if max_len is None:
        raise click.BadParameter("the config has no max_position_embeddings: give it", param_hint="--max-model-len")
    try:
        split_list = tuple(sorted({int(x) for x in splits.split(",") if x.strip()}))
    except ValueError:
        raise click.BadParameter(f"expected integers like 2,3,4, got {splits!r}", param_hint="--splits") from None
    if any(not 2 <= x <= 16 for x in split_list):
        raise click.BadParameter(f"each split count must be 2..16, got {splits!r}", param_hint="--splits")
    if block_size % 16:
        raise click.BadParameter(f"must be a multiple of 16, got {block_size}", param_hint="--block-size")
    plan = t.Plan(per_rank(model, tp), chunk, max_len, block_size, warmup, reps, split_list)
    gpu = probe_gpu()
    has_gpu = "error" not in gpu and gpu.get("cuda")
    if not has_gpu and not estimate_only:
        from .errors import NothingToLaunch

        raise NothingToLaunch("nothing tuned: torch sees no CUDA GPU on this machine (--estimate-only works without one)")
    arch = arch or (gpu["capability"] if has_gpu else "sm_70")
    if artifact is None and (has_gpu or arch == "sm_70"):
        try:
            artifact = load_manifest(ctx.project.build_dir(arch))[1]
        except Fa2PatchError:
            if not estimate_only:
                raise
    is_v100 = has_gpu and gpu["capability"] == "sm_70"
    sm70 = artifact if (is_v100 or (not has_gpu and arch == "sm_70")) else None
    if sm70 is None and manifest_path(ctx.project.build_dir("sm_70")).is_file():
        sm70 = load_manifest(ctx.project.build_dir("sm_70"))[1]
    card = Card(int(gpu["sms"]), mhz(smi("clocks.max.sm")) or 1530.0) if is_v100 else Card(int(sms), 1530.0)
    est = t.estimate(plan, sm70, card)
    if not is_v100 and est.get("available"):
        est["note"] += (f". This GPU is {gpu['name']}, not a V100: the estimate is for a V100, not for this run"
                        if has_gpu else ". The estimate is for a V100")
    head = t.describe_plan(plan, model, tp) + "\n" + t.describe_estimate(est)
    if estimate_only:
        result = {"ok": True, "plan": {**vars(plan), "heads": vars(plan.heads), "points": plan.points}, "estimate": est}
        return _finish(as_json, result, lambda: head)
    if not as_json:
        click.echo(head, err=True)
        if not is_v100:
            click.echo(f"WARNING: {gpu['name']} is not a V100: the SM70 kernels are forced (FA2PATCH_FORCE_SM70=1) "
                       "and the timings are not V100 timings", err=True)
    bar = None if as_json else click.progressbar(length=len(plan.points), label="tune", file=sys.stderr)
    with bar or contextlib.nullcontext():
        result = t.tune(artifact, plan, out, progress=(lambda e: bar.update(1)) if bar else None)
    result["estimate"] = est
    return _finish(as_json, result, lambda: t.render_tune(result))


def _tune_check(path: Path, artifact: Path | None, this_gpu: bool, as_json: bool) -> int:
    from . import profile as pf
    from .digest import sha256_file
    from .extension import probe_gpu

    device = None
    if this_gpu:
        gpu = probe_gpu()
        if "error" in gpu or not gpu.get("cuda"):
            from .errors import NothingToLaunch

            why = gpu.get("error", "torch.cuda.is_available() is False")
            raise NothingToLaunch(f"--this-gpu: torch sees no CUDA GPU here: {why[-300:]}")
        device = {"name": gpu["name"], "sms": gpu["sms"], "capability": [gpu["major"], gpu["minor"]]}
    try:
        doc = pf.check_file(path, device, sha256_file(artifact) if artifact else None)
    except pf.ProfileRefused as exc:
        result = {"ok": False, "profile": str(path), "reason": exc.reason, "error": str(exc)}
        return _finish(as_json, result, lambda: f"{path}: REFUSED ({exc})")
    checked = ["format"] + (["extension sha256"] if artifact else []) + (["device"] if device else [])
    result = {"ok": True, "profile": str(path), "checked": checked, "device": doc["device"],
              "decisions": len(doc["decisions"])}
    return _finish(as_json, result, lambda: f"{path}: ok ({', '.join(checked)})\n" + pf.summary(doc))


def main(argv: list[str] | None = None):
    args = sys.argv[1:] if argv is None else argv
    as_json = "--json" in args
    try:
        code = cli.main(args=args, prog_name="fa2patch", standalone_mode=False)
    except click.exceptions.Exit as exc:  # --help, --version
        code = exc.exit_code
    except click.ClickException as exc:
        code = _error(as_json, exc.format_message(), EXIT_USAGE, exc.show)
    except click.exceptions.Abort:
        code = _error(as_json, "aborted", EXIT_USAGE)
    except Fa2PatchError as exc:
        code = _error(as_json, str(exc), exc.exit_code)
    sys.exit(code or 0)


def _error(as_json: bool, message: str, code: int, show=None) -> int:
    """Report a failure on stderr (click's usage message where it has one), and with --json as
    the command's one JSON object on stdout too."""
    if show is not None:
        show()
    else:
        click.echo(f"fa2patch: error: {message}", err=True)
    if as_json:
        click.echo(json.dumps({"ok": False, "error": message, "exit_code": code}, indent=1))
    return code
