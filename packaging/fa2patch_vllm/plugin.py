# SPDX-License-Identifier: BSD-3-Clause
"""vLLM general plugin (entry-point group ``vllm.general_plugins``): on compute capability 7.0,
make vLLM use fa2patch's ``_vllm_fa2_C`` and lift the gates that refuse 7.0.

It acts only under a vLLM release the wheel was made for (build.json's ``vllm``: the supported
releases of packaging/vllm-releases.toml whose torch the extension was built against), and logs
why it changes nothing under any other. vLLM 0.16.0, 0.19.1 and 0.33.0 refuse FlashAttention-2
below capability 8.0 in three places:
``_is_fa2_supported`` (vllm/vllm_flash_attn/flash_attn_interface.py), ``get_flash_attn_version``
(vllm/v1/attention/backends/fa_utils.py, which asserts the former through
``is_fa_version_supported``) and ``FlashAttentionBackend.supports_compute_capability``
(vllm/v1/attention/backends/flash_attn.py). The first and third are replaced by wrappers that
answer yes for (7, 0) when fa2patch's operators are the ones loaded, and call vLLM's own
function for everything else; the second follows from the first.

Once vLLM's interface has imported the extension, the plugin installs the routing profile named in
FA2PATCH_ROUTING_PROFILE (``routing_profile.install``: read and checked here, with the standard
library; the extension only follows the checked decisions), and logs what became of it.

A wheel that bundles the extension (``fa2patch package``) also makes vLLM's
``from . import _vllm_fa2_C`` import the bundled one, and refuses (logs why, changes nothing)
under a torch other than the one it was built against. A plugin-only wheel (``fa2patch package
--vllm-src``) relies on the extension vLLM itself built from fa2patch's source tree.
On any other GPU the plugin changes nothing.
"""

from __future__ import annotations

import importlib.abc
import logging
import math
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger("vllm.fa2patch_vllm")  # under vLLM's logger: its handler and format

V100 = (7, 0)
EXTENSION = "vllm.vllm_flash_attn._vllm_fa2_C"
INTERFACE = "vllm.vllm_flash_attn.flash_attn_interface"
BACKEND = "vllm.v1.attention.backends.flash_attn"
LIBRARY = "_vllm_fa2_C"  # the torch library namespace both vLLM's extension and ours register
MARK = "__fa2patch_vllm__"

_active = False


def register() -> None:
    """The entry point. vLLM may call it more than once per process; it acts once."""
    global _active  # noqa: PLW0603 - one flag per process: vLLM may call the entry point more than once
    if _active:
        return
    from vllm.platforms import current_platform

    capability = current_platform.get_device_capability() if current_platform.is_cuda() else None
    if capability is None or (capability.major, capability.minor) != V100:
        return
    from . import build_record

    record = build_record()
    release = vllm_release()
    if release not in record["vllm"]:
        logger.error(
            "fa2patch-vllm is not activated (vLLM keeps its FlashAttention gates): vLLM %s is not a release this "
            "wheel supports (%s; fa2patch's packaging/vllm-releases.toml)",
            release,
            ", ".join(record["vllm"]),
        )
        return
    if record["bundles_extension"]:
        problem = activation_problem(record)
        if problem:
            logger.error("fa2patch-vllm is not activated (vLLM keeps its FlashAttention gates): %s", problem)
            return
        from . import _vllm_fa2_C as extension  # type: ignore[attr-defined]  # built into the wheel by `package`

        sys.modules.setdefault(EXTENSION, extension)  # vLLM's `from . import _vllm_fa2_C` finds ours
        source = f"{extension.__file__} (built for torch {record['torch']['version']})"
    else:
        source = "the _vllm_fa2_C that vLLM built from fa2patch's source tree"
    patch_when_imported(INTERFACE, lift_interface_gate)
    patch_when_imported(BACKEND, lift_backend_gate)
    _active = True
    logger.info("fa2patch-vllm: FlashAttention-2 on compute capability 7.0 through %s", source)
    register_v100_backend()


BACKEND_SWITCH = "FA2PATCH_VLLM_BACKEND"
V100_BACKEND = "fa2patch_vllm.backend.V100FlashAttentionBackend"


def register_v100_backend() -> bool:
    """FLASH_ATTN's class becomes fa2patch's V100 backend (backend.py: each long prefill chunk of a
    batch in a call of its own), through vLLM's own registry; FA2PATCH_VLLM_BACKEND=0 keeps vLLM's
    class (its gates still lifted)."""
    switch = os.environ.get(BACKEND_SWITCH, "1")
    if switch not in ("0", "1"):
        logger.error(
            'fa2patch-vllm: %s must be unset, "0" or "1"; got %r: vLLM\'s FLASH_ATTN backend stays as it is',
            BACKEND_SWITCH,
            switch,
        )
        return False
    if switch == "0":
        logger.info("fa2patch-vllm: %s=0: vLLM's own FLASH_ATTN backend, one call per batch", BACKEND_SWITCH)
        return False
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.FLASH_ATTN, V100_BACKEND)
    logger.info("fa2patch-vllm: FLASH_ATTN is %s on 7.0 (long prefill chunks of a batch on their own)", V100_BACKEND)
    return True


def vllm_release() -> str:
    """The running vLLM's version (its package's own __version__; "unknown" if it has none)."""
    try:
        from vllm import __version__
    except ImportError:
        return "unknown"
    return str(__version__)


def activation_problem(record: dict) -> str | None:
    """Why the bundled extension must not be used in this process, or None."""
    import torch

    want = record["torch"]["version"]
    if torch.__version__ != want:
        return f"the extension was built for torch {want}, this process has torch {torch.__version__}"
    loaded = sys.modules.get(EXTENSION)
    ours = Path(__file__).with_name(LIBRARY + ".abi3.so")
    if loaded is not None and Path(getattr(loaded, "__file__", "")).resolve() != ours.resolve():
        return f"vLLM's own {LIBRARY} ({getattr(loaded, '__file__', '?')}) is already loaded"
    names = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith(LIBRARY + "::")]
    if names and LIBRARY + "::build_info" not in names:
        return f"another library already registered the torch operators {LIBRARY}::* ({len(names)} ops)"
    return None


def fa2patch_ops_loaded() -> bool:
    """fa2patch's operators are the registered ones (vLLM's fork registers no build_info)."""
    import torch

    return hasattr(getattr(torch.ops, LIBRARY), "build_info")


def fa2patch_ops_on_v100() -> bool:
    from vllm.platforms import current_platform

    capability = current_platform.get_device_capability()
    return capability is not None and (capability.major, capability.minor) == V100 and fa2patch_ops_loaded()


def lift_interface_gate(interface) -> None:
    """_is_fa2_supported: yes on 7.0 with fa2patch's operators; vLLM's answer otherwise."""
    original = interface._is_fa2_supported
    if getattr(original, MARK, False):
        return
    if not interface.FA2_AVAILABLE and sys.modules.get(EXTENSION) is not None:
        # The interface was imported before the plugin ran and found no extension then.
        interface.FA2_AVAILABLE, interface.FA2_UNAVAILABLE_REASON = True, None

    def _is_fa2_supported(*args, **kwargs):
        if interface.FA2_AVAILABLE and fa2patch_ops_on_v100():
            return True, None
        return original(*args, **kwargs)

    setattr(_is_fa2_supported, MARK, True)
    interface._is_fa2_supported = _is_fa2_supported
    if fa2patch_ops_loaded():
        install_routing_profile()
        start_route_stats_log()


def install_routing_profile() -> None:
    """FA2PATCH_ROUTING_PROFILE, read and handed to the loaded extension (once the interface has
    loaded it); a refused profile is logged here and by the extension, and the built-in rule applies."""
    from . import routing_profile

    result = routing_profile.install()
    if result["status"] == "installed":
        logger.info("fa2patch-vllm: routing profile %s installed (%d decisions)", result["path"], result["decisions"])
    elif result["status"] == "refused":
        logger.warning(
            "fa2patch-vllm: routing profile %s refused: %s. The built-in routing rule applies.",
            result["path"],
            result["reason"],
        )


ROUTE_STATS_EVERY = "FA2PATCH_VLLM_ROUTE_STATS_SECONDS"


def start_route_stats_log(read: Callable[[], str] | None = None) -> threading.Event | None:
    """FA2PATCH_VLLM_ROUTE_STATS_SECONDS=N (N > 0): every N seconds one log line with the extension's
    route_stats() JSON (calls per route and kernel, fallbacks and their reasons, the workspace held, the
    routing profile in force), from a daemon thread of each process that loaded the extension: a served
    model's routes, read from its log. Under CUDA graphs Python does not run per step, so a thread, not
    the attention layer, writes it. Unset or 0: no line. Returns the event that stops the thread."""
    value = os.environ.get(ROUTE_STATS_EVERY, "").strip()
    if value in ("", "0"):
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        logger.error(
            "fa2patch-vllm: %s must be a number of seconds > 0 (or unset, or 0: no log); got %r: no route_stats log",
            ROUTE_STATS_EVERY,
            value,
        )
        return None
    if read is None:
        import torch

        read = torch.ops._vllm_fa2_C.route_stats
    stop = threading.Event()

    def log_every_period() -> None:
        while not stop.wait(seconds):
            try:
                logger.info("fa2patch-vllm: route_stats %s", read())
            except Exception as exc:  # a broken read must not repeat every period, nor stop the server
                logger.warning("fa2patch-vllm: route_stats() failed (%r): no more route_stats lines", exc)
                return

    threading.Thread(target=log_every_period, name="fa2patch-route-stats", daemon=True).start()
    logger.info("fa2patch-vllm: route_stats() logged every %g s (%s)", seconds, ROUTE_STATS_EVERY)
    return stop


def lift_backend_gate(backend) -> None:
    """FlashAttentionBackend.supports_compute_capability: yes for 7.0 with fa2patch's operators
    (that class only, not its subclasses, whose kernels were not built here); vLLM's answer
    otherwise."""
    cls = backend.FlashAttentionBackend
    original = cls.supports_compute_capability.__func__
    if getattr(original, MARK, False):
        return

    def supports_compute_capability(klass, capability):
        if klass is cls and (capability.major, capability.minor) == V100 and fa2patch_ops_loaded():
            return True
        return original(klass, capability)

    setattr(supports_compute_capability, MARK, True)
    cls.supports_compute_capability = classmethod(supports_compute_capability)


def patch_when_imported(name: str, patch) -> None:
    """Apply ``patch`` to module ``name`` now if it is imported, else right after its import
    (importing vLLM's attention backends from a plugin would pull in most of vLLM too early)."""
    if name in sys.modules:
        patch(sys.modules[name])
        return
    finder = next((f for f in sys.meta_path if isinstance(f, _PatchOnImport)), None)
    if finder is None:
        finder = _PatchOnImport()
        sys.meta_path.insert(0, finder)
    finder.patches[name] = patch


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds a module with the other finders and wraps its loader to patch it once executed."""

    def __init__(self):
        self.patches = {}

    def find_spec(self, name, path, target=None):
        if name not in self.patches:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, self.patches.pop(name))
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, patch):
        self.loader, self.patch = loader, patch

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.patch(module)

    def __getattr__(self, name):  # get_source, get_filename, ...: the real loader's
        return getattr(self.loader, name)
