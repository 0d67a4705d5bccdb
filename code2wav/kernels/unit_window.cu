/* The CUDA C++ of kernels/unit_window.py (its docstring says what the kernel does); that module
   prepends (kernels/sm90.source) C (96), TAPS, TILE, THREADS (256: the two warpgroups that run the convs),
   PRODUCER, MAX_DILATION, PARAMS, the FROM_* kinds, the wgmma wrappers mma_ss / mma_rs,
   sm90.cuh's helpers and window.cuh, and NVRTC compiles it for sm_90a. */
#define NACC 48          /* m64n96 fp32 accumulator: 48 values a thread */
#define KSTEPS 6         /* k16 steps over C */
/* PRODUCER (prepended by kernels/unit_window.py): 128 or 256, the threads that fill the windows */
#define W1_BYTES (TAPS * CHUNKS * C * 16)
#define W2_BYTES (CHUNKS * C * 16)
#define PARAM_OFF (W1_BYTES + W2_BYTES)
#define BAR_OFF (PARAM_OFF + PARAMS * C * 4)   /* the mbarriers: full[2], empty[2] */
#define WIN_OFF (BAR_OFF + 128)

/* Copy tile `tile`'s window: rows t0 .. t0 + TILE + 6 d of batch row b of xx, zero past nxx;
   by the producer warpgroup (this thread `lane` of its PRODUCER). */
__device__ __forceinline__ void load_window(u32 buf, const Src& src, int ntr, int tile, int D, int wrows, int lane) {
  int b = tile / ntr, t0 = (tile % ntr) * TILE;
  int n = (TILE + (TAPS - 1) * D) * CHUNKS;
  const u16* base = src.xx + (long long)b * src.sxxb;
  for (int i = lane; i < n; i += PRODUCER) {
    int r = i / CHUNKS, c = i - r * CHUNKS;
    bool ok = t0 + r < src.nxx;
    const u16* srcp = ok ? base + (long long)(t0 + r) * C + c * 8 : src.xx;
    cp16(buf + (u32)(c * wrows + r) * 16, srcp, ok ? 16 : 0);
  }
}

/* Fill tile `tile`'s window (generic pointer `buf` into shared memory) from x, by the producer
   warpgroup (this thread `lane` of its PRODUCER): row r is position t0 + r of [history, act1(x)],
   zero past the row's end. A thread's 16-byte items (ITEMS at most) are all loaded before any is
   used: one latency, not one per load. The history rows (a row's first tile only, TILE >= H)
   come from the pool, already activated, or are zeros without one. */
#define ITEMS (((TILE + (TAPS - 1) * MAX_DILATION) * CHUNKS + PRODUCER - 1) / PRODUCER)
__device__ __forceinline__ void fill_window(unsigned char* buf, const Src& src, const float2* act, int ntr, int tile,
                                            int D, int wrows, int lane) {
  const int b = tile / ntr, t0 = (tile % ntr) * TILE, n = (TILE + (TAPS - 1) * D) * CHUNKS;
  const bool pooled = src.kind == FROM_X_AND_POOL && t0 == 0;
  const u16* xb = src.x + (long long)b * src.sxb;
  uint4 v[ITEMS];
#pragma unroll
  for (int u = 0; u < ITEMS; ++u) {
    const int i = lane + u * PRODUCER, r = i / CHUNKS, s = t0 + r - src.H;
    v[u] = make_uint4(0, 0, 0, 0);
    if (i < n && s >= 0 && s < src.L) v[u] = ld16(xb + (long long)s * C + (i - r * CHUNKS) * 8);
  }
#pragma unroll
  for (int u = 0; u < ITEMS; ++u) {
    const int i = lane + u * PRODUCER, r = i / CHUNKS, c = i - r * CHUNKS, s = t0 + r - src.H;
    if (i >= n || (pooled && s < 0)) continue;
    *(uint4*)(buf + (c * wrows + r) * 16) = (s >= 0 && s < src.L) ? snake8(v[u], act, c) : v[u];
  }
  if (pooled) {  /* time fastest: the pool is [C][H] per slot */
    const u16* pb = src.pool + src.slots[b] * (long long)src.spn;
#pragma unroll 4
    for (int i = lane; i < src.H * C; i += PRODUCER) {
      const int c = i / src.H, j = i - c * src.H;
      *(u16*)(buf + ((c >> 3) * wrows + j) * 16 + (c & 7) * 2) = pb[(long long)c * src.spc + j];
    }
  }
}

struct Ctx {  /* what every phase of a program needs */
  u32 w1s, w2s, win0, winsz;
  const float2* sp2;  /* parameter rows as channel pairs: b1, e^alpha2, 1 / (e^beta2 + 1e-9), b2, act1's two */
  int wg, q, row, ntr, D, wrows, L, sxb;
};

__device__ __forceinline__ u32 opaque(u32 v) { asm volatile("mov.b32 %0, %0;" : "+r"(v)); return v; }

/* the k=7 conv of the tile whose window is at `win`: 42 wgmmas, committed as one group */
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

/* A tile's tail once its conv is done: SnakeBeta, the 1x1 conv, bias and residual, the output
   (with conv_only, the conv plus b1) */
__device__ __forceinline__ void finish_tile(u16* y, const float* acc, const u32* xres, int tile, const Ctx& k, int conv_only) {
  if (conv_only) {
    store_out(y, acc, xres, tile, k, true);
    return;
  }
  u32 a[KSTEPS * 4];
  float acc2[NACC];
  snake_fragments(a, acc, k);
  tail_mma(acc2, a, k);
  wgmma_wait0();
#pragma unroll
  for (int i = 0; i < NACC; ++i) fence_operand(acc2[i]);
  store_out(y, acc2, xres, tile, k, false);
}

/* Warp-specialized, one program per SM: a third warpgroup (PRODUCER threads) fills the windows,
   up to two ahead, while the two others (THREADS) only run convs and tails. Windows change hands
   by mbarriers: full[b] (the producer stored buffer b's window and fenced it for wgmma) and
   empty[b] (both conv warpgroups' products from it are done, and write_history's reads). */
extern "C" __global__ void __launch_bounds__(THREADS + PRODUCER, 1) unit_window(
    const u16* __restrict__ xx, const u16* __restrict__ x, const u16* __restrict__ wpack,
    const float* __restrict__ params, u16* __restrict__ y, u16* pool, const long long* __restrict__ slots,
    const long long* __restrict__ n_new, int kind, int sxxb, int nxx, int sxb, int B, int L, int D, int wrows,
    int spn, int spc, int rate, int conv_only) {
  extern __shared__ __align__(128) unsigned char smem[];
  const Src src = {xx, x, pool, slots, n_new, kind, sxxb, nxx, sxb, L, (TAPS - 1) * D, spn, spc, rate};
  Ctx k;
  const u32 s0 = smem_u32(smem), full = s0 + BAR_OFF, empty = full + 16;  /* [2] each, 8 bytes a barrier */
  k.w1s = s0; k.w2s = s0 + W1_BYTES; k.win0 = s0 + WIN_OFF; k.winsz = (u32)wrows * C * 2;
  k.sp2 = (const float2*)(smem + PARAM_OFF);
  const float2* act = k.sp2 + 2 * C;
  const int tid = threadIdx.x;
  k.wg = tid >> 7; k.q = tid & 3;
  k.row = 64 * k.wg + 16 * ((tid >> 5) & 3) + ((tid & 31) >> 2);
  k.ntr = (L + TILE - 1) / TILE; k.D = D; k.wrows = wrows; k.L = L; k.sxb = sxb;
  const int ntiles = B * k.ntr;
  for (int i = tid; i < (W1_BYTES + W2_BYTES) / 16; i += blockDim.x) cp16(s0 + i * 16, wpack + i * 8, 16);
  for (int i = tid; i < PARAMS * C; i += blockDim.x) ((float*)(smem + PARAM_OFF))[i] = params[i];
  if (tid == 0) {
    mbar_init(full, PRODUCER); mbar_init(full + 8, PRODUCER);
    mbar_init(empty, THREADS); mbar_init(empty + 8, THREADS);
  }
  COMMIT();
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  /* the weights, seen by wgmma's proxy */
  __syncthreads();  /* the weights, the parameters and the barriers, for everyone */
#if PRODUCER > 128
  /* Two filling warpgroups: at 512 threads a thread gets 128 registers; the fill needs fewer,
     the products' accumulators more, so the file is split 104 / 152 (2 x 128 x (104 + 152) =
     65536, the largest split ptxas fits both sides in without spills). */
  if (tid >= THREADS) asm volatile("setmaxnreg.dec.sync.aligned.u32 104;");
  else asm volatile("setmaxnreg.inc.sync.aligned.u32 152;");
#endif
  if (tid >= THREADS) {
    const int lane = tid - THREADS;
    for (int it = 0, tile = blockIdx.x; tile < ntiles; ++it, tile += gridDim.x) {
      if (it >= 2) mbar_wait(empty + 8 * (it & 1), ((it - 2) >> 1) & 1);
      if (kind == FROM_XX) {
        load_window(k.win0 + (it & 1) * k.winsz, src, k.ntr, tile, D, wrows, lane);
        COMMIT();
        asm volatile("cp.async.wait_group 0;" ::: "memory");
      } else {
        fill_window(smem + WIN_OFF + (it & 1) * k.winsz, src, act, k.ntr, tile, D, wrows, lane);
      }
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  /* this thread's stores, seen by wgmma's proxy */
      mbar_arrive(full + 8 * (it & 1));
    }
    return;
  }
  for (int it = 0, tile = blockIdx.x; tile < ntiles; ++it, tile += gridDim.x) {
    float acc[NACC];
    u32 xres[24];
    load_residual(xres, x, tile, k);  /* in flight while the window is waited for */
    mbar_wait(full + 8 * (it & 1), (it >> 1) & 1);
    conv_mma(acc, k.win0 + (it & 1) * k.winsz, k);
    if (kind == FROM_X_AND_POOL && tile % k.ntr == 0) write_history(smem + WIN_OFF + (it & 1) * k.winsz, src, act, tile / k.ntr, wrows);
    wgmma_wait0();
#pragma unroll
    for (int i = 0; i < NACC; ++i) fence_operand(acc[i]);
    mbar_arrive(empty + 8 * (it & 1));
    finish_tile(y, acc, xres, tile, k, conv_only);
  }
}
