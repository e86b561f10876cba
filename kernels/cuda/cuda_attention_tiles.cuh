/*
 * cuda_attention_tiles.cuh - what the tiled attention kernels share: the fused
 * causal attention (cuda_attention_fused.cu) and context parallelism's block
 * attention (cuda_attention_block.cu). Tiles of 32 query rows by 32 keys, 128
 * threads (4 warps) a block; tiles staged in shared memory as fp32 with row stride
 * HS + 1 (no bank conflicts down a column); every head dim a thread holds is one of
 * FA_DPT registers, so HS <= DT_ATTENTION_FUSED_MAX_HS.
 */
#ifndef DT_KERNELS_CUDA_ATTENTION_TILES_CUH
#define DT_KERNELS_CUDA_ATTENTION_TILES_CUH

#include "kernels/cuda/cuda_layers.cuh"

#define FA_TILE 32                          /* query rows and keys per tile */
#define FA_THREADS 128                      /* 4 warps */
#define FA_WARPS (FA_THREADS / DT_WARP)
#define FA_ROWS_PER_WARP (FA_TILE / FA_WARPS) /* 8 */
#define FA_DPT (DT_ATTENTION_FUSED_MAX_HS / FA_WARPS) /* head dims per thread, at most 32 */
#define FA_PS (FA_TILE + 1)                 /* row stride of the 32 x 32 tiles */
#define FA_STATIC_SMEM_MAX (48 * 1024)      /* dynamic shared memory without opting in */

/* Rows r0 .. r0+31 of a (T, HS) matrix with row stride rs into a (32, hp) fp32
 * tile; rows past T are zero. */
template <typename S>
static __device__ __forceinline__ void fa_load(float *dst, const S *src, int rs, int r0, int T, int HS,
                                               int hp) {
    for (int i = threadIdx.x; i < FA_TILE * HS; i += blockDim.x) {
        int r = i / HS, d = i % HS;
        dst[r * hp + d] = r0 + r < T ? dt_ld(src[(size_t)(r0 + r) * rs + d]) : 0.0f;
    }
}

/* The max an online softmax subtracts: m, or 0 while the row has seen no key (m is
 * -inf only with pos, before the row's document starts; exp then gives 0). */
static __device__ __forceinline__ float fa_shift(float m) { return m == -INFINITY ? 0.0f : m; }

/* Dot product of two HS-long rows in shared memory, in index order. */
static __device__ __forceinline__ float fa_dot(const float *a, const float *b, int HS) {
    float s = 0.0f;
    for (int d = 0; d < HS; d++) s = fmaf(a[d], b[d], s);
    return s;
}

/* One key tile of the forward's online softmax, the same in both kernels (they differ
 * only in which keys a row sees): for each row r = warp + FA_WARPS i of this warp, the
 * score of key `lane` (scale q_r . k_lane where visible(r, lane), else -inf) updates
 * the row's max m[i] and sum l[i]; the probabilities go to sp and each row's rescale
 * to salpha; then this thread's output columns acc (O[lane][warp + FA_WARPS i]) =
 * acc x alpha + P V. K and V are in sk and sv: the caller syncs before, and before the
 * next tile overwrites them. */
template <typename Visible>
static __device__ __forceinline__ void fa_tile_step(float *m, float *l, float *acc, const float *sq,
                                                    const float *sk, const float *sv, float *sp, float *salpha,
                                                    int HS, int hp, float scale, int warp, int lane,
                                                    Visible visible) {
#pragma unroll
    for (int i = 0; i < FA_ROWS_PER_WARP; i++) {
        int r = warp + FA_WARPS * i;
        float s = visible(r, lane) ? scale * fa_dot(sq + r * hp, sk + lane * hp, HS) : -INFINITY;
        float mn = fmaxf(m[i], dt_warp_max(s)), ms = fa_shift(mn);
        float p = expf(s - ms), a = expf(m[i] - ms); /* a: 0 until the row has seen a key */
        l[i] = l[i] * a + dt_warp_sum(p);
        m[i] = mn;
        sp[r * FA_PS + lane] = p;
        if (lane == 0) salpha[r] = a;
    }
    __syncthreads();
    float a = salpha[lane];
    const float *pr = sp + lane * FA_PS;
#pragma unroll
    for (int i = 0; i < FA_DPT; i++) {
        int d = warp + FA_WARPS * i;
        if (d >= HS) continue; /* constant indices: acc stays in registers */
        float x = acc[i] * a;
        for (int j = 0; j < FA_TILE; j++) x = fmaf(pr[j], sv[j * hp + d], x);
        acc[i] = x;
    }
}

/* Raises a kernel's dynamic shared memory limit when it needs more than the
 * default 48 KiB (HS > 95 in the backward); records a failure as op's error. */
template <typename K> static int fa_smem_ok(dt_device_t *dev, K kernel, size_t bytes, const char *op) {
    if (bytes <= FA_STATIC_SMEM_MAX) return 1;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != cudaSuccess) {
        dt_cuda_note_error(dev, op, e);
        return 0;
    }
    return 1;
}

#endif /* DT_KERNELS_CUDA_ATTENTION_TILES_CUH */
