# SPDX-License-Identifier: BSD-3-Clause
"""`fa2patch doctor`, `build`, `verify`, `package` and `smoke`: the toolchain, the extension and what
ships."""

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from fa2patch.cli.common import ARCH_HELP, cli, finish, json_option, pass_ctx, python_option, workspace_option
from fa2patch.common.errors import EXIT_USAGE
from fa2patch.common.tables import table


@cli.command()
@click.option(
    "--vllm",
    "vllm_python",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    metavar="PYTHON",
    help="instead: check that interpreter's environment for the vLLM path (vLLM and "
    "the torch it pins, their sm_70 code, nvcc, the fa2patch plugin) and print "
    "the next command or why it cannot work (exit 1 unless ready)",
)
@json_option
@pass_ctx
def doctor(ctx, vllm_python, as_json):
    """List the tools the build needs against the lock's pins: what is present, what is missing
    and how to install it. Fails (exit 2) when a required one is missing; optional ones warn.
    With --vllm PYTHON: is that vLLM environment ready for FlashAttention-2 on a V100, and if not,
    the exact next command or the exact reason it cannot work."""
    if vllm_python:
        return _doctor_vllm(ctx, vllm_python, as_json)
    from fa2patch.compile.toolchain import doctor as do_doctor

    items = do_doctor(ctx.lock().toolchain)
    missing = [i.name for i in items if i.required and not i.found]
    result = {"ok": not missing, "missing": missing, "items": [asdict(i) for i in items]}

    def text():
        return table(
            [
                [
                    i.name,
                    "ok" if i.found else ("MISSING" if i.required else "missing, optional"),
                    i.required_for,
                    i.detail + ("" if i.found else f"\ninstall: {i.install}"),
                ]
                for i in items
            ],
            ["component", "status", "needed for", "detail"],
        )

    finish(as_json, result, text)
    return 0 if result["ok"] else EXIT_USAGE


def _doctor_vllm(ctx, python: str, as_json: bool) -> int:
    from fa2patch.vllm import releases
    from fa2patch.vllm.doctor import diagnose

    result = diagnose(python, ctx.project.root, releases.load(ctx.project))

    def text():
        lines = [
            table(
                [[c["name"], {True: "ok", False: "NO", None: "-"}[c["ok"]], c["detail"]] for c in result["checks"]],
                ["check", "status", "detail"],
            ),
            "",
        ]
        if result["verdict"] == "ready":
            lines.append("ready: " + result["ready"])
        elif result["verdict"] == "next":
            lines.append("next: " + result["next"])
        else:
            lines += ["cannot work: " + result["reason"], "instead: " + result["instead"]]
        return "\n".join(lines)

    return finish(as_json, result, text)


@cli.command()
@click.option("--arch", default="sm_70", show_default=True, help=ARCH_HELP)
@click.option(
    "--cuda-compiler",
    type=click.Choice(["auto", "nvcc", "clang"]),
    default="auto",
    show_default=True,
    help="auto: nvcc if it can target --arch, else clang-22 + wheels",
)
@click.option("-j", "--jobs", type=click.IntRange(min=1), help="parallel compile jobs [default: CPUs]")
@click.option(
    "--allow-torch-without-sm70",
    "check_only",
    is_flag=True,
    help="build and verify against a torch that cannot run the result (no code for --arch, or "
    "another CUDA major, e.g. the package index's torch 2.14.0+cu130): a check that the sources "
    "build and load with it; recorded in the manifest, and `package` refuses the build",
)
@python_option
@workspace_option
@json_option
@pass_ctx
def build(ctx, arch, cuda_compiler, jobs, check_only, python, workspace, as_json):
    """Compile `_vllm_fa2_C` from the workspace for one architecture; write manifest.json.

    With --python, build against the torch of another environment (headers, C++ ABI flag and
    CUDA version read from that interpreter; a torch without code for --arch is refused unless
    --allow-torch-without-sm70). The sources are compiled as C++20 (torch >= 2.10 requires it)."""
    from fa2patch.compile.builder import build as do_build

    lock, ws = ctx.lock(), ctx.workspace(workspace)
    out = ctx.project.build_dir(arch)
    manifest = do_build(
        ws,
        arch,
        out,
        lock.toolchain,
        cuda_compiler,
        jobs,
        expected_digest=lock.final_digest(),
        echo=lambda m: click.echo(m, err=as_json),
        python=python or sys.executable,
        check_only=check_only,
    )
    if manifest["source_matches_lock"] is False:
        click.echo(
            "warning: the workspace tree differs from the lock (uncommitted or unexported "
            "work); this build is not the locked series",
            err=True,
        )
    return finish(
        as_json,
        {"ok": True, "build_dir": str(out), "manifest": manifest},
        lambda: (
            f"{out / manifest['artifact']['file']}: sha256 {manifest['artifact']['sha256']}, "
            f"{len(manifest['ptxas_kernels'])} kernel(s), {manifest['wall_seconds']} s"
            + (" (check-only: not for packaging)" if manifest["check_only"] else "")
        ),
    )


@cli.command()
@click.option("--arch", default="sm_70", show_default=True, help=ARCH_HELP)
@click.option(
    "--artifact",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="verify this extension instead of build/<arch> (one built without fa2patch build, "
    "e.g. by the --vllm-src CMake); its tensor-core kernels come from --workspace's "
    "fa2patch-build.toml, spills from its stack frames",
)
@python_option
@workspace_option
@json_option
@pass_ctx
def verify(ctx, arch, artifact, python, workspace, as_json):
    """Check the operator schemas, the artifact's hygiene (libraries, RPATH, build paths, CPython
    ABI) and every kernel's registers, spills, shared memory and SASS. The extension is loaded
    with the interpreter it was built for (manifest), or --python."""
    from fa2patch.compile import verify as v
    from fa2patch.compile.builder import artifact_manifest

    p = ctx.project
    if artifact is None:
        manifest, rows = v.verify(
            p.build_dir(arch), p.schemas_path, p.budgets_path, python, (p.root, ctx.workspace(workspace))
        )
    else:
        tree = ctx.workspace(workspace)
        manifest = artifact_manifest(artifact.resolve(), tree, arch)
        python = python or sys.executable
        rows = v.verify_artifact(
            artifact.resolve(),
            manifest,
            p.schemas_path,
            p.budgets_path,
            python,
            v.machine_folders(p.root, tree, artifact.resolve().parent, python=python),
        )

    def text():
        lines = [
            table(
                [[r.name, "ok" if r.ok else "FAIL", r.detail] for r in rows if r.kind in ("link", "schema")],
                ["check", "status", "detail"],
            ),
            "",
        ]
        kernels = [r for r in rows if r.kind == "kernel"]
        if kernels:
            lines.append(
                table(
                    [
                        [
                            r.name[:90],
                            _n(r, "registers"),
                            _n(r, "spill_bytes"),
                            _n(r, "stack"),
                            _n(r, "shared"),
                            _n(r, "hmma"),
                            _n(r, "traps"),
                            "ok" if r.ok else "FAIL",
                            r.detail,
                        ]
                        for r in kernels
                    ],
                    ["kernel", "regs", "spill", "stack", "smem", "HMMA", "trap", "status", "detail"],
                )
            )
        else:
            lines.append(f"{arch}: this build contains no device kernels")
        return "\n".join(lines)

    return finish(
        as_json,
        {
            "ok": all(r.ok for r in rows),
            "arch": arch,
            "artifact": manifest["artifact"],
            "rows": [asdict(r) for r in rows],
        },
        text,
    )


def _n(row, key):
    value = (row.numbers or {}).get(key)
    return "-" if value is None else value


@cli.command()
@click.option("--arch", default="sm_70", show_default=True, help=ARCH_HELP)
@click.option(
    "--vllm-src",
    "vllm_src",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="instead of the wheel: write the source tree for a vLLM source build here "
    "(VLLM_FLASH_ATTN_SRC_DIR), plus a plugin-only wheel",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="folder for the wheel [default: <project>/dist]",
)
@click.option("--force", is_flag=True, help="replace a non-empty --vllm-src folder")
@workspace_option
@json_option
@pass_ctx
def package(ctx, arch, vllm_src, out, force, workspace, as_json):
    """Package for vLLM: a wheel with the verified extension of build/<arch> and a vLLM plugin
    that enables it on compute capability 7.0; or, with --vllm-src, a source tree that vLLM's
    own build compiles (VLLM_FLASH_ATTN_SRC_DIR) and a plugin-only wheel."""
    from fa2patch.vllm import package as pk

    p = ctx.project
    out = (out or p.root / "dist").resolve()
    if vllm_src is None:
        from fa2patch.compile.verify import verify as do_verify

        pk.packageable(p, arch)  # a lab or check-only build is refused before anything runs
        _, rows = do_verify(p.build_dir(arch), p.schemas_path, p.budgets_path, None, (p.root, ctx.workspace(workspace)))
        result: dict[str, Any] = {"wheel": str(pk.wheel(p, arch, out, rows, ctx.workspace(workspace)))}
    else:
        result = pk.vllm_source_tree(p, ctx.workspace(workspace), vllm_src, arch, ctx.lock(), force)
        result["wheel"] = str(pk.plugin_wheel(p, out, result["source_tree_digest"]))
        if result["source_matches_lock"] is False:
            click.echo(
                "warning: the workspace tree differs from the lock (unexported work); this source "
                "tree is not the locked series",
                err=True,
            )
    return finish(
        as_json,
        {"ok": True, **result},
        lambda: "\n".join(f"{k.replace('_', '-')}: {result[k]}" for k in ("vllm_src", "wheel") if k in result),
    )


@cli.command()
@click.option("--arch", "archs", multiple=True, help="built architecture(s) to try [default: all built]")
@json_option
@pass_ctx
def smoke(ctx, archs, as_json):
    """Launch each registered route on small problems and compare with an FP32 reference."""
    from fa2patch.measure.smoke import smoke as do_smoke

    root = ctx.project.root / "build"
    dirs = [ctx.project.build_dir(a) for a in archs] or sorted(p for p in root.glob("*") if p.is_dir())
    results = do_smoke(dirs)
    return finish(
        as_json,
        {"ok": all(r["ok"] for r in results), "results": results},
        lambda: table(
            [
                [
                    r["arch"],
                    r["route"],
                    "ok" if r["ok"] else "FAIL",
                    r.get("detail")
                    or r.get("error")
                    or f"{len(r.get('cases', []))} cases, worst max_abs "
                    f"{max((c['max_abs'] for c in r.get('cases', [])), default=0):.2e}",
                ]
                for r in results
            ],
            ["arch", "route", "status", "detail"],
        ),
    )
