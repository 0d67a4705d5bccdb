"""The 96-channel residual unit as a Hopper kernel in CUDA C++ (wgmma), compiled at run time by NVRTC.

kernels/unit_conv.py's Triton unit reads each of the seven taps' rows from L2 again (the k=7
conv's A tiles are seven row windows of one matrix, and Triton's shared-memory tiles cannot be
taken at a row offset), and streams the weights again for every tile of samples. Here a program
(one per SM, persistent) keeps both convs' weights in shared memory for the whole launch and
copies each 128-sample tile's input window (``128 + 6 * d`` rows of the history concat ``xx``)
into shared memory once; the seven taps are seven wgmma operand descriptors into that one window,
``tap * d`` rows apart.

That works because of the window's layout: without swizzling, a wgmma operand is a grid of "core
matrices" of 8 rows x 16 bytes, each 128 contiguous bytes, and the descriptor's start address
moves in 16-byte steps. Stored as ``[channel chunk of 8][row][8 channels]``, any 8 consecutive
rows of one chunk are such a core matrix, so a descriptor may start at any row. (Row count
``WROWS`` is odd modulo 8 so the window's 16-byte copies spread over the banks.)

The tail is as in the Triton unit: the conv's fp32 accumulator plus ``b1`` goes through SnakeBeta
in registers, is rounded once to bf16, and is the register operand of the 1x1 conv's wgmma; its
bias and the residual ``x`` join that accumulator before the one rounding to the output.

Two warpgroups each own 64 of a tile's samples; every thread also issues the copies of the next
tile's window, which run during this tile's products. Two forms: ``unit_window`` (the engine's:
one tile's conv, tail and store, then the next) and ``unit_window_pipe`` (the next tile's conv
products issued before this tile's tail; slower per unit in bench/unit_window.py, kept for that
A/B). bf16 only, 96 channels, ``d <= MAX_DILATION``.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from code2wav.kernels import instant
from code2wav.kernels.snake import is_channels_last
from code2wav.kernels.unit import sm_count

C = 96  # channels: the kernel's N, 12 chunks of 8
TAPS = 7
TILE = 128  # output samples a tile (two warpgroups of 64)
THREADS = 256
SMEM_LIMIT = 232_448  # H100/H200 per-block opt-in maximum
MAX_DILATION = 14  # the largest whose two windows fit beside the weights (smem_bytes <= SMEM_LIMIT)
_W1_BYTES = TAPS * C * C * 2
_W2_BYTES = C * C * 2
_PARAM_BYTES = 4 * C * 4  # b1, e^alpha, 1 / (e^beta + 1e-9), b2 (fp32)


def window_rows(dilation: int) -> int:
    """Rows a window buffer holds: ``TILE + 6 d``, rounded up to 1 modulo 8 (bank spread)."""
    rows = TILE + (TAPS - 1) * dilation
    return rows + (1 - rows) % 8


def smem_bytes(dilation: int) -> int:
    return _W1_BYTES + _W2_BYTES + _PARAM_BYTES + 2 * window_rows(dilation) * C * 2


def _mma_ss(n: int) -> str:
    d = ", ".join(f"%{i}" for i in range(n // 2))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(n // 2))
    k = n // 2
    return f"""
__device__ __forceinline__ void mma_ss(float* d, u64 da, u64 db) {{
  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{k + 2}, 0;\\n"
    "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 {{{d}}}, %{k}, %{k + 1}, p, 1, 1, 0, 0;\\n}}\\n"
    : {outs} : "l"(da), "l"(db), "r"(1));
}}"""


def _mma_rs(n: int) -> str:
    k = n // 2
    d = ", ".join(f"%{i}" for i in range(k))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(k))
    return f"""
__device__ __forceinline__ void mma_rs(float* d, const u32* a, u64 db) {{
  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{k + 5}, 0;\\n"
    "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 {{{d}}}, {{%{k}, %{k + 1}, %{k + 2}, %{k + 3}}}, %{k + 4}, p, 1, 1, 0;\\n}}\\n"
    : {outs} : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}}"""


_BODY = r"""
#define C 96
#define NACC 48          /* m64n96 fp32 accumulator: 48 values a thread */
#define CHUNKS 12        /* 8-channel chunks */
#define KSTEPS 6         /* k16 steps over C */
#define TAPS 7
#define TILE 128
#define W1_BYTES (TAPS * CHUNKS * C * 16)
#define W2_BYTES (CHUNKS * C * 16)
#define PARAM_OFF (W1_BYTES + W2_BYTES)
#define WIN_OFF (PARAM_OFF + 4 * C * 4)

__device__ __forceinline__ u32 smem_u32(const void* p) {
  u32 r; asm volatile("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p)); return r;
}
__device__ __forceinline__ void cp16(u32 dst, const void* src, u32 n) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ u64 desc(u32 addr, u32 lbo) {
  /* no swizzle; LBO: the next 8 channels (K), SBO: the next 8 rows (M or N), 128 bytes */
  return (u64)((addr & 0x3FFFF) >> 4) | ((u64)((lbo & 0x3FFFF) >> 4) << 16) | ((u64)(128 >> 4) << 32);
}
__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
  u32 r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
__device__ __forceinline__ float sin_approx(float x) { float r; asm("sin.approx.f32 %0, %1;" : "=f"(r) : "f"(x)); return r; }
__device__ __forceinline__ float as_float(u32 u) { float f; asm("mov.b32 %0, %1;" : "=f"(f) : "r"(u)); return f; }
__device__ __forceinline__ void fence_operand(float& x) { asm volatile("" : "+f"(x) :: "memory"); }

/* Copy tile `tile`'s window: rows t0 .. t0 + TILE + 6 d of batch row b of xx, zero past nxx. */
__device__ __forceinline__ void load_window(u32 buf, const u16* xx, int sxxb, int nxx, int ntr,
                                            int tile, int D, int wrows) {
  int b = tile / ntr, t0 = (tile % ntr) * TILE;
  int n = (TILE + (TAPS - 1) * D) * CHUNKS;
  const u16* base = xx + (long long)b * sxxb;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    int r = i / CHUNKS, c = i - r * CHUNKS;
    bool ok = t0 + r < nxx;
    const u16* src = ok ? base + (long long)(t0 + r) * C + c * 8 : xx;
    cp16(buf + (u32)(c * wrows + r) * 16, src, ok ? 16 : 0);
  }
}

struct Ctx {  /* what every phase of a program needs */
  u32 w1s, w2s, win0, winsz;
  const float2* sp2;  /* parameter rows as channel pairs: b1, e^alpha, 1 / (e^beta + 1e-9), b2 */
  int wg, q, row, ntr, D, wrows, L, sxb;
};

/* the k=7 conv of the tile whose window is at `win`: 42 wgmmas, committed as one group */
__device__ __forceinline__ u32 opaque(u32 v) { asm volatile("mov.b32 %0, %0;" : "+r"(v)); return v; }

__device__ __forceinline__ void conv_mma(float* acc, u32 win, const Ctx& k) {
#pragma unroll
  for (int i = 0; i < NACC; ++i) acc[i] = 0.f;
  /* Descriptors move by adding 16-byte units to their start field. The strides pass through
     `opaque` so the compiler rebuilds the 84 descriptors each tile instead of holding them all
     in registers across the loop. */
  const u32 wrows = opaque(k.wrows), d = opaque(k.D);
  const u64 a0 = desc(win + (u32)(64 * k.wg) * 16, wrows * 16), b0 = desc(opaque(k.w1s), C * 16);
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
  for (int tap = 0; tap < TAPS; ++tap) {
#pragma unroll
    for (int s = 0; s < KSTEPS; ++s) mma_ss(acc, a0 + (2 * s) * wrows + tap * d, b0 + (tap * CHUNKS + 2 * s) * C);
  }
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

/* this thread's first output row of `tile` (the other is 8 below), and its batch row */
__device__ __forceinline__ int out_row(int tile, const Ctx& k, int& b) {
  b = tile / k.ntr;
  return (tile % k.ntr) * TILE + k.row;
}

/* the residual rows of this thread's outputs (channels 8 j + 2 q, pairs), loads in flight */
__device__ __forceinline__ void load_residual(u32* xres, const u16* x, int tile, const Ctx& k) {
  int b, t = out_row(tile, k, b);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const u16* xr = x + (long long)b * k.sxb + (long long)min(t + 8 * h, k.L - 1) * C;
#pragma unroll
    for (int j = 0; j < 12; ++j) xres[12 * h + j] = *(const u32*)(xr + 8 * j + 2 * k.q);
  }
}

/* SnakeBeta(acc + b1), rounded to bf16, as the 1x1's register operand: k step s's fragment is
   a[4 s ..]: (t, k lo), (t + 8, k lo), (t, k hi), (t + 8, k hi); acc index 4 j + 2 h + e is row
   t + 8 h, channel 8 j + 2 q + e */
__device__ __forceinline__ void snake_fragments(u32* a, const float* acc, const Ctx& k) {
#pragma unroll
  for (int j = 0; j < 12; ++j) {
    const int c2 = 4 * j + k.q;
    const float2 b1 = k.sp2[c2], al = k.sp2[C / 2 + c2], ib = k.sp2[C + c2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float u0 = acc[4 * j + 2 * h] + b1.x, u1 = acc[4 * j + 2 * h + 1] + b1.y;
      float s0 = sin_approx(u0 * al.x), s1 = sin_approx(u1 * al.y);
      a[(j >> 1) * 4 + (j & 1) * 2 + h] = pack_bf16(u0 + ib.x * s0 * s0, u1 + ib.y * s1 * s1);
    }
  }
}

/* the 1x1 conv: 6 wgmmas with the register operand, committed as one group */
__device__ __forceinline__ void tail_mma(float* acc2, const u32* a, const Ctx& k) {
#pragma unroll
  for (int i = 0; i < NACC; ++i) acc2[i] = 0.f;
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
  for (int s = 0; s < KSTEPS; ++s) mma_rs(acc2, a + 4 * s, desc(k.w2s + (u32)(2 * s * C) * 16, C * 16));
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

/* y = acc2 + b2 + x, rounded once; with conv_only, acc + b1 (tests) */
__device__ __forceinline__ void store_out(u16* y, const float* acc, const u32* xres, int tile, const Ctx& k, bool conv_only) {
  int b, t = out_row(tile, k, b);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (t + 8 * h >= k.L) continue;
    u16* yr = y + ((long long)b * k.L + t + 8 * h) * C;
#pragma unroll
    for (int j = 0; j < 12; ++j) {
      int c = 8 * j + 2 * k.q;
      float2 bias = k.sp2[(conv_only ? 0 : 3 * C / 2) + c / 2];
      float y0 = acc[4 * j + 2 * h] + bias.x, y1 = acc[4 * j + 2 * h + 1] + bias.y;
      if (!conv_only) { u32 xv = xres[12 * h + j]; y0 += as_float(xv << 16); y1 += as_float(xv & 0xffff0000u); }
      *(u32*)(yr + c) = pack_bf16(y0, y1);
    }
  }
}

__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory"); }
__device__ __forceinline__ void window_ready(int pending) {
  if (pending) asm volatile("cp.async.wait_group 1;" ::: "memory");
  else asm volatile("cp.async.wait_group 0;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  /* the copies, seen by wgmma's proxy */
  __syncthreads();
}
#define COMMIT() asm volatile("cp.async.commit_group;" ::: "memory")

/* weights and parameters into shared memory, the context, the first window's copy issued */
__device__ __forceinline__ Ctx setup(unsigned char* smem, const u16* xx, const u16* wpack, const float* params,
                                     int sxxb, int sxb, int nxx, int B, int L, int D, int wrows, int& ntiles) {
  Ctx k;
  const u32 s0 = smem_u32(smem);
  k.w1s = s0; k.w2s = s0 + W1_BYTES; k.win0 = s0 + WIN_OFF; k.winsz = (u32)wrows * C * 2;
  k.sp2 = (const float2*)(smem + PARAM_OFF);
  const int tid = threadIdx.x;
  k.wg = tid >> 7; k.q = tid & 3;
  k.row = 64 * k.wg + 16 * ((tid >> 5) & 3) + ((tid & 31) >> 2);
  k.ntr = (L + TILE - 1) / TILE; k.D = D; k.wrows = wrows; k.L = L; k.sxb = sxb;
  ntiles = B * k.ntr;
  for (int i = tid; i < (W1_BYTES + W2_BYTES) / 16; i += blockDim.x) cp16(s0 + i * 16, wpack + i * 8, 16);
  for (int i = tid; i < 4 * C; i += blockDim.x) ((float*)(smem + PARAM_OFF))[i] = params[i];
  if (blockIdx.x < ntiles) load_window(k.win0, xx, sxxb, nxx, k.ntr, blockIdx.x, D, wrows);
  COMMIT();
  return k;
}

#define ARGS const u16* __restrict__ xx, const u16* __restrict__ x, const u16* __restrict__ wpack, \
             const float* __restrict__ params, u16* __restrict__ y, \
             int sxxb, int sxb, int nxx, int B, int L, int D, int wrows, int mode
#define SETUP extern __shared__ __align__(128) unsigned char smem[]; int ntiles; \
              const Ctx k = setup(smem, xx, wpack, params, sxxb, sxb, nxx, B, L, D, wrows, ntiles)

/* One tile at a time: copy the next window, run this tile's products, then its tail. */
extern "C" __global__ void __launch_bounds__(256, 1) unit_window(ARGS) {
  SETUP;
  int tile = blockIdx.x;
  for (int it = 0; tile < ntiles; ++it, tile += gridDim.x) {
    const int next = tile + gridDim.x;
    if (next < ntiles) load_window(k.win0 + ((it + 1) & 1) * k.winsz, xx, sxxb, nxx, k.ntr, next, D, wrows);
    COMMIT();
    window_ready(1);
    float acc[NACC];
    u32 xres[24];
    conv_mma(acc, k.win0 + (it & 1) * k.winsz, k);
    load_residual(xres, x, tile, k);
    wgmma_wait0();
#pragma unroll
    for (int i = 0; i < NACC; ++i) fence_operand(acc[i]);
    if (mode == 1) {
      store_out(y, acc, xres, tile, k, true);
    } else {
      u32 a[KSTEPS * 4];
      float acc2[NACC];
      snake_fragments(a, acc, k);
      tail_mma(acc2, a, k);
      wgmma_wait0();
#pragma unroll
      for (int i = 0; i < NACC; ++i) fence_operand(acc2[i]);
      store_out(y, acc2, xres, tile, k, false);
    }
    __syncthreads();  /* this window's buffer is free for the copy two tiles on */
  }
}

/* Tile i's tail runs while tile i + 1's products do: the next conv is issued first, then this
   tile's SnakeBeta and 1x1 (the tensor cores take the 1x1 after the conv). `cur` holds tile's
   finished conv on entry; `nxt` gets tile + gridDim.x's, in flight on return. */
__device__ __forceinline__ void pipe_step(float* cur, float* nxt, int tile, int it, int ntiles, const Ctx& k,
                                          const u16* xx, const u16* x, u16* y, int sxxb, int nxx) {
  const int next = tile + gridDim.x;
  window_ready(0);  /* window `next`, copied during the previous step */
  if (next < ntiles) conv_mma(nxt, k.win0 + ((it + 1) & 1) * k.winsz, k);
  if (next < ntiles) wgmma_wait1(); else wgmma_wait0();
#pragma unroll
  for (int i = 0; i < NACC; ++i) fence_operand(cur[i]);
  __syncthreads();  /* both warpgroups are done with this tile's window: copy tile + 2 into it */
  if (next + gridDim.x < ntiles) load_window(k.win0 + (it & 1) * k.winsz, xx, sxxb, nxx, k.ntr, next + gridDim.x, k.D, k.wrows);
  COMMIT();
  u32 a[KSTEPS * 4];
  float acc2[NACC];
  snake_fragments(a, cur, k);
  tail_mma(acc2, a, k);
  u32 xres[24];
  load_residual(xres, x, tile, k);  /* in flight behind the next conv and this 1x1 */
  wgmma_wait0();
#pragma unroll
  for (int i = 0; i < NACC; ++i) fence_operand(acc2[i]);
  store_out(y, acc2, xres, tile, k, false);
}

extern "C" __global__ void __launch_bounds__(256, 1) unit_window_pipe(ARGS) {
  SETUP;
  int tile = blockIdx.x;
  if (tile + gridDim.x < ntiles) load_window(k.win0 + k.winsz, xx, sxxb, nxx, k.ntr, tile + gridDim.x, D, wrows);
  COMMIT();
  window_ready(1);  /* the weights and the first window */
  float accA[NACC], accB[NACC];
  if (tile < ntiles) conv_mma(accA, k.win0, k);
  wgmma_wait0();
  for (int it = 0; tile < ntiles; it += 2, tile += 2 * gridDim.x) {
    pipe_step(accA, accB, tile, it, ntiles, k, xx, x, y, sxxb, nxx);
    if (tile + gridDim.x >= ntiles) break;
    pipe_step(accB, accA, tile + gridDim.x, it + 1, ntiles, k, xx, x, y, sxxb, nxx);
  }
}
"""

SOURCE = ("typedef unsigned int u32;\ntypedef unsigned long long u64;\ntypedef unsigned short u16;\n"
          + _mma_ss(C) + _mma_rs(C) + _BODY)


def applies(x: Tensor, rows_min: int, dilation: int) -> bool:
    """Where this unit runs: ``rows_min > 0`` output samples or more (``LayerChoices.unit_window_rows``),
    bf16 channels-last activations of 96 channels on an sm90 GPU, a dilation whose window fits."""
    B, Cx, L = x.shape
    return (rows_min > 0 and B * L >= rows_min and Cx == C and x.is_cuda and x.dtype == torch.bfloat16
            and is_channels_last(x) and smem_bytes(dilation) <= SMEM_LIMIT and _sm90(x.device.index or 0)
            and not instant.active())


@functools.cache
def _sm90(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) == (9, 0)


def pack(w1: Tensor, w2: Tensor, b1: Tensor, alpha: Tensor, beta: Tensor, b2: Tensor) -> tuple[Tensor, Tensor]:
    """The weights as the kernel's shared-memory image (``[tap][chunk][n][8]`` then ``[chunk][n][8]``,
    bf16) and the per-channel parameters (``[4, C]`` fp32: b1, e^alpha, 1 / (e^beta + 1e-9), b2)."""
    k = w1.shape[-1]
    img1 = w1.permute(2, 1, 0).reshape(k, C // 8, 8, C).permute(0, 1, 3, 2)  # [tap, chunk, n, 8]
    img2 = w2[:, :, 0].t().reshape(C // 8, 8, C).permute(0, 2, 1)  # [chunk, n, 8]
    wpack = torch.cat([img1.reshape(-1), img2.reshape(-1)]).to(torch.bfloat16).contiguous()
    f = lambda t: t.detach().float().reshape(C)  # noqa: E731
    params = torch.stack([f(b1), f(alpha).exp(), 1.0 / (f(beta).exp() + 1e-9), f(b2)]).contiguous()
    return wpack, params


KERNELS = ("unit_window", "unit_window_pipe")  # one tile at a time (the engine's) and the pipelined form


@functools.cache
def _kernel(name: str, device_index: int, smem: int):
    from torch.cuda import _utils

    with torch.cuda.device(device_index):
        out = _utils._nvrtc_compile(SOURCE, name, "90a", nvcc_options=["-std=c++17"])
        ptx = out[0] if isinstance(out, tuple) else out  # (ptx, lowered name) in newer torch
        kern = _utils._cuda_load_module(ptx, [name])[name]
    if hasattr(kern, "set_shared_memory_config"):
        kern.set_shared_memory_config(smem)
    else:  # older torch: the driver call itself (8: CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
        lib = getattr(_utils, "_get_gpu_runtime_library", None) or _utils._get_cuda_library
        if lib().cuFuncSetAttribute(kern.func, 8, smem) != 0:
            raise RuntimeError(f"unit_window: cannot raise the kernel's shared memory to {smem} bytes")
    return kern


def unit_window(xx: Tensor, x: Tensor, wpack: Tensor, params: Tensor, dilation: int, mode: int = 0,
                kernel: str = KERNELS[0]) -> Tensor:
    """A 96-channel residual unit, as kernels/unit_conv.unit_conv computes it, from ``pack``'s
    weights. ``mode=1``: the k=7 conv plus ``b1`` alone (tests; one-tile-at-a-time kernel only).
    ``kernel``: one of ``KERNELS``."""
    B, Cx, L = x.shape
    if Cx != C or x.dtype != torch.bfloat16 or xx.dtype != torch.bfloat16:
        raise ValueError(f"unit_window takes bf16 {C}-channel activations, got {Cx} channels of {x.dtype}")
    if xx.stride()[1:] != (1, C) or x.stride(1) != 1 or (L > 1 and x.stride(2) != C) or xx.data_ptr() % 16 or xx.stride(0) % 8:
        raise ValueError("unit_window reads channels-last xx and x, xx's rows 16-byte aligned")
    if xx.shape[-1] < L + (TAPS - 1) * dilation:
        raise ValueError(f"xx has {xx.shape[-1]} samples, the conv needs {L + (TAPS - 1) * dilation}")
    smem = smem_bytes(dilation)
    if smem > SMEM_LIMIT:
        raise ValueError(f"dilation {dilation} needs {smem} bytes of shared memory, over {SMEM_LIMIT}")
    y = torch.empty(B, L, C, device=x.device, dtype=x.dtype)
    ntiles = B * -(-L // TILE)
    grid = min(ntiles, sm_count(x.device))
    if kernel not in KERNELS or (mode == 1 and kernel != "unit_window"):
        raise ValueError(f"kernel must be one of {KERNELS} (mode=1: unit_window), got {kernel!r}")
    kern = _kernel(kernel, x.device.index or 0, smem_bytes(MAX_DILATION))  # one opt-in serves every dilation
    kern(grid=(grid, 1, 1), block=(THREADS, 1, 1), shared_mem=smem,
         args=[xx, x, wpack, params, y, xx.stride(0), x.stride(0), xx.shape[-1], B, L, dilation,
               window_rows(dilation), mode])
    return y.transpose(1, 2)

