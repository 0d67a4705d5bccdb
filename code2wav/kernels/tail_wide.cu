/* The CUDA C++ of kernels/tail_wide.py (its docstring says what the kernel does); that module
   prepends (kernels/sm90.source) C, the tiling (its Tiling: TM rows a tile; WN, a warpgroup's
   share of an output chunk, NCH where the two warpgroups take 64 rows each, NCH / 2 where they
   split the chunk's columns; MIN_BLOCKS programs an SM; STAGES weight buffers, LEAD of them
   loading ahead of the one multiplied), the wgmma wrapper mma_ss for WN and sm90.cuh's helpers,
   and NVRTC compiles it for sm_90a. */
#define THREADS 256
#define NCH 192            /* output channels a chunk */
#define NACC (WN / 2)      /* a warpgroup's m64 x WN fp32 accumulator, per thread */
#define ROW_SPLIT (WN == NCH)   /* the warpgroups take 64 rows each (else 64 rows both, half the columns each) */
#define KCH 64             /* input channels a weight stage: four k16 steps */
#define WGMMA_WAIT (STAGES - LEAD - 1)   /* product groups left in flight: the buffer LEAD stages on must be free */
#define CHUNKS (C / 8)
#define AROWS (TM + 1)     /* rows a chunk of the A tile holds: odd, so a row's 16-byte stores spread over the banks */
#define NSTAGES ((C / NCH) * (C / KCH))   /* weight stages a tile, output chunk major */
#define STAGE_BYTES (KCH * NCH * 2)
#define A_BYTES (CHUNKS * AROWS * 16)
#define W_OFF ((A_BYTES + 127) / 128 * 128)
#define P_OFF (W_OFF + STAGES * STAGE_BYTES)
#define ITEMS (TM * CHUNKS / THREADS / 2)  /* 16-byte loads of h a thread has in flight, in each of two rounds */

/* SnakeBeta(v + b1) of 8 bf16 channels (chunk c), rounded back to bf16; p: the parameter rows
   as channel pairs (b1, e^alpha, 1 / (e^beta + 1e-9), b2; C / 2 pairs each) */
__device__ __forceinline__ u32 act2(u32 w, float2 b, float2 a, float2 ib) {
  return pack_bf16(snake(as_float(w << 16) + b.x, a.x, ib.x), snake(as_float(w & 0xffff0000u) + b.y, a.y, ib.y));
}
__device__ __forceinline__ uint4 act8(uint4 v, const float2* p, int c) {
  const float2 *b = p + 4 * c, *a = b + C / 2, *ib = a + C / 2;
  v.x = act2(v.x, b[0], a[0], ib[0]); v.y = act2(v.y, b[1], a[1], ib[1]);
  v.z = act2(v.z, b[2], a[2], ib[2]); v.w = act2(v.w, b[3], a[3], ib[3]);
  return v;
}

/* rows of [B][L][C] with batch stride sb: flat row g = b * L + t */
__device__ __forceinline__ const u16* row_ptr(const u16* base, int g, int L, int sb) {
  const int b = g / L;
  return base + (long long)b * sb + (long long)(g - b * L) * C;
}

/* Weight stage s (of this program's sequence) into its buffer: stage s % NSTAGES of the image,
   contiguous there; an empty group past the end keeps the group count uniform. */
__device__ __forceinline__ void issue_stage(u32 s0, const u16* wpack, int s, int total) {
  if (s < total) {
    const u32 dst = s0 + W_OFF + (u32)(s % STAGES) * STAGE_BYTES;
    const u16* src = wpack + (long long)(s % NSTAGES) * (STAGE_BYTES / 2);
#pragma unroll
    for (int i = threadIdx.x; i < STAGE_BYTES / 16; i += THREADS) cp16(dst + i * 16, src + i * 8, 16);
  }
  COMMIT();
}

/* The tile's A operand: SnakeBeta(h + b1) of its TM rows, [chunk][AROWS][8] bf16 (zeros past R) */
__device__ __forceinline__ void fill_a(unsigned char* smem, const u16* h, const float2* p, int g0, int R, int L, int shb) {
#pragma unroll
  for (int round = 0; round < 2; ++round) {
    uint4 v[ITEMS];
#pragma unroll
    for (int u = 0; u < ITEMS; ++u) {
      const int i = threadIdx.x + (round * ITEMS + u) * THREADS, r = i / CHUNKS, c = i - r * CHUNKS;
      v[u] = make_uint4(0, 0, 0, 0);
      if (g0 + r < R) v[u] = ld16(row_ptr(h, g0 + r, L, shb) + c * 8);
    }
#pragma unroll
    for (int u = 0; u < ITEMS; ++u) {
      const int i = threadIdx.x + (round * ITEMS + u) * THREADS, r = i / CHUNKS, c = i - r * CHUNKS;
      *(uint4*)(smem + (c * AROWS + r) * 16) = act8(v[u], p, c);
    }
  }
}

/* y = x + b2 + conv1x1(SnakeBeta(h + b1)) over R rows of C channels: one program per SM, each
   tile's activated rows in shared memory once, the weights streamed through STAGES buffers. */
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) tail_wide(
    const u16* __restrict__ h, const u16* __restrict__ x, const u16* __restrict__ wpack,
    const float* __restrict__ params, u16* __restrict__ y, int R, int L, int shb, int sxb) {
  extern __shared__ __align__(128) unsigned char smem[];
  const u32 s0 = smem_u32(smem);
  const int tid = threadIdx.x, wg = tid >> 7, q = tid & 3;
  /* this thread's first output row (the other: + 8) and its warpgroup's first column of a chunk */
  const int row = (ROW_SPLIT ? 64 * wg : 0) + 16 * ((tid >> 5) & 3) + ((tid & 31) >> 2), col0 = ROW_SPLIT ? 0 : WN * wg;
  float* P = (float*)(smem + P_OFF);
  const float2* p = (const float2*)P;
  const float2* b2 = p + 3 * (C / 2);
  const int ntiles = (R + TM - 1) / TM;
  const int total = (ntiles - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x * NSTAGES;
#pragma unroll
  for (int s = 0; s < LEAD; ++s) issue_stage(s0, wpack, s, total);
  for (int i = tid; i < 4 * C; i += THREADS) P[i] = params[i];
  int s = 0;
  for (int tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
    __syncthreads();  /* the parameters (first tile); both warpgroups' products from the last tile's A done */
    const int g0 = tile * TM;
    fill_a(smem, h, p, g0, R, L, shb);
    const u64 a0 = desc(s0 + (u32)(ROW_SPLIT ? 64 * wg : 0) * 16, AROWS * 16);
#pragma unroll 1
    for (int j = 0; j < C / NCH; ++j) {
      u32 xres[NACC / 2];  /* the residual for this thread's outputs: (row + 8 h, channel 8 n + 2 q) pairs */
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int g = min(g0 + row + 8 * hh, R - 1);
        const u16* xr = row_ptr(x, g, L, sxb) + j * NCH + col0 + 2 * q;
#pragma unroll
        for (int n = 0; n < WN / 8; ++n) xres[(WN / 8) * hh + n] = *(const u32*)(xr + 8 * n);
      }
      float acc[NACC];
#pragma unroll
      for (int i = 0; i < NACC; ++i) acc[i] = 0.f;
#pragma unroll 1
      for (int i = 0; i < C / KCH; ++i, ++s) {
        asm volatile("cp.async.wait_group %0;" :: "n"(LEAD - 1) : "memory");  /* stage s landed (this thread's copies) */
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  /* the stage and A's stores, seen by wgmma's proxy */
        __syncthreads();  /* everyone's; and every product from the buffer loaded next done (WGMMA_WAIT below) */
        issue_stage(s0, wpack, s + LEAD, total);
        const u64 b0 = desc(s0 + W_OFF + (u32)(s % STAGES) * STAGE_BYTES + (u32)col0 * 16, NCH * 16);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int ks = 0; ks < KCH / 16; ++ks) mma_ss(acc, a0 + (u32)((KCH / 8) * i + 2 * ks) * AROWS, b0 + (u32)(2 * ks * NCH));
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(WGMMA_WAIT) : "memory");
      }
      wgmma_wait0();
#pragma unroll
      for (int i = 0; i < NACC; ++i) fence_operand(acc[i]);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int g = g0 + row + 8 * hh;
        if (g >= R) continue;
        u16* yr = y + (long long)g * C + j * NCH + col0 + 2 * q;
#pragma unroll
        for (int n = 0; n < WN / 8; ++n) {
          const float2 bias = b2[(j * NCH + col0 + 8 * n + 2 * q) / 2];
          const u32 xv = xres[(WN / 8) * hh + n];
          const float y0 = acc[4 * n + 2 * hh] + bias.x + as_float(xv << 16);
          const float y1 = acc[4 * n + 2 * hh + 1] + bias.y + as_float(xv & 0xffff0000u);
          *(u32*)(yr + 8 * n) = pack_bf16(y0, y1);
        }
      }
    }
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
}
