# SPDX-License-Identifier: BSD-3-Clause
"""Run vLLM's real Python sources without vLLM's dependencies or compiled extensions.

Used where vLLM cannot be installed: the CPU gate test (tests/vllm/vllm_gate_probe.py, no GPU, no
vLLM dependencies) and the GPU lab (tests/gpu_vllm, no network). What is stubbed and why:

- The vLLM subpackages in STUBBED become modules whose every attribute is an inert placeholder:
  pydantic-based configs, distributed state, the model executor, workers, attention ops and the
  compiled ``vllm._C*`` extensions. Importing them needs vLLM's full dependency set (pydantic,
  ZeroMQ, transformers...) and compiled kernels; the code under test (the FA2 interface, the
  gate functions, the FlashAttention backend class's capability check) never calls them.
- ``vllm.config.get_current_vllm_config_or_none`` returns None, as it does before an engine
  sets a config.
- The platform: vLLM's own ``Platform`` base class as CUDA, whose device query is answered by
  the caller (a chosen capability on the CPU, the GPU's own on the lab): vLLM's CudaPlatform
  needs the compiled ``vllm._C_stable_libtorch``.
- ``regex`` (a third-party package) is the standard library's ``re`` for vLLM's few uses.
"""

import importlib.abc
import importlib.machinery
import re
import sys
import types

STUBBED = (
    "vllm.model_executor",
    "vllm.config",
    "vllm.distributed",
    "vllm.v1.worker",
    "vllm.v1.attention.ops",
    "vllm.v1.attention.backends.utils",
    "vllm.v1.kv_cache_interface",
    "vllm._custom_ops",
    "vllm._C",
    "vllm._C_stable_libtorch",
)


class _Meta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return cls

    def __or__(cls, other):  # `Stubbed | None` in annotations
        return cls

    __ror__ = __or__


class Placeholder(metaclass=_Meta):
    """Any object of a stubbed module: callable, subscriptable, a base class, an attribute bag."""

    def __init__(self, *args, **kwargs):
        pass

    def __class_getitem__(cls, item):
        return cls

    def __call__(self, *args, **kwargs):
        return self

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self


class StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (Placeholder,), {})
        setattr(self, name, value)
        return value


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if any(name == s or name.startswith(s + ".") for s in STUBBED):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def install(vllm_src: str, capability, torch_cuda: bool = False) -> type:
    """Put vLLM's sources first on sys.path, install the stubs, and make the current platform a
    CUDA platform whose ``get_device_capability`` calls ``capability()``; with ``torch_cuda`` (a
    GPU-less probe) torch.cuda.get_device_capability answers the same (vLLM 0.16.0's FA2 gate asks
    torch, not the platform). Returns the platform's class."""
    sys.path.insert(0, vllm_src)
    sys.meta_path.insert(0, StubFinder())
    sys.modules.setdefault("regex", re)  # vllm.utils.import_utils: `import regex as re`
    import torch
    import vllm.config

    vllm.config.get_current_vllm_config_or_none = lambda: None
    import vllm.platforms
    from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum

    class StubCuda(Platform):
        _enum = PlatformEnum.CUDA
        device_name = device_type = "cuda"
        dispatch_key = "CUDA"

        @classmethod
        def get_device_capability(cls, device_id: int = 0):
            cap = capability()
            return None if cap is None else DeviceCapability(*cap)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return torch.cuda.get_device_name(device_id)

        @classmethod
        def manual_seed_all(cls, seed: int) -> None:
            torch.cuda.manual_seed_all(seed)

    vllm.platforms._current_platform = StubCuda()
    if torch_cuda:
        torch.cuda.get_device_capability = lambda device=None: capability()
    return StubCuda
