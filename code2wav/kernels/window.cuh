/* What the window kernels (unit_window.cu, unit_streamed.cu) share: where a window's rows come
   from, SnakeBeta of a 16-byte chunk, and the new history written back to the pool. Each kernel
   defines C (channels), THREADS (the threads that run its products) and FROM_XX / FROM_X /
   FROM_X_AND_POOL before kernels/sm90.source puts this file ahead of it; the conv warpgroups'
   helpers below take the kernel's own context (its fields row, ntr, L, sxb, q, sp2). */
#define CHUNKS (C / 8)   /* 8-channel chunks */
struct Src {  /* where a window's rows come from, and where the new history goes */
  const u16* xx;            /* FROM_XX: the history concat [B][nxx][C], batch stride sxxb */
  const u16* x;             /* FROM_X*: the unit's input [B][L][C], batch stride sxb */
  u16* pool;                /* FROM_X_AND_POOL: [slots][C][H], slot stride spn, channel stride spc */
  const long long* slots;
  const long long* n_new;   /* frames of `rate` samples: the new history ends at n_new[b] * rate */
  int kind, sxxb, nxx, sxb, L, H, spn, spc, rate;
};

/* SnakeBeta of 8 bf16 channels (chunk c), rounded back to bf16; act: act1's e^alpha then
   1 / (e^beta + 1e-9), as channel pairs */
__device__ __forceinline__ u32 snake2(u32 w, float2 a, float2 ib) {
  return pack_bf16(snake(as_float(w << 16), a.x, ib.x), snake(as_float(w & 0xffff0000u), a.y, ib.y));
}
__device__ __forceinline__ uint4 snake8(uint4 v, const float2* act, int c) {
  const float2* ib = act + C / 2;
  v.x = snake2(v.x, act[4 * c], ib[4 * c]); v.y = snake2(v.y, act[4 * c + 1], ib[4 * c + 1]);
  v.z = snake2(v.z, act[4 * c + 2], ib[4 * c + 2]); v.w = snake2(v.w, act[4 * c + 3], ib[4 * c + 3]);
  return v;
}

/* Row b's new history into the pool: sample j is position n_new[b] * rate + j of [history,
   act1(x)]. Run by the program of the row's first tile while `win` holds that tile's window, so
   the old history it keeps (positions < H) is read from there, never from the pool it overwrites. */
__device__ __forceinline__ void write_history(const unsigned char* win, const Src& src, const float2* act, int b, int wrows) {
  const long long start = src.n_new[b] * src.rate;
  u16* pb = src.pool + src.slots[b] * (long long)src.spn;
  const u16* xb = src.x + (long long)b * src.sxb;
  const float* a = (const float*)act;
#pragma unroll 4
  for (int i = threadIdx.x; i < src.H * C; i += THREADS) {
    const int c = i / src.H, j = i - c * src.H;
    const long long p = start + j, s = p - src.H;
    u16 v = 0;
    if (s < 0) v = *(const u16*)(win + ((c >> 3) * wrows + p) * 16 + (c & 7) * 2);
    else if (s < src.L) v = to_bf16(snake(as_float((u32)xb[s * C + c] << 16), a[c], a[C + c]));
    pb[(long long)c * src.spc + j] = v;
  }
}


/* this thread's first output row of `tile` (the other is 8 below), and its batch row */
template <class Kc>
__device__ __forceinline__ int out_row(int tile, const Kc& k, int& b) {
  b = tile / k.ntr;
  return (tile % k.ntr) * TILE + k.row;
}

/* the residual rows of this thread's outputs (channels 8 j + 2 q, pairs), loads in flight */
template <class Kc>
__device__ __forceinline__ void load_residual(u32* xres, const u16* x, int tile, const Kc& k) {
  int b, t = out_row(tile, k, b);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const u16* xr = x + (long long)b * k.sxb + (long long)min(t + 8 * h, k.L - 1) * C;
#pragma unroll
    for (int j = 0; j < CHUNKS; ++j) xres[CHUNKS * h + j] = *(const u32*)(xr + 8 * j + 2 * k.q);
  }
}

/* SnakeBeta(acc + b1), rounded to bf16, as the 1x1's register operand: k step s's fragment is
   a[4 s ..]: (t, k lo), (t + 8, k lo), (t, k hi), (t + 8, k hi); acc index 4 j + 2 h + e is row
   t + 8 h, channel 8 j + 2 q + e */
template <class Kc>
__device__ __forceinline__ void snake_fragments(u32* a, const float* acc, const Kc& k) {
#pragma unroll
  for (int j = 0; j < CHUNKS; ++j) {
    const int c2 = 4 * j + k.q;
    const float2 b1 = k.sp2[c2], al = k.sp2[C / 2 + c2], ib = k.sp2[C + c2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float u0 = acc[4 * j + 2 * h] + b1.x, u1 = acc[4 * j + 2 * h + 1] + b1.y;
      a[(j >> 1) * 4 + (j & 1) * 2 + h] = pack_bf16(snake(u0, al.x, ib.x), snake(u1, al.y, ib.y));
    }
  }
}
