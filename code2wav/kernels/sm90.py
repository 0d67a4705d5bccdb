"""What the Hopper kernels in CUDA C++ share: their common source, the wgmma wrappers, NVRTC.

kernels/unit_window.py and kernels/tail_wide.py each compile one ``.cu`` file at run time for
sm_90a: ``source`` puts the typedefs, the kernel's own ``#define`` lines, the ``mma_ss`` /
``mma_rs`` wrappers for its accumulator width and ``sm90.cuh``'s device helpers before it, and
``load`` compiles it once per (device, source) and raises the kernel's shared-memory opt-in.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

SMEM_LIMIT = 232_448  # H100/H200 per-block opt-in maximum, bytes
_HERE = Path(__file__).parent


@functools.cache
def is_sm90(device_index: int) -> bool:
    """Whether the device runs sm_90a code (wgmma): H100 / H200."""
    return torch.cuda.get_device_capability(device_index) == (9, 0)


def mma_ss(n: int) -> str:
    """``mma_ss(d, da, db)``: one ``wgmma m64n{n}k16`` bf16 -> fp32, both operands in shared
    memory (descriptors), accumulating into ``d`` (``n / 2`` floats a thread)."""
    k = n // 2
    d = ", ".join(f"%{i}" for i in range(k))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(k))
    return f"""
__device__ __forceinline__ void mma_ss(float* d, u64 da, u64 db) {{
  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{k + 2}, 0;\\n"
    "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 {{{d}}}, %{k}, %{k + 1}, p, 1, 1, 0, 0;\\n}}\\n"
    : {outs} : "l"(da), "l"(db), "r"(1));
}}"""


def mma_rs(n: int) -> str:
    """``mma_rs(d, a, db)``: as ``mma_ss`` with the A operand from registers (four u32 of bf16 pairs)."""
    k = n // 2
    d = ", ".join(f"%{i}" for i in range(k))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(k))
    return f"""
__device__ __forceinline__ void mma_rs(float* d, const u32* a, u64 db) {{
  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{k + 5}, 0;\\n"
    "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 {{{d}}}, {{%{k}, %{k + 1}, %{k + 2}, %{k + 3}}}, %{k + 4}, p, 1, 1, 0;\\n}}\\n"
    : {outs} : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}}"""


def source(cu_file: str, defines: dict[str, int], mma: str, headers: tuple[str, ...] = ()) -> str:
    """The whole text NVRTC compiles: typedefs, ``defines``, the wgmma wrappers (``mma``), the
    shared helpers, ``headers`` (files beside this module that more than one kernel uses), then
    ``cu_file`` (a file beside this module)."""
    head = "typedef unsigned int u32;\ntypedef unsigned long long u64;\ntypedef unsigned short u16;\n"
    head += "".join(f"#define {k} {v}\n" for k, v in defines.items())
    files = ("sm90.cuh", *headers, cu_file)
    return head + mma + "\n" + "".join((_HERE / f).read_text() for f in files)


@functools.cache
def load(device_index: int, text: str, name: str, smem: int):
    """``text``'s kernel ``name`` compiled for sm_90a on that device, allowed ``smem`` bytes of
    dynamic shared memory (once per arguments)."""
    from torch.cuda import _utils

    with torch.cuda.device(device_index):
        out = _utils._nvrtc_compile(text, name, "90a", nvcc_options=["-std=c++17"])
        ptx = out[0] if isinstance(out, tuple) else out  # (ptx, lowered name) in newer torch
        kern = _utils._cuda_load_module(ptx, [name])[name]
    if hasattr(kern, "set_shared_memory_config"):
        kern.set_shared_memory_config(smem)
    else:  # older torch: the driver call itself (8: CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
        lib = getattr(_utils, "_get_gpu_runtime_library", None) or _utils._get_cuda_library
        if lib().cuFuncSetAttribute(kern.func, 8, smem) != 0:
            raise RuntimeError(f"{name}: cannot raise the kernel's shared memory to {smem} bytes")
    return kern
