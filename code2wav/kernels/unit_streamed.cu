/* The CUDA C++ of kernels/unit_streamed.py (its docstring says what the kernel does); that module
   prepends (kernels/sm90.source) C (192), TAPS, TILE, THREADS (256: the two warpgroups that run the convs),
   FILLERS, KG (input channels a weight stage), NSLOTS (stage buffers), MAX_DILATION, PARAMS, the
   FROM_* kinds, the wgmma wrappers mma_ss (m64n192) / mma_rs (m64n96), sm90.cuh's helpers and
   window.cuh, and NVRTC compiles it for sm_90a. */
#define NACC (C / 2)         /* m64 x C fp32 accumulator: values a thread */
#define HALF (C / 2)         /* the 1x1 conv's outputs a pass: its accumulator is m64 x HALF */
#define NACC2 (HALF / 2)
#define KSTEPS (KG / 16)     /* k16 steps a weight stage */
#define PER_TAP (C / KG)     /* weight stages a tap */
#define CONV_STAGES (TAPS * PER_TAP)
#define TAIL_STAGES (2 * PER_TAP)           /* (half of the outputs, KG inputs) */
#define TILE_STAGES (CONV_STAGES + TAIL_STAGES)
#define CONV_STAGE_BYTES (KG * C * 2)
#define TAIL_STAGE_BYTES (KG * HALF * 2)
#define PARAM_OFF (NSLOTS * CONV_STAGE_BYTES)
#define BAR_OFF (PARAM_OFF + PARAMS * C * 4)  /* mbarriers: full[2], empty[2] (windows), wfull[NSLOTS], wempty[NSLOTS] */
#define WIN_OFF (BAR_OFF + 128)
#define POOL_LOADS 8  /* a filler's pool loads in flight at once (one after another, a row's first window took ~100 latencies) */

__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
  asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }" :: "r"(bar), "r"(bytes) : "memory");
}
/* a bulk copy (the TMA unit, no tensor map): `bytes` from global to shared, counted on `bar` */
__device__ __forceinline__ void bulk_copy(u32 dst, const void* src, u32 bytes, u32 bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

/* Fill tile `tile`'s window (`buf`: generic pointer, `bufs`: its shared address) by the FILLERS
   threads (this one `lane`): row r is position t0 + r of [history, act1(x)] (or of xx), zero past
   the row's end. Every row is copied with cp.async (all of a thread's copies in flight at once)
   and then activated in place by the thread that copied it; a row's first tile takes its
   history rows from the pool, already activated. */
__device__ __forceinline__ void fill_window(unsigned char* buf, u32 bufs, const Src& src, const float2* act, int ntr, int tile,
                                            int D, int wrows, int lane) {
  const int b = tile / ntr, t0 = (tile % ntr) * TILE, n = (TILE + (TAPS - 1) * D) * CHUNKS;
  const bool from_xx = src.kind == FROM_XX, pooled = src.kind == FROM_X_AND_POOL && t0 == 0;
  const u16* base = from_xx ? src.xx + (long long)b * src.sxxb : src.x + (long long)b * src.sxb;
  const int shift = from_xx ? 0 : src.H, end = from_xx ? src.nxx : src.L;
  for (int i = lane; i < n; i += FILLERS) {
    const int r = i / CHUNKS, c = i - r * CHUNKS, s = t0 + r - shift;
    if (pooled && s < 0) continue;
    const bool ok = s >= 0 && s < end;
    cp16(bufs + (u32)(c * wrows + r) * 16, ok ? base + (long long)s * C + c * 8 : src.x, ok ? 16 : 0);
  }
  COMMIT();
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  if (!from_xx) {
    for (int i = lane; i < n; i += FILLERS) {
      const int r = i / CHUNKS, c = i - r * CHUNKS, s = t0 + r - shift;
      if (s < 0 || s >= end) continue;
      uint4* p = (uint4*)(buf + (c * wrows + r) * 16);
      *p = snake8(*p, act, c);
    }
  }
  if (pooled) {  /* the pool is [C][H] per slot, time fastest: pairs of samples (H = 6 d is even), POOL_LOADS
                   of a thread's loads in flight at once */
    const u32* pb = (const u32*)(src.pool + src.slots[b] * (long long)src.spn);
    const int hp = src.H / 2, n = hp * C, spc = src.spc / 2;
    for (int i0 = lane; i0 < n; i0 += FILLERS * POOL_LOADS) {
      u32 v[POOL_LOADS];
#pragma unroll
      for (int u = 0; u < POOL_LOADS; ++u) {
        const int i = i0 + u * FILLERS, c = i / hp;
        v[u] = i < n ? pb[c * spc + (i - c * hp)] : 0u;
      }
#pragma unroll
      for (int u = 0; u < POOL_LOADS; ++u) {
        const int i = i0 + u * FILLERS, c = i / hp, j = 2 * (i - c * hp);
        if (i >= n) continue;
        unsigned char* d = buf + ((c >> 3) * wrows + j) * 16 + (c & 7) * 2;
        *(u16*)d = (u16)(v[u] & 0xffff);
        *(u16*)(d + 16) = (u16)(v[u] >> 16);
      }
    }
  }
}

/* Stream every weight stage of this program's tiles through the NSLOTS buffers, by one thread:
   stage k of a tile is the conv's (tap k / PER_TAP, inputs KG (k % PER_TAP) ..) for k <
   CONV_STAGES, then the 1x1 conv's (output half, inputs) pairs; the packed image holds them in
   that order, each contiguous. */
__device__ __forceinline__ void stream_weights(u32 ring, u32 wfull, u32 wempty, const unsigned char* wpack, int ntiles) {
  int g = 0;
  for (int tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
    for (int k = 0; k < TILE_STAGES; ++k, ++g) {
      const int slot = g % NSLOTS;
      if (g >= NSLOTS) mbar_wait(wempty + 8 * slot, (g / NSLOTS - 1) & 1);
      const bool conv = k < CONV_STAGES;
      const u32 bytes = conv ? CONV_STAGE_BYTES : TAIL_STAGE_BYTES;
      const long long off = conv ? (long long)k * CONV_STAGE_BYTES
                                 : (long long)CONV_STAGES * CONV_STAGE_BYTES + (long long)(k - CONV_STAGES) * TAIL_STAGE_BYTES;
      mbar_expect_tx(wfull + 8 * slot, bytes);
      bulk_copy(ring + (u32)slot * CONV_STAGE_BYTES, wpack + off, bytes, wfull + 8 * slot);
    }
  }
}

struct Ctx {  /* what the conv warpgroups' phases need */
  u32 ring, wfull, wempty;
  const float2* sp2;  /* parameter rows as channel pairs: b1, e^alpha2, 1 / (e^beta2 + 1e-9), b2, act1's two */
  int wg, q, row, ntr, L, sxb;
  int g;  /* weight stages taken so far */
};

/* the next weight stage's buffer, once it has landed */
__device__ __forceinline__ u32 take_stage(Ctx& k) {
  const int slot = k.g % NSLOTS;
  mbar_wait(k.wfull + 8 * slot, (k.g / NSLOTS) & 1);
  return k.ring + (u32)slot * CONV_STAGE_BYTES;
}
/* the stage before the one just committed is free: every product that read it is done */
__device__ __forceinline__ void release_previous(Ctx& k) {
  asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
  mbar_arrive(k.wempty + 8 * ((k.g - 1) % NSLOTS));
}
__device__ __forceinline__ void release_last(Ctx& k) {
  wgmma_wait0();
  mbar_arrive(k.wempty + 8 * ((k.g - 1) % NSLOTS));
}

/* the k=7 conv of the tile whose window is at `win`, the weights streamed a stage at a time */
__device__ __forceinline__ void conv_mma(float* acc, u32 win, int D, int wrows, Ctx& k) {
#pragma unroll
  for (int i = 0; i < NACC; ++i) acc[i] = 0.f;
  const u64 a0 = desc(win + (u32)(64 * k.wg) * 16, wrows * 16);
#pragma unroll 1
  for (int s = 0; s < CONV_STAGES; ++s, ++k.g) {
    const int tap = s / PER_TAP, c0 = (s - tap * PER_TAP) * (KG / 8);
    const u64 b0 = desc(take_stage(k), C * 16);
    const u64 as = a0 + (u32)(c0 * wrows + tap * D);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks) mma_ss(acc, as + (u32)(2 * ks * wrows), b0 + (u32)(2 * ks * C));
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    if (s > 0) release_previous(k);
  }
}

/* the 1x1 conv for output channels HALF nh .. : PER_TAP stages of KG inputs, register operand */
__device__ __forceinline__ void tail_mma(float* acc2, const u32* a, Ctx& k) {
#pragma unroll
  for (int i = 0; i < NACC2; ++i) acc2[i] = 0.f;
#pragma unroll  /* the register operand's index must be known: one pass per stage, unrolled */
  for (int s = 0; s < PER_TAP; ++s, ++k.g) {
    const u64 b0 = desc(take_stage(k), HALF * 16);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks) mma_rs(acc2, a + 4 * (s * KSTEPS + ks), b0 + (u32)(2 * ks * HALF));
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    if (s > 0) release_previous(k);
  }
  release_last(k);
#pragma unroll
  for (int i = 0; i < NACC2; ++i) fence_operand(acc2[i]);
}

/* y = acc2 + b2 + x for output channels HALF nh .., rounded once */
__device__ __forceinline__ void store_half(u16* y, const float* acc2, const u32* xres, int tile, int nh, const Ctx& k) {
  int b, t = out_row(tile, k, b);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (t + 8 * h >= k.L) continue;
    u16* yr = y + ((long long)b * k.L + t + 8 * h) * C + nh * HALF;
#pragma unroll
    for (int j = 0; j < CHUNKS / 2; ++j) {
      const int c = 8 * j + 2 * k.q;
      const float2 bias = k.sp2[3 * C / 2 + (nh * HALF + c) / 2];
      const u32 xv = xres[CHUNKS * h + (CHUNKS / 2) * nh + j];
      const float y0 = acc2[4 * j + 2 * h] + bias.x + as_float(xv << 16);
      const float y1 = acc2[4 * j + 2 * h + 1] + bias.y + as_float(xv & 0xffff0000u);
      *(u32*)(yr + c) = pack_bf16(y0, y1);
    }
  }
}

/* Warp-specialized, one program per SM: FILLERS threads fill the windows, up to two ahead; one
   thread streams the weight stages, NSLOTS ahead; two warpgroups (THREADS) run the convs and
   the tails, each owning 64 of a tile's samples. mbarriers pass windows (full / empty) and weight
   stages (wfull: the bytes landed; wempty: both warpgroups' products from it are done). */
extern "C" __global__ void __launch_bounds__(THREADS + 128, 1) unit_streamed(
    const u16* __restrict__ xx, const u16* __restrict__ x, const unsigned char* __restrict__ wpack,
    const float* __restrict__ params, u16* __restrict__ y, u16* pool, const long long* __restrict__ slots,
    const long long* __restrict__ n_new, int kind, int sxxb, int nxx, int sxb, int B, int L, int D, int wrows,
    int spn, int spc, int rate) {
  extern __shared__ __align__(128) unsigned char smem[];
  const Src src = {xx, x, pool, slots, n_new, kind, sxxb, nxx, sxb, L, (TAPS - 1) * D, spn, spc, rate};
  Ctx k;
  const u32 s0 = smem_u32(smem), full = s0 + BAR_OFF, empty = full + 16;
  k.ring = s0; k.wfull = full + 32; k.wempty = k.wfull + 8 * NSLOTS; k.g = 0;
  const u32 win0 = s0 + WIN_OFF, winsz = (u32)wrows * C * 2;
  k.sp2 = (const float2*)(smem + PARAM_OFF);
  const float2* act = k.sp2 + 2 * C;
  const int tid = threadIdx.x;
  k.wg = tid >> 7; k.q = tid & 3;
  k.row = 64 * k.wg + 16 * ((tid >> 5) & 3) + ((tid & 31) >> 2);
  k.ntr = (L + TILE - 1) / TILE; k.L = L; k.sxb = sxb;
  const int ntiles = B * k.ntr;
  for (int i = tid; i < PARAMS * C; i += blockDim.x) ((float*)(smem + PARAM_OFF))[i] = params[i];
  if (tid == 0) {
    mbar_init(full, FILLERS); mbar_init(full + 8, FILLERS);
    mbar_init(empty, THREADS); mbar_init(empty + 8, THREADS);
    for (int s = 0; s < NSLOTS; ++s) { mbar_init(k.wfull + 8 * s, 1); mbar_init(k.wempty + 8 * s, THREADS); }
  }
  __syncthreads();  /* the parameters and the barriers, for everyone */
  /* At 384 threads a thread gets 168 registers; the fillers and the streaming thread need few,
     the products' accumulator, the residual and the tail's operand more: 2 x 128 x 216 +
     128 x 72 <= 65536, the split ptxas fits both sides in without spills. */
  if (tid >= THREADS) asm volatile("setmaxnreg.dec.sync.aligned.u32 72;");
  else asm volatile("setmaxnreg.inc.sync.aligned.u32 216;");
  if (tid >= THREADS) {
    const int lane = tid - THREADS;
    if (lane == FILLERS) stream_weights(k.ring, k.wfull, k.wempty, wpack, ntiles);
    if (lane >= FILLERS) return;
    for (int it = 0, tile = blockIdx.x; tile < ntiles; ++it, tile += gridDim.x) {
      if (it >= 2) mbar_wait(empty + 8 * (it & 1), ((it - 2) >> 1) & 1);
      const u32 off = WIN_OFF + (it & 1) * winsz;
      fill_window(smem + off, s0 + off, src, act, k.ntr, tile, D, wrows, lane);
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  /* this thread's stores, seen by wgmma's proxy */
      mbar_arrive(full + 8 * (it & 1));
    }
    return;
  }
  for (int it = 0, tile = blockIdx.x; tile < ntiles; ++it, tile += gridDim.x) {
    float acc[NACC];
    u32 xres[2 * CHUNKS];
    load_residual(xres, x, tile, k);  /* in flight while the window is waited for */
    mbar_wait(full + 8 * (it & 1), (it >> 1) & 1);
    conv_mma(acc, win0 + (it & 1) * winsz, D, wrows, k);
    if (kind == FROM_X_AND_POOL && tile % k.ntr == 0) write_history(smem + WIN_OFF + (it & 1) * winsz, src, act, tile / k.ntr, wrows);
    release_last(k);
#pragma unroll
    for (int i = 0; i < NACC; ++i) fence_operand(acc[i]);
    mbar_arrive(empty + 8 * (it & 1));
    u32 a[CHUNKS * 2];
    snake_fragments(a, acc, k);
#pragma unroll
    for (int nh = 0; nh < 2; ++nh) {
      float acc2[NACC2];
      tail_mma(acc2, a, k);
      store_half(y, acc2, xres, tile, nh, k);
    }
  }
}
