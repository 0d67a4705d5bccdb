/* Device helpers shared by the Hopper kernels in CUDA C++ (unit_window.cu, tail_wide.cu):
   kernels/sm90.py prepends this file, after the typedefs, to each kernel's source. */
__device__ __forceinline__ u32 smem_u32(const void* p) {
  u32 r; asm volatile("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p)); return r;
}
__device__ __forceinline__ void cp16(u32 dst, const void* src, u32 n) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ uint4 ld16(const void* p) {  /* read-only for the whole launch: free to schedule */
  uint4 v; asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p)); return v;
}
__device__ __forceinline__ u64 desc(u32 addr, u32 lbo) {
  /* no swizzle; LBO: the next 8 channels (K), SBO: the next 8 rows (M or N), 128 bytes */
  return (u64)((addr & 0x3FFFF) >> 4) | ((u64)((lbo & 0x3FFFF) >> 4) << 16) | ((u64)(128 >> 4) << 32);
}
__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
  u32 r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
__device__ __forceinline__ u16 to_bf16(float x) { u16 r; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x)); return r; }
__device__ __forceinline__ float sin_approx(float x) { float r; asm("sin.approx.f32 %0, %1;" : "=f"(r) : "f"(x)); return r; }
__device__ __forceinline__ float as_float(u32 u) { float f; asm("mov.b32 %0, %1;" : "=f"(f) : "r"(u)); return f; }
__device__ __forceinline__ void fence_operand(float& x) { asm volatile("" : "+f"(x) :: "memory"); }
/* SnakeBeta with e^alpha and 1 / (e^beta + 1e-9), in fp32 (kernels/snake.py's snake_value) */
__device__ __forceinline__ float snake(float x, float a, float ib) { float s = sin_approx(x * a); return x + ib * s * s; }

__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
#define COMMIT() asm volatile("cp.async.commit_group;" ::: "memory")

/* mbarriers: the hand-over of windows between the producer and the convs */
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }" :: "r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
  u32 done = 0;
  while (!done)
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
}
