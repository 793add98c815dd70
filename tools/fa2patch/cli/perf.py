# SPDX-License-Identifier: BSD-3-Clause
"""`fa2patch report`, `bench` and `tune`: the V100 model, timings on a GPU and routing profiles."""

import contextlib
import json
import sys
from pathlib import Path

import click

from fa2patch.cli.common import cli, finish, int_set, json_option, pass_ctx, split_counts
from fa2patch.common import routes
from fa2patch.common.errors import Fa2PatchError


@cli.command()
@click.option("--arch", default="sm_70", show_default=True, help="the built architecture to read")
@click.option(
    "--launch",
    "launches",
    multiple=True,
    metavar="GLOB=THREADS[:DYN_SMEM]",
    help="launch configuration of kernels whose demangled name matches GLOB, for occupancy "
    "[default: the extension's build_info()]",
)
@click.option(
    "--shapes",
    default=None,
    metavar="SPEC",
    help=f"also estimate the {routes.EXACT} route's time and TFLOP/s on V100 for these shapes "
    "(bench's syntax: q=..,kv=..,hq=..,hkv=..,d=..[,causal=0|1][,b=batch]; a:b:step sweeps; "
    "';' separates groups) [default: no prediction]",
)
@click.option(
    "--sms",
    type=click.Choice(["80", "72"]),
    default="80",
    show_default=True,
    help="the V100's SM count: 80 (V100-SXM2) or 72 (the GV100 of the published anchors)",
)
@click.option(
    "--clock",
    "clock_mhz",
    type=click.FloatRange(min=100, max=2000),
    default=1530.0,
    show_default=True,
    help="the card's boost (or locked) SM clock in MHz: bounds use it, estimates run at the lower "
    "of it and the sustained clock under tensor load",
)
@click.option(
    "--dram-gbs",
    type=click.FloatRange(min=100, max=5000),
    default=None,
    help="the card's DRAM peak in GB/s [default: the V100's 900; the published anchors' PG503-216: 1128.5]",
)
@click.option(
    "--splits",
    default="2,3,4",
    show_default=True,
    help=f"with --shapes, also the exact route with split-KV ({routes.SPLITKV}) at each of these split "
    "counts on prefill shapes (q >= 2); empty: none",
)
@click.option(
    "--anchors",
    "anchor_files",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="a bench JSON file from a V100 (`fa2patch bench --json-file`): its cases join the calibration "
    "as anchors at their measured clocks; repeat for more files",
)
@click.option(
    "--peer",
    type=click.Choice(["vllm-triton", "1cat-79t", "1cat-decode"]),
    default=None,
    help="with --shapes, also the model's time of a peer: vllm-triton, what a V100 runs without fa2patch "
    "(vLLM 0.33's TRITON_ATTN kernels from their recorded sm_70 SASS, no tensor cores, uncalibrated; "
    "docs/peer-vllm-triton.md); 1cat-79t, 1Cat-vLLM #628's long prefill (Q=8000, 6/1, D=256), "
    "calibrated with its range beside our routes (docs/peer-onecat-79t.md); 1cat-decode, 1Cat-vLLM's "
    "q=1 decode graph (B=1, 6/1, D=256), calibrated with its range (docs/report-model.md)",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="FILE.svg|png",
    help="with --shapes, also draw the JSON's numbers (needs matplotlib: the `plot` extra): FILE-routes "
    "(per prefill shape each route's calibrated time, its range and the floor), FILE-routing (the built-in "
    "rule's route over Q x KV for a head configuration, x where the ranges do not separate), FILE-decode "
    "(decode time and K/V bandwidth against KV length, with the DRAM peak), each where the shapes give it, "
    "and FILE-data.json (the numbers plotted)",
)
@json_option
@pass_ctx
def report(ctx, arch, launches, shapes, sms, clock_mhz, dram_gbs, splits, anchor_files, peer, plot_path, as_json):
    """Static V100 report from the SASS: resources, occupancy, hot-loop mix and cycle bounds;
    with --shapes, per shape and route a bound, the model's time and a calibrated estimate with
    its range (two parameters fitted to published V100 measurements and --anchors, listed with
    their residuals)."""
    from fa2patch.common.shapes import parse_shapes
    from fa2patch.compile.extension import load_manifest
    from fa2patch.model.report import report as do_report
    from fa2patch.model.report_text import render
    from fa2patch.model.user_anchors import read_bench
    from fa2patch.model.v100model import Card

    shape_list = parse_shapes(shapes) if shapes is not None else []
    for path in anchor_files:  # a malformed bench file is refused before the build is read
        read_bench(path)
    if plot_path is not None:
        if plot_path.suffix not in (".svg", ".png"):
            raise click.BadParameter(f"expected a .svg or .png file name, got {plot_path}", param_hint="--plot")
        if not shape_list:
            raise click.BadParameter("needs --shapes", param_hint="--plot")
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
    split_list = split_counts(splits)
    card = Card(int(sms), clock_mhz, dram_gbs)
    result = do_report(artifact, arch, launch, shape_list, card, split_list, list(anchor_files))
    if peer:
        from fa2patch.peers import onecat_79t, onecat_decode, vllm_triton

        if peer == "vllm-triton":
            result["peer"] = [vllm_triton.peer_estimate(s, card) for s in shape_list]
        else:  # the routes' own calibration (refitted with --anchors where given)
            module = onecat_79t if peer == "1cat-79t" else onecat_decode
            result["peer"] = [module.peer_estimate(s, card, calibration=result["calibration"]) for s in shape_list]
        render_peer = {
            "vllm-triton": vllm_triton.render,
            "1cat-79t": onecat_79t.render,
            "1cat-decode": onecat_decode.render,
        }[peer]
    result = {"ok": True, "artifact": manifest["artifact"], **result}
    if plot_path is not None:
        from fa2patch.model import report_plot

        result["plots"] = [str(p) for p in report_plot.write(result, plot_path)]
        click.echo(f"report: wrote {', '.join(result['plots'])}", err=True)
    if as_json:
        click.echo(json.dumps(result, indent=1))
    else:
        click.echo(render(result))
        if peer:
            click.echo("\n" + render_peer(result["peer"], result.get("predictions", [])))


@cli.command()
@click.option("--arch", default=None, help="the build to time [default: the one for this GPU]")
@click.option(
    "--routes",
    default=None,
    metavar="A[,B]",
    help=f"routes to compare [default: {routes.EXACT}, and the first other registered route]",
)
@click.option(
    "--shapes",
    default=None,
    metavar="SPEC",
    help="q=..,kv=..,hq=..,hkv=..,d=..[,causal=0|1][,scale=..][,b=batch][,page=tokens] (b, page: "
    "varlen_fwd's routes; page: a paged cache); a:b:step sweeps; ';' separates groups [default: "
    "Q=8000, KV=40000..128000 step 8000, Hq=6, Hkv=1, D=256, causal, scale 1/16]",
)
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True)
@click.option("--reps", type=click.IntRange(min=1), default=5, show_default=True)
@click.option(
    "--json-file",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    default=None,
    help="also write the JSON result to this file (one run gives the table and the JSON)",
)
@click.option(
    "--markdown-file",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    default=None,
    help="also write a Markdown summary (machine, timings, clocks, power, throttling, estimates) "
    "to paste into an issue report",
)
@json_option
@pass_ctx
def bench(ctx, arch, routes, shapes, warmup, reps, json_file, markdown_file, as_json):
    """Time routes of the extension over a shape sweep (CUDA events) with numerics, and record the
    card: SM/memory clock, power, temperature and throttle reasons sampled through NVML during every
    timed case; on an SM70 card, report's calibrated estimate beside each time."""
    from fa2patch.common.digest import sha256_file
    from fa2patch.common.shapes import parse_shapes
    from fa2patch.compile.extension import load_manifest, manifest_path
    from fa2patch.measure import bench as b, bench_text

    shape_list = parse_shapes(shapes or b.DEFAULT_SHAPES)
    gpu = b.gpu_or_nothing()
    arch = arch or gpu["capability"]
    build_dir = ctx.project.build_dir(arch)
    _manifest, artifact = load_manifest(build_dir)
    route_list = [r.strip() for r in routes.split(",") if r.strip()] if routes else None
    if route_list is not None and not 1 <= len(route_list) <= 2:
        raise click.BadParameter("give one or two routes", param_hint="--routes")

    def progress(items):
        if as_json:
            yield from items
            return
        with click.progressbar(
            items, label="bench", file=sys.stderr, item_show_func=lambda it: it and f"{it[1]} {it[0].label}"
        ) as bar:
            yield from bar

    result = b.bench(
        gpu, artifact, sha256_file(manifest_path(build_dir)), route_list, shape_list, warmup, reps, progress=progress
    )
    if result["is_v100"]:
        b.attach_model(result, artifact, arch)
    result = {"ok": all(r.get("contract_ok") for r in result["results"]), **result}
    if json_file is not None:
        json_file.write_text(json.dumps(result, indent=1) + "\n")
    if markdown_file is not None:
        markdown_file.write_text(bench_text.markdown(result))
    return finish(as_json, result, lambda: bench_text.render(result))


@cli.command()
@click.option(
    "--model-config",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="the model's Hugging Face config.json (heads, KV heads, head dim; text_config when nested)",
)
@click.option(
    "--tp",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="tensor-parallel size: one rank's heads as vLLM splits them",
)
@click.option(
    "--max-num-batched-tokens",
    "chunk",
    type=click.IntRange(min=16),
    default=2048,
    show_default=True,
    help="vLLM's chunked-prefill chunk (its `vllm serve` default on GPUs below 70 GiB)",
)
@click.option(
    "--max-model-len",
    type=click.IntRange(min=16),
    default=None,
    help="the longest prompt [default: the config's max_position_embeddings]",
)
@click.option(
    "--block-size",
    type=click.IntRange(min=16),
    default=16,
    show_default=True,
    help="vLLM's KV-cache block size (tokens per page; a multiple of 16)",
)
@click.option("--splits", default="2,3,4", show_default=True, help="split-KV counts to measure (2..16)")
@click.option(
    "--decode-batches",
    default="1,8,64",
    show_default=True,
    help="sequences per decode call to measure the decode kernel against the exact kernel at (1..4096; empty: none)",
)
@click.option("--warmup", type=click.IntRange(min=1), default=2, show_default=True)
@click.option(
    "--reps",
    type=click.IntRange(min=3),
    default=7,
    show_default=True,
    help="timed rounds (one call of each route per round)",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="the profile file [default: routing-profile,device_name=<GPU>,hq=..,hkv=..,d=...json here]",
)
@click.option(
    "--artifact",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="the extension to tune (the one vLLM loads: the profile is keyed by its sha256) "
    "[default: build/<arch>]; with --check: compare the profile's extension_sha256 with it",
)
@click.option("--arch", default=None, help="the build to tune [default: the one for this GPU]")
@click.option(
    "--sms",
    type=click.Choice(["80", "72"]),
    default="80",
    show_default=True,
    help="the V100 SM count of the run-time estimate when this GPU is not a V100",
)
@click.option("--estimate-only", is_flag=True, help="print the plan and the run-time estimate; measure nothing")
@click.option(
    "--check",
    "check_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="validate this profile file against the format (and --artifact, --this-gpu) instead",
)
@click.option("--this-gpu", is_flag=True, help="with --check: also compare the profile's device with this GPU")
@json_option
@pass_ctx
def tune(
    ctx,
    model_config,
    tp,
    chunk,
    max_model_len,
    block_size,
    splits,
    decode_batches,
    warmup,
    reps,
    out,
    artifact,
    arch,
    sms,
    estimate_only,
    check_path,
    this_gpu,
    as_json,
):
    """Measure every route on this GPU over the calls a vLLM deployment makes (heads from
    --model-config and --tp, chunked prefill of --max-num-batched-tokens up to --max-model-len) and
    write a routing profile for FA2PATCH_ROUTING_PROFILE; or --check a profile file."""
    from fa2patch.compile.extension import load_manifest, manifest_path, mhz, probe_gpu, smi
    from fa2patch.measure import tune as t
    from fa2patch.measure.tune_plan import per_rank, read_model_config
    from fa2patch.model.v100model import Card

    if check_path is not None:
        return _tune_check(check_path, artifact, this_gpu, as_json)
    if model_config is None:
        raise click.BadParameter("give the model's config.json (or --check PROFILE)", param_hint="--model-config")
    model = read_model_config(model_config)
    max_len = max_model_len or model.max_position_embeddings
    if max_len is None:
        raise click.BadParameter("the config has no max_position_embeddings: give it", param_hint="--max-model-len")
    split_list = split_counts(splits)
    if block_size % 16:
        raise click.BadParameter(f"must be a multiple of 16, got {block_size}", param_hint="--block-size")
    batches = int_set(decode_batches, 1, 4096, "--decode-batches", "1,8,64")
    plan = t.Plan(per_rank(model, tp), chunk, max_len, block_size, warmup, reps, split_list, batches)
    gpu = probe_gpu()
    has_gpu = "error" not in gpu and gpu.get("cuda")
    if not has_gpu and not estimate_only:
        from fa2patch.common.errors import NothingToLaunch

        raise NothingToLaunch(
            "nothing tuned: torch sees no CUDA GPU on this machine (--estimate-only works without one)"
        )
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
        est["note"] += (
            f". This GPU is {gpu['name']}, not a V100: the estimate is for a V100, not for this run"
            if has_gpu
            else ". The estimate is for a V100"
        )
    head = t.describe_plan(plan, model, tp) + "\n" + t.describe_estimate(est)
    if estimate_only:
        result = {
            "ok": True,
            "plan": {
                **vars(plan),
                "heads": vars(plan.heads),
                "points": plan.points,
                "decode_points": plan.decode_points,
            },
            "estimate": est,
        }
        return finish(as_json, result, lambda: head)
    if not as_json:
        click.echo(head, err=True)
        if not is_v100:
            click.echo(
                f"WARNING: {gpu['name']} is not a V100: the SM70 kernels are forced (FA2PATCH_FORCE_SM70=1) "
                "and the timings are not V100 timings",
                err=True,
            )
    points = len(plan.points) + len(plan.decode_points)
    bar = None if as_json else click.progressbar(length=points, label="tune", file=sys.stderr)
    with bar or contextlib.nullcontext():
        result = t.tune(artifact, plan, out, progress=(lambda e: bar.update(1)) if bar else None)
    result["estimate"] = est
    return finish(as_json, result, lambda: t.render_tune(result))


def _tune_check(path: Path, artifact: Path | None, this_gpu: bool, as_json: bool) -> int:
    from fa2patch.common.digest import sha256_file
    from fa2patch.compile.extension import probe_gpu
    from fa2patch.measure import profile as pf

    device = None
    if this_gpu:
        gpu = probe_gpu()
        if "error" in gpu or not gpu.get("cuda"):
            from fa2patch.common.errors import NothingToLaunch

            why = gpu.get("error", "torch.cuda.is_available() is False")
            raise NothingToLaunch(f"--this-gpu: torch sees no CUDA GPU here: {why[-300:]}")
        device = {"name": gpu["name"], "sms": gpu["sms"], "capability": [gpu["major"], gpu["minor"]]}
    try:
        doc = pf.check_file(path, device, sha256_file(artifact) if artifact else None)
    except pf.ProfileRefused as exc:
        result = {"ok": False, "profile": str(path), "reason": exc.reason, "error": str(exc)}
        text = f"{path}: REFUSED ({exc})"  # formatted here: the name exc does not outlive the except block
        return finish(as_json, result, lambda: text)
    checked = ["format"] + (["extension sha256"] if artifact else []) + (["device"] if device else [])
    result = {
        "ok": True,
        "profile": str(path),
        "checked": checked,
        "device": doc["device"],
        "decisions": len(doc["decisions"]),
    }
    return finish(as_json, result, lambda: f"{path}: ok ({', '.join(checked)})\n" + pf.summary(doc))
