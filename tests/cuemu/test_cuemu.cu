/*
 * test_cuemu.cu - the CUDA emulator's own tests, written as CUDA: the same file is
 * built by g++ against tests/cuemu/cuemu.h (build-emu/tests/cuemu/test_cuemu, run by
 * `make test`) and by nvcc against the real CUDA (build/tests/cuemu/test_cuemu, run
 * by `make gpu-tests` on a GPU machine), so a GPU run cross-checks that the emulator
 * means what CUDA means. Tests under #ifdef DT_CUEMU check the emulator's loud
 * failures (aborts, faults, poison) that a real GPU does not promise.
 */
#include "kernels/cuda/cuda_common.cuh"

#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <type_traits>
#include <vector>

#define CK(call)                                                                                    \
    do {                                                                                            \
        cudaError_t e_ = (call);                                                                    \
        cr_assert_eq(e_, cudaSuccess, "%s: %s (%s)", #call, cudaGetErrorString(e_), cudaGetErrorName(e_)); \
    } while (0)
#define CKB(call)                                                                                   \
    do {                                                                                            \
        cublasStatus_t s_ = (call);                                                                 \
        cr_assert_eq(s_, CUBLAS_STATUS_SUCCESS, "%s: status %d", #call, (int)s_);                  \
    } while (0)

static uint32_t g_rng = 12345;
static float frand(void) { /* uniform in [-1, 1) */
    g_rng = g_rng * 1664525u + 1013904223u;
    return (float)((g_rng >> 8) & 0xffffff) / 8388608.0f - 1.0f;
}

template <typename T> static T *dev_upload(const std::vector<T> &h) {
    T *d = nullptr;
    CK(cudaMalloc(&d, h.size() * sizeof(T)));
    CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}
template <typename T> static std::vector<T> dev_download(const T *d, size_t n) {
    std::vector<T> h(n);
    CK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

/* ---- block reduction with static shared memory --------------------------------------------- */
__global__ void block_sum_kernel(const float *x, float *partial, int n) {
    __shared__ float buf[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    buf[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = buf[0];
}

Test(cuemu, block_reduction_shared_syncthreads) {
    const int n = 5000, threads = 256, blocks = (n + threads - 1) / threads;
    std::vector<float> h(n);
    for (auto &v : h) v = frand();
    float *dx = dev_upload(h), *dp = nullptr;
    CK(cudaMalloc(&dp, blocks * sizeof(float)));
    DT_LAUNCH(block_sum_kernel, blocks, threads, 0, 0)(dx, dp, n);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<float> p = dev_download(dp, blocks);
    for (int b = 0; b < blocks; b++) {
        double ref = 0;
        for (int i = b * threads; i < n && i < (b + 1) * threads; i++) ref += h[i];
        cr_assert_float_eq(p[b], ref, 1e-4, "block %d: %f vs %f", b, p[b], ref);
    }
    CK(cudaFree(dx));
    CK(cudaFree(dp));
}

/* ---- warp shuffles ------------------------------------------------------------------------- */
/* out[6 * tid + k]: xor-butterfly sum, down-reduction (valid in lane 0), inclusive up-scan,
 * broadcast of lane 5, xor-sum within 8-lane segments (width 8), int down-reduction. */
__global__ void warp_kernel(const float *x, const int *xi, float *out, double *outd) {
    int tid = blockIdx.x * blockDim.x + threadIdx.x;
    float v = x[tid];
    float a = v;
    for (int m = 16; m > 0; m >>= 1) a += __shfl_xor_sync(0xffffffffu, a, m);
    float b = v;
    for (int d = 16; d > 0; d >>= 1) b += __shfl_down_sync(0xffffffffu, b, d);
    float c = v;
    for (int d = 1; d < 32; d <<= 1) {
        float t = __shfl_up_sync(0xffffffffu, c, d);
        if ((int)(threadIdx.x % 32) >= d) c += t;
    }
    float e = __shfl_sync(0xffffffffu, v, 5);
    float f = v;
    for (int m = 4; m > 0; m >>= 1) f += __shfl_xor_sync(0xffffffffu, f, m, 8);
    int iv = xi[tid];
    for (int d = 16; d > 0; d >>= 1) iv += __shfl_down_sync(0xffffffffu, iv, d);
    double dv = (double)v;
    for (int m = 16; m > 0; m >>= 1) dv += __shfl_xor_sync(0xffffffffu, dv, m);
    unsigned uv = (unsigned)tid;
    uv = __shfl_sync(0xffffffffu, uv, 31);
    out[6 * tid + 0] = a;
    out[6 * tid + 1] = b;
    out[6 * tid + 2] = c;
    out[6 * tid + 3] = e;
    out[6 * tid + 4] = f;
    out[6 * tid + 5] = (float)iv;
    outd[2 * tid] = dv;
    outd[2 * tid + 1] = (double)uv;
}

Test(cuemu, warp_shuffles) {
    const int threads = 64, blocks = 3, n = threads * blocks;
    std::vector<float> h(n);
    std::vector<int> hi(n);
    for (int i = 0; i < n; i++) {
        h[i] = (float)((i * 7) % 13) - 6.0f; /* small integers: sums are exact */
        hi[i] = i * 3 - 100;
    }
    float *dx = dev_upload(h), *dout = nullptr;
    int *dxi = dev_upload(hi);
    double *dd = nullptr;
    CK(cudaMalloc(&dout, 6 * n * sizeof(float)));
    CK(cudaMalloc(&dd, 2 * n * sizeof(double)));
    DT_LAUNCH(warp_kernel, blocks, threads, 0, 0)(dx, dxi, dout, dd);
    CK(cudaGetLastError());
    std::vector<float> o = dev_download(dout, 6 * n);
    std::vector<double> od = dev_download(dd, 2 * n);
    for (int w = 0; w < n / 32; w++) {
        float sum = 0, scan = 0;
        int isum = 0;
        for (int l = 0; l < 32; l++) sum += h[w * 32 + l], isum += hi[w * 32 + l];
        for (int l = 0; l < 32; l++) {
            int t = w * 32 + l;
            scan += h[t];
            float seg = 0;
            for (int k = 0; k < 8; k++) seg += h[w * 32 + (l & ~7) + k];
            cr_assert_eq(o[6 * t + 0], sum, "xor sum lane %d", t);
            if (l == 0) cr_assert_eq(o[6 * t + 1], sum, "down sum");
            if (l == 0) cr_assert_eq(o[6 * t + 5], (float)isum, "int down sum");
            cr_assert_eq(o[6 * t + 2], scan, "up scan lane %d: %f vs %f", t, o[6 * t + 2], scan);
            cr_assert_eq(o[6 * t + 3], h[w * 32 + 5], "broadcast lane %d", t);
            cr_assert_eq(o[6 * t + 4], seg, "width-8 xor sum lane %d", t);
            cr_assert_eq(od[2 * t], (double)sum, "double xor sum");
            cr_assert_eq(od[2 * t + 1], (double)(w * 32 + 31), "unsigned broadcast");
        }
    }
    /* Shuffle-down past the end of the segment keeps the caller's own value. */
    CK(cudaFree(dx));
    CK(cudaFree(dxi));
    CK(cudaFree(dout));
    CK(cudaFree(dd));
}

__global__ void shfl_edges_kernel(float *out) {
    int lane = threadIdx.x;
    float v = (float)lane;
    out[4 * lane + 0] = __shfl_down_sync(0xffffffffu, v, 3);     /* lanes 29..31 keep their own */
    out[4 * lane + 1] = __shfl_up_sync(0xffffffffu, v, 2, 16);   /* lanes 0,1,16,17 keep their own */
    out[4 * lane + 2] = __shfl_sync(0xffffffffu, v, lane + 33);  /* srcLane modulo width */
    out[4 * lane + 3] = __shfl_xor_sync(0xffffffffu, v, 16, 16); /* later segment: own value; earlier: read */
}

Test(cuemu, shuffle_edges) {
    float *d = nullptr;
    CK(cudaMalloc(&d, 128 * sizeof(float)));
    DT_LAUNCH(shfl_edges_kernel, 1, 32, 0, 0)(d);
    CK(cudaGetLastError());
    std::vector<float> o = dev_download(d, 128);
    for (int l = 0; l < 32; l++) {
        cr_assert_eq(o[4 * l + 0], (float)(l + 3 < 32 ? l + 3 : l), "down lane %d", l);
        cr_assert_eq(o[4 * l + 1], (float)(l % 16 >= 2 ? l - 2 : l), "up lane %d", l);
        cr_assert_eq(o[4 * l + 2], (float)((l + 33) % 32), "idx lane %d", l);
        cr_assert_eq(o[4 * l + 3], (float)(l < 16 ? l : l - 16), "xor lane %d", l);
    }
    CK(cudaFree(d));
}

/* Votes, a template kernel with __restrict__ parameters, min/max. */
template <typename T>
__global__ void vote_kernel(const T *__restrict__ x, unsigned *__restrict__ out, const int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    bool pos = i < n && x[i] > (T)0;
    unsigned b = __ballot_sync(0xffffffffu, pos);
    int any = __any_sync(0xffffffffu, pos), all = __all_sync(0xffffffffu, pos);
    __threadfence();
    if (threadIdx.x % 32 == 0) {
        int w = i / 32;
        out[3 * w] = b;
        out[3 * w + 1] = (unsigned)any;
        out[3 * w + 2] = (unsigned)all + 2u * (unsigned)max(min(i, 5), 3) +
                         100u * (unsigned)max(min(-1.5f, 2.0f) + 3.0f, 0.0f) + 1000u * max(2u, 1);
    }
}

Test(cuemu, votes_template_kernel_restrict) {
    const int n = 96;
    std::vector<int> h(n);
    for (int i = 0; i < n; i++) h[i] = i < 32 ? (i % 3 == 0 ? 1 : -1) : (i < 64 ? 1 : -1);
    int *dx = dev_upload(h);
    unsigned *dout = nullptr;
    CK(cudaMalloc(&dout, 9 * sizeof(unsigned)));
    DT_LAUNCH(vote_kernel<int>, 3, 32, 0, 0)(dx, dout, n);
    CK(cudaGetLastError());
    std::vector<unsigned> o = dev_download(dout, 9);
    unsigned b0 = 0;
    for (int l = 0; l < 32; l++)
        if (l % 3 == 0) b0 |= 1u << l;
    cr_assert_eq(o[0], b0);
    cr_assert_eq(o[1], 1u);
    cr_assert_eq(o[2] % 2, 0u);
    cr_assert_eq(o[3], 0xffffffffu);
    cr_assert_eq(o[4], 1u);
    cr_assert_eq(o[5] % 2, 1u);
    cr_assert_eq(o[6], 0u);
    cr_assert_eq(o[7], 0u);
    /* all + 2 max(min(i, 5), 3) + 100 (unsigned)(min(-1.5, 2) + 3) + 1000 max(2u, 1) with i = 32 w */
    cr_assert_eq(o[2], 0u + 2 * 3 + 100 + 2000);
    cr_assert_eq(o[5], 1u + 2 * 5 + 100 + 2000);
    cr_assert_eq(o[8], 0u + 2 * 5 + 100 + 2000);
    cudaFree(dx);
    cudaFree(dout);
}

/* ---- dynamic shared memory ----------------------------------------------------------------- */
__global__ void reverse_kernel(const float *x, float *y, int n) {
    DT_DYN_SMEM(float, s);
    int base = blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = x[base + i];
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[base + i] = s[n - 1 - i];
}

Test(cuemu, dynamic_shared_memory) {
    const int n = 1000, blocks = 4;
    std::vector<float> h(n * blocks);
    for (auto &v : h) v = frand();
    float *dx = dev_upload(h), *dy = nullptr;
    CK(cudaMalloc(&dy, h.size() * sizeof(float)));
    DT_LAUNCH(reverse_kernel, blocks, 96, n * sizeof(float), 0)(dx, dy, n);
    CK(cudaGetLastError());
    std::vector<float> y = dev_download(dy, h.size());
    for (int b = 0; b < blocks; b++)
        for (int i = 0; i < n; i++) cr_assert_eq(y[b * n + i], h[b * n + n - 1 - i]);
    CK(cudaFree(dx));
    CK(cudaFree(dy));
}

/* More than 48 KiB needs cudaFuncSetAttribute first. */
__global__ void big_smem_kernel(float *out, int n) {
    DT_DYN_SMEM(float, s);
    for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = (float)i;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0;
        for (int i = 0; i < n; i++) t += s[i];
        out[0] = t;
    }
}

Test(cuemu, launch_validation) {
    float *d = nullptr;
    CK(cudaMalloc(&d, sizeof(float)));
    const int n = 16384; /* 64 KiB */
    DT_LAUNCH(big_smem_kernel, 1, 128, n * sizeof(float), 0)(d, n);
    cr_assert_eq(cudaGetLastError(), cudaErrorInvalidValue, "64 KiB of dynamic shared memory without opt-in");
    cr_assert_eq(cudaGetLastError(), cudaSuccess, "launch errors are not sticky");
    CK(cudaFuncSetAttribute(big_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, n * 4));
    DT_LAUNCH(big_smem_kernel, 1, 128, n * sizeof(float), 0)(d, n);
    CK(cudaGetLastError());
    std::vector<float> o = dev_download(d, 1);
    float ref = 0;
    for (int i = 0; i < n; i++) ref += (float)i;
    cr_assert_eq(o[0], ref);

    DT_LAUNCH(big_smem_kernel, 1, 1025, 0, 0)(d, 0);
    cr_assert_eq(cudaPeekAtLastError(), cudaErrorInvalidConfiguration, "1025 threads per block");
    cr_assert_eq(cudaGetLastError(), cudaErrorInvalidConfiguration, "peek does not reset");
    cr_assert_eq(cudaGetLastError(), cudaSuccess);
    DT_LAUNCH(big_smem_kernel, 1, dim3(32, 32, 2), 0, 0)(d, 0);
    cr_assert_eq(cudaGetLastError(), cudaErrorInvalidConfiguration, "32x32x2 threads per block");
    DT_LAUNCH(big_smem_kernel, 1, dim3(1, 1, 65), 0, 0)(d, 0);
    cr_assert_eq(cudaGetLastError(), cudaErrorInvalidConfiguration, "block.z 65");
    DT_LAUNCH(big_smem_kernel, dim3(1, 65536, 1), 32, 0, 0)(d, 0);
    cr_assert_eq(cudaGetLastError(), cudaErrorInvalidConfiguration, "grid.y 65536");
    DT_LAUNCH(big_smem_kernel, dim3(1, 1, 65536), 32, 0, 0)(d, 0);
    cr_assert_eq(cudaGetLastError(), cudaErrorInvalidConfiguration, "grid.z 65536");
    DT_LAUNCH(big_smem_kernel, 0, 32, 0, 0)(d, 0);
    cr_assert_eq(cudaGetLastError(), cudaErrorInvalidConfiguration, "empty grid");
    /* A valid launch after failed ones works. */
    DT_LAUNCH(big_smem_kernel, 1, 32, 0, 0)(d, 0);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaFree(d));
}

/* ---- atomics from many blocks ---------------------------------------------------------------- */
__global__ void atomics_kernel(const int *x, int n, int *hist, float *fsum, int *imax, unsigned long long *cas_count,
                               double *dsum, unsigned *usum) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    atomicAdd(&hist[x[i] & 15], 1);
    atomicAdd(fsum, 0.5f);
    atomicMax(imax, x[i]);
    atomicAdd(dsum, 0.25);
    atomicAdd(usum, 2u);
    /* A CAS loop: increment by one. */
    unsigned long long old = *cas_count, assumed;
    do {
        assumed = old;
        old = atomicCAS(cas_count, assumed, assumed + 1);
    } while (old != assumed);
}

Test(cuemu, atomics_from_many_blocks) {
    const int n = 4000;
    std::vector<int> h(n);
    for (int i = 0; i < n; i++) h[i] = (i * 2654435761u) % 100000;
    int *dx = dev_upload(h), *dh = nullptr, *dmax = nullptr;
    float *dsum = nullptr;
    unsigned long long *dcas = nullptr;
    double *dd = nullptr;
    unsigned *du = nullptr;
    CK(cudaMalloc(&dh, 16 * sizeof(int)));
    CK(cudaMalloc(&dsum, sizeof(float)));
    CK(cudaMalloc(&dmax, sizeof(int)));
    CK(cudaMalloc(&dcas, sizeof(unsigned long long)));
    CK(cudaMalloc(&dd, sizeof(double)));
    CK(cudaMalloc(&du, sizeof(unsigned)));
    CK(cudaMemset(dh, 0, 16 * sizeof(int)));
    CK(cudaMemset(dsum, 0, sizeof(float)));
    CK(cudaMemset(dmax, 0, sizeof(int)));
    CK(cudaMemset(dcas, 0, sizeof(unsigned long long)));
    CK(cudaMemset(dd, 0, sizeof(double)));
    CK(cudaMemset(du, 0, sizeof(unsigned)));
    DT_LAUNCH(atomics_kernel, (n + 127) / 128, 128, 0, 0)(dx, n, dh, dsum, dmax, dcas, dd, du);
    CK(cudaGetLastError());
    std::vector<int> hist = dev_download(dh, 16);
    int ref[16] = {0}, mx = 0;
    for (int v : h) ref[v & 15]++, mx = v > mx ? v : mx;
    for (int b = 0; b < 16; b++) cr_assert_eq(hist[b], ref[b], "bin %d", b);
    cr_assert_eq(dev_download(dsum, 1)[0], n * 0.5f);
    cr_assert_eq(dev_download(dmax, 1)[0], mx);
    cr_assert_eq(dev_download(dcas, 1)[0], (unsigned long long)n);
    cr_assert_eq(dev_download(dd, 1)[0], n * 0.25);
    cr_assert_eq(dev_download(du, 1)[0], 2u * n);
    cudaFree(dx); cudaFree(dh); cudaFree(dsum); cudaFree(dmax); cudaFree(dcas); cudaFree(dd); cudaFree(du);
}

/* ---- 2D / 3D grids and blocks ---------------------------------------------------------------- */
__global__ void index_kernel(int *out, int W, int H, int D) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    int z = blockIdx.z * blockDim.z + threadIdx.z;
    if (x >= W || y >= H || z >= D) return;
    int linear_tid = threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y;
    int linear_blk = blockIdx.x + blockIdx.y * gridDim.x + blockIdx.z * gridDim.x * gridDim.y;
    out[2 * ((z * H + y) * W + x)] = x + 1000 * y + 1000000 * z;
    out[2 * ((z * H + y) * W + x) + 1] = linear_blk * 100000 + linear_tid + 0 * warpSize;
}

Test(cuemu, grids_and_blocks_2d_3d) {
    const int W = 37, H = 19, D = 5;
    int *d = nullptr;
    CK(cudaMalloc(&d, 2 * W * H * D * sizeof(int)));
    CK(cudaMemset(d, 0xff, 2 * W * H * D * sizeof(int)));
    dim3 block(8, 4, 2), grid((W + 7) / 8, (H + 3) / 4, (D + 1) / 2);
    DT_LAUNCH(index_kernel, grid, block, 0, 0)(d, W, H, D);
    CK(cudaGetLastError());
    std::vector<int> o = dev_download(d, 2 * W * H * D);
    for (int z = 0; z < D; z++)
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++) {
                int i = (z * H + y) * W + x;
                cr_assert_eq(o[2 * i], x + 1000 * y + 1000000 * z, "(%d,%d,%d)", x, y, z);
                int bx = x / 8, by = y / 4, bz = z / 2, tx = x % 8, ty = y % 4, tz = z % 2;
                int blk = bx + by * (int)grid.x + bz * (int)grid.x * (int)grid.y;
                cr_assert_eq(o[2 * i + 1], blk * 100000 + tx + ty * 8 + tz * 32, "(%d,%d,%d)", x, y, z);
            }
    CK(cudaFree(d));
}

/* ---- bf16 ---------------------------------------------------------------------------------------- */
static float f_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint16_t bits_of(__nv_bfloat16 b) { uint16_t u; memcpy(&u, &b, 2); return u; }

static const struct { uint32_t in; uint16_t rn, rz; } bf16_cases[] = {
    {0x3f800000u, 0x3f80, 0x3f80}, /* 1.0 */
    {0x3f808000u, 0x3f80, 0x3f80}, /* 1 + 2^-8: a tie, to even (down) */
    {0x3f818000u, 0x3f82, 0x3f81}, /* a tie, to even (up) */
    {0x3f808001u, 0x3f81, 0x3f80}, /* just above the tie */
    {0x3f807fffu, 0x3f80, 0x3f80}, /* just below the tie */
    {0xbf818000u, 0xbf82, 0xbf81}, /* negative tie */
    {0x7f7fffffu, 0x7f80, 0x7f7f}, /* FLT_MAX rounds to +inf; toward zero stays finite */
    {0x7f800000u, 0x7f80, 0x7f80}, /* +inf */
    {0xff800000u, 0xff80, 0xff80}, /* -inf */
    {0x7fc00000u, 0x7fff, 0x7fff}, /* quiet NaN: canonical */
    {0x7f800001u, 0x7fff, 0x7fff}, /* NaN that would round to inf: stays NaN */
    {0xffffffffu, 0x7fff, 0x7fff}, /* negative NaN: canonical */
    {0x00000000u, 0x0000, 0x0000}, /* +0 */
    {0x80000000u, 0x8000, 0x8000}, /* -0 */
    {0x00008000u, 0x0000, 0x0000}, /* subnormal tie to even (zero) */
    {0x00018000u, 0x0002, 0x0001}, /* subnormal tie to even (up) */
    {0x00010001u, 0x0001, 0x0001}, /* subnormal */
    {0x007fffffu, 0x0080, 0x007f}, /* largest subnormal rounds to the smallest normal */
};

__global__ void bf16_kernel(const float *in, __nv_bfloat16 *rn, __nv_bfloat16 *rz, float *back, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    rn[i] = __float2bfloat16_rn(in[i]);
    rz[i] = __float2bfloat16_rz(in[i]);
    back[i] = __bfloat162float(__float2bfloat16(in[i]));
    if (i == 0) {
        __nv_bfloat162 p = __floats2bfloat162_rn(1.5f, -2.25f);
        float2 q = __bfloat1622float2(p);
        back[n] = q.x + 10.0f * __low2float(p);
        back[n + 1] = q.y + 10.0f * __high2float(p);
    }
}

Test(cuemu, bf16_rounding) {
    const int n = (int)(sizeof bf16_cases / sizeof bf16_cases[0]);
    std::vector<float> in(n);
    for (int i = 0; i < n; i++) in[i] = f_of(bf16_cases[i].in);
    /* host conversions */
    for (int i = 0; i < n; i++) {
        cr_assert_eq(bits_of(__float2bfloat16_rn(in[i])), bf16_cases[i].rn, "rn of 0x%08x: 0x%04x", bf16_cases[i].in,
                     bits_of(__float2bfloat16_rn(in[i])));
        cr_assert_eq(bits_of(__float2bfloat16(in[i])), bf16_cases[i].rn);
        cr_assert_eq(bits_of(__float2bfloat16_rz(in[i])), bf16_cases[i].rz, "rz of 0x%08x", bf16_cases[i].in);
    }
    cr_assert_eq(sizeof(__nv_bfloat16), 2u);
    cr_assert_eq(sizeof(__nv_bfloat162), 4u);
    cr_assert_eq(sizeof(float4), 16u);
    cr_assert_eq(alignof(float4), 16u);
    /* device conversions: the same bits */
    float *din = dev_upload(in), *dback = nullptr;
    __nv_bfloat16 *drn = nullptr, *drz = nullptr;
    CK(cudaMalloc(&drn, n * 2));
    CK(cudaMalloc(&drz, n * 2));
    CK(cudaMalloc(&dback, (n + 2) * sizeof(float)));
    DT_LAUNCH(bf16_kernel, 1, 32, 0, 0)(din, drn, drz, dback, n);
    CK(cudaGetLastError());
    std::vector<uint16_t> rn = dev_download((const uint16_t *)drn, n), rz = dev_download((const uint16_t *)drz, n);
    std::vector<float> back = dev_download(dback, n + 2);
    for (int i = 0; i < n; i++) {
        cr_assert_eq(rn[i], bf16_cases[i].rn, "device rn of 0x%08x: 0x%04x", bf16_cases[i].in, rn[i]);
        cr_assert_eq(rz[i], bf16_cases[i].rz, "device rz of 0x%08x: 0x%04x", bf16_cases[i].in, rz[i]);
        uint32_t bb;
        memcpy(&bb, &back[i], 4);
        cr_assert_eq(bb, (uint32_t)bf16_cases[i].rn << 16, "widening is exact");
    }
    cr_assert_eq(back[n], 1.5f + 15.0f);
    cr_assert_eq(back[n + 1], -2.25f - 22.5f);
    cudaFree(din); cudaFree(drn); cudaFree(drz); cudaFree(dback);
}

/* ---- runtime API ------------------------------------------------------------------------------- */
Test(cuemu, device_properties_streams_events) {
    int count = 0, dev = -1;
    CK(cudaGetDeviceCount(&count));
    cr_assert_geq(count, 1);
    CK(cudaSetDevice(0));
    CK(cudaGetDevice(&dev));
    cr_assert_eq(dev, 0);
    cr_assert_eq(cudaSetDevice(count), cudaErrorInvalidDevice);
    cr_assert_eq(cudaGetLastError(), cudaErrorInvalidDevice, "API errors are recorded as the last error");
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    cr_assert_eq(prop.warpSize, 32);
    cr_assert_geq(prop.maxThreadsPerBlock, 1024);
    cr_assert_eq(prop.sharedMemPerBlock, 48u * 1024);
    cr_assert_gt(prop.sharedMemPerBlockOptin, 48u * 1024);
    cr_assert_gt(prop.multiProcessorCount, 0);
    int v = 0;
    CK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0));
    cr_assert_eq(v, prop.multiProcessorCount);
    CK(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, 0));
    cr_assert_eq(v, prop.major);
    size_t fr = 0, tot = 0;
    CK(cudaMemGetInfo(&fr, &tot));
    cr_assert_gt(tot, 0u);
    cr_assert_leq(fr, tot);

    cudaStream_t s;
    cudaEvent_t a, b, nt;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaEventCreateWithFlags(&nt, cudaEventDisableTiming));
    float *d = nullptr, *hp = nullptr;
    CK(cudaMalloc(&d, 1024 * sizeof(float)));
    CK(cudaMallocHost(&hp, 1024 * sizeof(float)));
    for (int i = 0; i < 1024; i++) hp[i] = (float)i;
    CK(cudaEventRecord(a, s));
    CK(cudaMemcpyAsync(d, hp, 1024 * sizeof(float), cudaMemcpyHostToDevice, s));
    CK(cudaMemsetAsync(d, 0, 16 * sizeof(float), s));
    CK(cudaMemcpyAsync(hp, d, 1024 * sizeof(float), cudaMemcpyDefault, s));
    CK(cudaEventRecord(b, s));
    CK(cudaStreamWaitEvent(0, b, 0));
    CK(cudaEventSynchronize(b));
    CK(cudaStreamSynchronize(s));
    for (int i = 0; i < 1024; i++) cr_assert_eq(hp[i], i < 16 ? 0.0f : (float)i);
    float ms = -1;
    CK(cudaEventElapsedTime(&ms, a, b));
    cr_assert_geq(ms, 0.0f);
    cr_assert_eq(cudaEventElapsedTime(&ms, a, nt), cudaErrorInvalidResourceHandle, "timing disabled");
    cr_assert_eq(cudaGetLastError(), cudaErrorInvalidResourceHandle);
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    CK(cudaEventDestroy(nt));
    CK(cudaStreamDestroy(s));
    CK(cudaFreeHost(hp));
    CK(cudaFree(d));
    CK(cudaFree(nullptr));
    cr_assert_str_eq(cudaGetErrorString(cudaErrorInvalidValue), "invalid argument");
    cr_assert_str_eq(cudaGetErrorName(cudaErrorMemoryAllocation), "cudaErrorMemoryAllocation");
}

Test(cuemu, malloc_too_much_fails) {
    void *p = (void *)1;
    size_t fr = 0, tot = 0;
    CK(cudaMemGetInfo(&fr, &tot));
    cr_assert_eq(cudaMalloc(&p, tot * 2), cudaErrorMemoryAllocation);
    cr_assert_eq(cudaGetLastError(), cudaErrorMemoryAllocation);
    cr_assert_eq(cudaGetLastError(), cudaSuccess, "an allocation failure is not sticky");
}

/* ---- speed: a launch of 64 blocks x 256 threads with a few barriers takes milliseconds -------- */
__global__ void barriers_kernel(float *out) {
    __shared__ float s[256];
    float v = (float)threadIdx.x;
    for (int r = 0; r < 4; r++) {
        s[threadIdx.x] = v;
        __syncthreads();
        v += s[(threadIdx.x + 1) % 256];
        __syncthreads();
    }
    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
    if (threadIdx.x == 0) out[blockIdx.x] = v;
}

__global__ void wait_loop_kernel(int iters, float *out) {
    float v = 0;
    for (int i = 0; i < iters; i++) {
        v += 1;
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] = v;
}

Test(cuemu, launch_speed) {
    float *d = nullptr;
    CK(cudaMalloc(&d, 64 * sizeof(float)));
    DT_LAUNCH(barriers_kernel, 64, 256, 0, 0)(d); /* warm-up: stacks */
    CK(cudaDeviceSynchronize());
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const int reps = 5;
    for (int r = 0; r < reps; r++) DT_LAUNCH(barriers_kernel, 64, 256, 0, 0)(d);
    CK(cudaDeviceSynchronize());
    clock_gettime(CLOCK_MONOTONIC, &t1);
    CK(cudaGetLastError());
    double ms = ((double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6) / reps;
    /* 64 x 256 threads, 8 barriers and 5 shuffles each: about 230k fiber switches. */
    fprintf(stderr, "cuemu: launch of 64 blocks x 256 threads, 8 __syncthreads + 5 shuffles: %.2f ms\n", ms);
    cr_assert_lt(ms, 2000.0, "a small launch took %.0f ms", ms);
    /* Cost of one thread waiting at one barrier (one fiber switch in the emulator). */
    clock_gettime(CLOCK_MONOTONIC, &t0);
    DT_LAUNCH(wait_loop_kernel, 1, 1024, 0, 0)(200, d);
    CK(cudaDeviceSynchronize());
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns = ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / (1024.0 * 200);
    fprintf(stderr, "cuemu: one thread's wait at __syncthreads: %.1f ns\n", ns);
    cr_assert_eq(dev_download(d, 1)[0], 200.0f);
    cudaFree(d);
}

/* ---- cuBLASLt and cuBLAS against a naive double loop ---------------------------------------------- */
struct mat_t {
    cudaDataType type;
    int rows, cols, ld, batch;
    long long stride;
    std::vector<float> h; /* host values, exactly representable in `type` */
    void *d = nullptr;
};

static size_t tsize(cudaDataType t) { return t == CUDA_R_16BF ? 2 : 4; }
static float round_to(cudaDataType t, float v) { return t == CUDA_R_16BF ? __bfloat162float(__float2bfloat16(v)) : v; }

/* A batch of column-major matrices with random values (or poison-like NaN in the padding). */
static void mat_init(mat_t &m, cudaDataType t, int rows, int cols, int ld, int batch, long long stride, bool fill) {
    m.type = t;
    m.rows = rows;
    m.cols = cols;
    m.ld = ld;
    m.batch = batch;
    m.stride = stride;
    size_t n = batch ? (size_t)((batch - 1) * stride + (long long)(cols - 1) * ld + rows) : 0;
    m.h.assign(n, NAN); /* padding between columns and batches is NaN: it must never be read */
    for (int b = 0; b < batch; b++)
        for (int j = 0; j < cols; j++)
            for (int i = 0; i < rows; i++) m.h[(size_t)(b * stride + (long long)j * ld + i)] = fill ? round_to(t, frand()) : NAN;
    CK(cudaMalloc(&m.d, n * tsize(t)));
    if (t == CUDA_R_16BF) {
        std::vector<__nv_bfloat16> hb(n);
        for (size_t i = 0; i < n; i++) hb[i] = __float2bfloat16(m.h[i]);
        CK(cudaMemcpy(m.d, hb.data(), n * 2, cudaMemcpyHostToDevice));
    } else {
        CK(cudaMemcpy(m.d, m.h.data(), n * 4, cudaMemcpyHostToDevice));
    }
}

static std::vector<float> mat_download(const void *d, cudaDataType t, size_t n) {
    std::vector<float> out(n);
    if (t == CUDA_R_16BF) {
        std::vector<__nv_bfloat16> hb(n);
        CK(cudaMemcpy(hb.data(), d, n * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++) out[i] = __bfloat162float(hb[i]);
    } else {
        CK(cudaMemcpy(out.data(), d, n * 4, cudaMemcpyDeviceToHost));
    }
    return out;
}

static double gelu_ref(double x) { return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
static double dgelu_ref(double x) {
    double t = tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}

static void expect_close(float got, double ref, cudaDataType t, double scale, const char *what, int i, int j, int b) {
    double tol = t == CUDA_R_16BF ? 2e-3 * scale + 8e-3 * fabs(ref) : 2e-5 * scale + 2e-5 * fabs(ref);
    cr_assert(fabs((double)got - ref) <= tol, "%s (%d,%d) batch %d: got %.7g, expected %.7g (tol %.2g)", what, i, j, b,
              got, ref, tol);
}

struct lt_case {
    bool ta, tb;
    int m, n, k, pad; /* pad: extra leading-dimension rows */
    int batch;
    cudaDataType ab, cd;
    cublasLtEpilogue_t epi;
    float alpha, beta;
};

/* Runs one cublasLtMatmul and checks D (and bias / aux outputs) against doubles. Returns
 * false when the library does not support the case (real GPU only). */
static bool run_lt_case(const lt_case &c) {
    const int arows = c.ta ? c.k : c.m, acols = c.ta ? c.m : c.k;
    const int brows = c.tb ? c.n : c.k, bcols = c.tb ? c.k : c.n;
    const int lda = arows + c.pad, ldb = brows + c.pad, ldc = c.m + c.pad;
    const long long sa = (long long)lda * acols + 3, sb = (long long)ldb * bcols + 5, sc = (long long)ldc * c.n + 7;
    mat_t A, B, C, D;
    mat_init(A, c.ab, arows, acols, lda, c.batch, sa, true);
    mat_init(B, c.ab, brows, bcols, ldb, c.batch, sb, true);
    mat_init(C, c.cd, c.m, c.n, ldc, c.batch, sc, c.beta != 0.0f);
    mat_init(D, c.cd, c.m, c.n, ldc, c.batch, sc, false);
    const uint32_t e = c.epi;
    const bool bias_in = e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
                         e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS;
    const bool bias_out = e == CUBLASLT_EPILOGUE_DGELU_BGRAD || e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB;
    const bool aux_out = e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    const bool aux_in = e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_DGELU_BGRAD;
    const int bias_len = e == CUBLASLT_EPILOGUE_BGRADB ? c.n : c.m;
    const int aux_ld = (c.m + 7) / 8 * 8 + 8;
    mat_t bias, aux;
    if (bias_in || bias_out) mat_init(bias, c.cd, bias_len, 1, bias_len, 1, bias_len, bias_in);
    if (aux_in || aux_out) mat_init(aux, c.cd, c.m, c.n, aux_ld, 1, (long long)aux_ld * c.n, aux_in);

    cublasLtHandle_t lt;
    CKB(cublasLtCreate(&lt));
    cublasLtMatmulDesc_t desc;
    CKB(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = c.ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = c.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CKB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CKB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    CKB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
    if (bias.d) CKB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias.d, sizeof bias.d));
    if (aux.d) {
        int64_t ald = aux_ld;
        CKB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux.d, sizeof aux.d));
        CKB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ald, sizeof ald));
    }
    cublasLtMatrixLayout_t la, lb, lc;
    CKB(cublasLtMatrixLayoutCreate(&la, c.ab, arows, acols, lda));
    CKB(cublasLtMatrixLayoutCreate(&lb, c.ab, brows, bcols, ldb));
    CKB(cublasLtMatrixLayoutCreate(&lc, c.cd, c.m, c.n, ldc));
    if (c.batch > 1) {
        int32_t bc = c.batch;
        int64_t s[3] = {sa, sb, sc};
        cublasLtMatrixLayout_t ls[3] = {la, lb, lc};
        for (int i = 0; i < 3; i++) {
            CKB(cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
            CKB(cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &s[i], sizeof s[i]));
        }
    }
    cublasLtMatmulPreference_t pref;
    CKB(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws_bytes = 32u << 20;
    void *ws = nullptr;
    CK(cudaMalloc(&ws, ws_bytes));
    CKB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
    cublasLtMatmulHeuristicResult_t heur;
    int nres = 0;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &heur, &nres);
    bool ran = false;
#ifdef DT_CUEMU
    cr_assert_eq(hs, CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(nres, 1);
#endif
    cublasStatus_t ms = CUBLAS_STATUS_NOT_SUPPORTED;
    if (hs == CUBLAS_STATUS_SUCCESS && nres > 0)
        ms = cublasLtMatmul(lt, desc, &c.alpha, A.d, la, B.d, lb, &c.beta, C.d, lc, D.d, lc, &heur.algo, ws, ws_bytes, 0);
#ifdef DT_CUEMU
    cr_assert_eq(ms, CUBLAS_STATUS_SUCCESS);
#else
    /* A real library may decline a layout (odd leading dimensions or strides): skipped. */
    cr_assert(ms == CUBLAS_STATUS_SUCCESS || ms == CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmul: status %d", (int)ms);
#endif
    if (ms == CUBLAS_STATUS_SUCCESS) {
        CK(cudaDeviceSynchronize());
        ran = true;
        std::vector<float> d = mat_download(D.d, c.cd, D.h.size());
        std::vector<float> bo = bias_out ? mat_download(bias.d, c.cd, bias.h.size()) : std::vector<float>();
        std::vector<float> ao = aux_out ? mat_download(aux.d, c.cd, aux.h.size()) : std::vector<float>();
        for (int b = 0; b < c.batch; b++) {
            std::vector<double> bg(c.m, 0.0);
            for (int j = 0; j < c.n; j++)
                for (int i = 0; i < c.m; i++) {
                    double acc = 0, scale = 0;
                    for (int kk = 0; kk < c.k; kk++) {
                        double av = c.ta ? A.h[b * sa + (long long)i * lda + kk] : A.h[b * sa + (long long)kk * lda + i];
                        double bv = c.tb ? B.h[b * sb + (long long)kk * ldb + j] : B.h[b * sb + (long long)j * ldb + kk];
                        acc += av * bv;
                        scale += fabs(av * bv);
                    }
                    double v = c.alpha * acc;
                    if (c.beta != 0.0f) v += c.beta * C.h[b * sc + (long long)j * ldc + i];
                    if (bias_in) v += bias.h[i];
                    if (aux_out) expect_close(ao[(size_t)j * aux_ld + i], v, c.cd, scale + 1, "aux", i, j, b);
                    if (e == CUBLASLT_EPILOGUE_RELU || e == CUBLASLT_EPILOGUE_RELU_BIAS) v = v > 0 ? v : 0;
                    if (e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS || aux_out) v = gelu_ref(v);
                    if (aux_in) v *= dgelu_ref(aux.h[(size_t)j * aux_ld + i]);
                    bg[i] += v;
                    expect_close(d[b * sc + (long long)j * ldc + i], v, c.cd, scale + 1, "D", i, j, b);
                }
            if (e == CUBLASLT_EPILOGUE_DGELU_BGRAD)
                for (int i = 0; i < c.m; i++) expect_close(bo[i], bg[i], c.cd, c.n * 2.0, "bias grad", i, 0, b);
        }
        if (e == CUBLASLT_EPILOGUE_BGRADA)
            for (int i = 0; i < c.m; i++) {
                double s = 0;
                for (int kk = 0; kk < c.k; kk++) s += c.ta ? A.h[(long long)i * lda + kk] : A.h[(long long)kk * lda + i];
                expect_close(bo[i], s, c.cd, c.k, "bgrada", i, 0, 0);
            }
        if (e == CUBLASLT_EPILOGUE_BGRADB)
            for (int j = 0; j < c.n; j++) {
                double s = 0;
                for (int kk = 0; kk < c.k; kk++) s += c.tb ? B.h[(long long)kk * ldb + j] : B.h[(long long)j * ldb + kk];
                expect_close(bo[j], s, c.cd, c.k, "bgradb", j, 0, 0);
            }
        /* Padding between columns and batches of D is never written. */
        for (size_t i = 0; i < d.size(); i++) {
            long long b = (long long)i / sc, r = (long long)i % sc;
            bool inside = b < c.batch && r < (long long)ldc * c.n && r % ldc < c.m;
            if (!inside) cr_assert(isnan(d[i]), "D element %zu outside the matrices was written", i);
        }
    } else {
        fprintf(stderr, "cuBLASLt on this GPU does not support: ta %d tb %d %dx%dx%d pad %d batch %d types %d/%d "
                        "epilogue %d (heuristic %d, matmul %d)\n",
                c.ta, c.tb, c.m, c.n, c.k, c.pad, c.batch, (int)c.ab, (int)c.cd, (int)c.epi, (int)hs, (int)ms);
    }
    cudaFree(ws);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(lt);
    for (mat_t *mm : {&A, &B, &C, &D, &bias, &aux})
        if (mm->d) cudaFree(mm->d);
    return ran;
}

/* Every case runs in the emulator; a real library may decline odd layouts (skipped). */
static void expect_ran(int ran, int total) {
#ifdef DT_CUEMU
    cr_assert_eq(ran, total);
#else
    cr_assert_gt(ran, 0, "cuBLASLt ran none of the %d cases", total);
#endif
}

Test(cuemu_blas, lt_transposes_odd_sizes_padding) {
    const cudaDataType types[2][2] = {{CUDA_R_32F, CUDA_R_32F}, {CUDA_R_16BF, CUDA_R_16BF}};
    int ran = 0, total = 0;
    for (int ty = 0; ty < 2; ty++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                lt_case c = {ta != 0, tb != 0, 37, 23, 29, 0, 1, types[ty][0], types[ty][1], CUBLASLT_EPILOGUE_DEFAULT, 1.0f, 0.0f};
                ran += run_lt_case(c);
                c.pad = 5; /* lda > rows */
                c.alpha = 0.5f;
                c.beta = -1.5f;
                ran += run_lt_case(c);
                total += 2;
            }
    lt_case mixed = {true, false, 16, 9, 40, 3, 1, CUDA_R_16BF, CUDA_R_32F, CUBLASLT_EPILOGUE_DEFAULT, 1.0f, 1.0f};
    ran += run_lt_case(mixed); /* bf16 inputs with fp32 output */
    expect_ran(ran, total + 1);
}

Test(cuemu_blas, lt_batched_strided) {
    lt_case c = {false, true, 13, 17, 8, 2, 4, CUDA_R_32F, CUDA_R_32F, CUBLASLT_EPILOGUE_DEFAULT, 1.0f, 0.0f};
    int ran = run_lt_case(c);
    c.ab = c.cd = CUDA_R_16BF;
    c.ta = true;
    ran += run_lt_case(c);
    c.pad = 0; /* 16-byte aligned columns; the batch strides stay odd */
    c.m = c.k = 16;
    ran += run_lt_case(c);
    expect_ran(ran, 3);
}

Test(cuemu_blas, lt_epilogues) {
    const cublasLtEpilogue_t epis[] = {CUBLASLT_EPILOGUE_RELU,     CUBLASLT_EPILOGUE_BIAS,          CUBLASLT_EPILOGUE_RELU_BIAS,
                                       CUBLASLT_EPILOGUE_GELU,     CUBLASLT_EPILOGUE_GELU_BIAS,     CUBLASLT_EPILOGUE_GELU_AUX,
                                       CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUBLASLT_EPILOGUE_DGELU, CUBLASLT_EPILOGUE_DGELU_BGRAD,
                                       CUBLASLT_EPILOGUE_BGRADA,   CUBLASLT_EPILOGUE_BGRADB};
    int ran = 0, total = 0;
    for (cublasLtEpilogue_t e : epis)
        for (int ty = 0; ty < 2; ty++) {
            cudaDataType t = ty ? CUDA_R_16BF : CUDA_R_32F;
            /* The layouts llm.c uses: forward T/N, backward data N/N, backward weights N/T. */
            bool ta = e == CUBLASLT_EPILOGUE_BGRADA || e <= CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
            bool tb = e == CUBLASLT_EPILOGUE_BGRADB;
            lt_case c = {ta, tb, 24, 19, 33, 0, 1, t, t, e, 1.0f, 0.0f};
            total++;
            ran += run_lt_case(c);
        }
    expect_ran(ran, total);
}

Test(cuemu_blas, lt_validation) {
    cublasLtHandle_t lt;
    CKB(cublasLtCreate(&lt));
    cublasLtMatmulDesc_t desc;
    CKB(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    float *a, *b, *d;
    CK(cudaMalloc(&a, 64 * 64 * 4));
    CK(cudaMalloc(&b, 64 * 64 * 4));
    CK(cudaMalloc(&d, 64 * 64 * 4));
    cublasLtMatrixLayout_t la, lb, ld, lbad, l16;
    CKB(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, 8, 8, 8));
    CKB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, 8, 8, 8));
    CKB(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, 8, 8, 8));
    CKB(cublasLtMatrixLayoutCreate(&lbad, CUDA_R_32F, 8, 8, 4)); /* ld < rows */
    CKB(cublasLtMatrixLayoutCreate(&l16, CUDA_R_16BF, 8, 8, 8));
    float one = 1.0f, zero = 0.0f;
    CKB(cublasLtMatmul(lt, desc, &one, a, la, b, lb, &zero, d, ld, d, ld, NULL, NULL, 0, 0));
    cr_assert_eq(cublasLtMatmul(lt, desc, &one, a, lbad, b, lb, &zero, d, ld, d, ld, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_INVALID_VALUE, "ld < rows");
    cr_assert_eq(cublasLtMatmul(lt, desc, &one, a, l16, b, lb, &zero, d, ld, d, ld, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_NOT_SUPPORTED, "A bf16 with B fp32");
    cr_assert_eq(cublasLtMatmul(NULL, desc, &one, a, la, b, lb, &zero, d, ld, d, ld, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_NOT_INITIALIZED);
#ifdef DT_CUEMU
    cr_assert_eq(cublasLtMatmul(lt, desc, &one, NULL, la, b, lb, &zero, d, ld, d, ld, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_INVALID_VALUE, "null A");
    cublasLtMatrixLayout_t lbig;
    CKB(cublasLtMatrixLayoutCreate(&lbig, CUDA_R_32F, 8, 8, 1000)); /* spans past the 16 KiB buffer */
    cr_assert_eq(cublasLtMatmul(lt, desc, &one, a, lbig, b, lb, &zero, d, ld, d, ld, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_INVALID_VALUE, "A read past its buffer");
    int32_t row = CUBLASLT_ORDER_ROW;
    CKB(cublasLtMatrixLayoutSetAttribute(lbig, CUBLASLT_MATRIX_LAYOUT_ORDER, &row, sizeof row));
    cr_assert_eq(cublasLtMatmul(lt, desc, &one, a, lbig, b, lb, &zero, d, ld, d, ld, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_NOT_SUPPORTED, "row-major order");
    cublasLtMatrixLayoutDestroy(lbig);
    uint32_t e = CUBLASLT_EPILOGUE_GELU_AUX;
    CKB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
    cr_assert_eq(cublasLtMatmul(lt, desc, &one, a, la, b, lb, &zero, d, ld, d, ld, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_INVALID_VALUE, "GELU_AUX without an aux pointer");
    cr_assert_eq(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, 2), CUBLAS_STATUS_INVALID_VALUE,
                 "attribute of the wrong size");
    e = CUBLASLT_EPILOGUE_DEFAULT;
    CKB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
    /* An algorithm chosen for 256-byte alignment refuses a pointer 4 bytes in; one chosen
     * with MIN_ALIGNMENT_A_BYTES = 4 takes it. */
    cublasLtMatmulPreference_t pref;
    CKB(cublasLtMatmulPreferenceCreate(&pref));
    uint32_t a256 = 256;
    CKB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a256, sizeof a256));
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    CKB(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &heur, &found));
    cr_assert_eq(found, 1);
    CKB(cublasLtMatmul(lt, desc, &one, a, la, b, lb, &zero, d, ld, d, ld, &heur.algo, NULL, 0, 0));
    cr_assert_eq(cublasLtMatmul(lt, desc, &one, a + 1, la, b, lb, &zero, d, ld, d, ld, &heur.algo, NULL, 0, 0),
                 CUBLAS_STATUS_NOT_SUPPORTED, "A 4 bytes off an algorithm's 256-byte alignment");
    uint32_t four = 4;
    CKB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &four, sizeof four));
    CKB(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &heur, &found));
    CKB(cublasLtMatmul(lt, desc, &one, a + 1, la, b, lb, &zero, d, ld, d, ld, &heur.algo, NULL, 0, 0));
    cublasLtMatmulPreferenceDestroy(pref);
#endif
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatrixLayoutDestroy(lbad);
    cublasLtMatrixLayoutDestroy(l16);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(lt);
    cr_assert_str_eq(cublasLtGetStatusName(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE");
    cudaFree(a); cudaFree(b); cudaFree(d);
}

/* cuBLAS v2: GemmStridedBatchedEx / GemmEx / Sgemm (C = alpha op(A) op(B) + beta C in place). */
static void run_v2_case(cublasHandle_t h, bool ta, bool tb, int m, int n, int k, int pad, int batch, cudaDataType ab,
                        cudaDataType cd, float alpha, float beta, int api) {
    const int arows = ta ? k : m, acols = ta ? m : k, brows = tb ? n : k, bcols = tb ? k : n;
    const int lda = arows + pad, ldb = brows + pad, ldc = m + pad;
    const long long sa = (long long)lda * acols + 1, sb = (long long)ldb * bcols, sc = (long long)ldc * n + 2;
    mat_t A, B, C;
    mat_init(A, ab, arows, acols, lda, batch, sa, true);
    mat_init(B, ab, brows, bcols, ldb, batch, sb, true);
    mat_init(C, cd, m, n, ldc, batch, sc, beta != 0.0f);
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (api == 0)
        CKB(cublasGemmStridedBatchedEx(h, oa, ob, m, n, k, &alpha, A.d, ab, lda, sa, B.d, ab, ldb, sb, &beta, C.d, cd,
                                       ldc, sc, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    else if (api == 1)
        CKB(cublasGemmEx(h, oa, ob, m, n, k, &alpha, A.d, ab, lda, B.d, ab, ldb, &beta, C.d, cd, ldc, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT));
    else
        CKB(cublasSgemm(h, oa, ob, m, n, k, &alpha, (const float *)A.d, lda, (const float *)B.d, ldb, &beta,
                        (float *)C.d, ldc));
    CK(cudaDeviceSynchronize());
    std::vector<float> c = mat_download(C.d, cd, C.h.size());
    for (int b = 0; b < batch; b++)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double acc = 0, scale = 0;
                for (int kk = 0; kk < k; kk++) {
                    double av = ta ? A.h[b * sa + (long long)i * lda + kk] : A.h[b * sa + (long long)kk * lda + i];
                    double bv = tb ? B.h[b * sb + (long long)kk * ldb + j] : B.h[b * sb + (long long)j * ldb + kk];
                    acc += av * bv;
                    scale += fabs(av * bv);
                }
                double v = alpha * acc + (beta != 0.0f ? beta * C.h[b * sc + (long long)j * ldc + i] : 0.0);
                expect_close(c[b * sc + (long long)j * ldc + i], v, cd, scale + 1, "C", i, j, b);
            }
    cudaFree(A.d); cudaFree(B.d); cudaFree(C.d);
}

Test(cuemu_blas, v2_gemm_strided_batched_gemmex_sgemm) {
    cublasHandle_t h;
    CKB(cublasCreate(&h));
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    CKB(cublasSetStream(h, s));
    CKB(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            run_v2_case(h, ta, tb, 11, 7, 13, 0, 3, CUDA_R_32F, CUDA_R_32F, 1.0f, 0.0f, 0);
            run_v2_case(h, ta, tb, 11, 7, 13, 2, 3, CUDA_R_16BF, CUDA_R_16BF, 0.125f, 0.5f, 0);
            run_v2_case(h, ta, tb, 16, 5, 3, 1, 1, CUDA_R_16BF, CUDA_R_32F, 1.0f, 1.0f, 1);
            run_v2_case(h, ta, tb, 9, 10, 17, 3, 1, CUDA_R_32F, CUDA_R_32F, -2.0f, 0.25f, 2);
        }
    float *a, one = 1.0f;
    CK(cudaMalloc(&a, 64 * 4));
    cr_assert_eq(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, a, CUDA_R_32F, 4, a, CUDA_R_32F, 8, &one, a,
                              CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_INVALID_VALUE, "lda < m");
    cr_assert_eq(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, -1, 8, 8, &one, a, CUDA_R_32F, 8, a, CUDA_R_32F, 8, &one, a,
                              CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_INVALID_VALUE, "m < 0");
    cr_assert_eq(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, a, CUDA_R_32F, 8, a, CUDA_R_32F, 8, &one, a,
                              CUDA_R_16BF, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_NOT_SUPPORTED, "fp32 inputs with a bf16 output");
    cudaFree(a);
    CKB(cublasDestroy(h));
    CK(cudaStreamDestroy(s));
    cr_assert_str_eq(cublasGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
}

/* ---- tensor cores: nvcuda::wmma 16x16x16, bf16 inputs, fp32 accumulators ------------------- */
namespace wm = nvcuda::wmma;

/* d (16x16) = a (16x16, layout LA, ld lda) * b (16x16, LB, ldb) + c (16x16, c_col, ldc). */
template <typename LA, typename LB>
__global__ void wmma_tile_kernel(const __nv_bfloat16 *a, unsigned lda, const __nv_bfloat16 *b, unsigned ldb,
                                 const float *c, unsigned ldc, int c_col, float *d, unsigned ldd, int d_col) {
    wm::fragment<wm::matrix_a, 16, 16, 16, __nv_bfloat16, LA> fa;
    wm::fragment<wm::matrix_b, 16, 16, 16, __nv_bfloat16, LB> fb;
    wm::fragment<wm::accumulator, 16, 16, 16, float> fc;
    wm::load_matrix_sync(fa, a, lda);
    wm::load_matrix_sync(fb, b, ldb);
    wm::load_matrix_sync(fc, c, ldc, c_col ? wm::mem_col_major : wm::mem_row_major);
    wm::mma_sync(fc, fa, fb, fc); /* in place: d is c */
    wm::store_matrix_sync(d, fc, ldd, d_col ? wm::mem_col_major : wm::mem_row_major);
}

static float bf16_round(float f) { return __bfloat162float(__float2bfloat16(f)); }

/* Checks got(i, j) against sum_k a[i][k] b[k][j] + c[i][j] (dense row-major host copies,
 * bf16 values held as floats): the exact sum (bf16 products are exact in fp32) within 8
 * fp32 epsilons of |c| + sum |products| (tensor cores may align and truncate the terms);
 * a wrong element or lane mapping is off by O(1). */
template <typename G>
static void wmma_check_product(const std::vector<float> &a, const std::vector<float> &b, const std::vector<float> &c,
                               int m, int n, int k, G got, const char *what) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double ref = c.empty() ? 0.0 : c[(size_t)i * n + j], mag = fabs(ref);
            for (int q = 0; q < k; q++) {
                double p = (double)a[(size_t)i * k + q] * b[(size_t)q * n + j];
                ref += p;
                mag += fabs(p);
            }
            float g = got(i, j);
            cr_assert(fabs((double)g - ref) <= 8.0 * FLT_EPSILON * mag, "%s: d[%d][%d] = %.9g, exact %.9g", what, i, j,
                      g, ref);
        }
}

template <typename LA, typename LB> static void wmma_tile_case(int c_col, int d_col) {
    const bool a_col = std::is_same<LA, wm::col_major>::value, b_col = std::is_same<LB, wm::col_major>::value;
    const unsigned lda = 24, ldb = 32, ldc = 20, ldd = 28; /* padded strides: the padding must not be read */
    std::vector<float> A(256), B(256), C(256);
    std::vector<__nv_bfloat16> ha(16 * lda, __float2bfloat16(NAN)), hb(16 * ldb, __float2bfloat16(NAN));
    std::vector<float> hc(16 * ldc, NAN);
    for (int r = 0; r < 16; r++)
        for (int q = 0; q < 16; q++) {
            A[r * 16 + q] = bf16_round(frand());
            B[r * 16 + q] = bf16_round(frand());
            C[r * 16 + q] = frand();
            ha[a_col ? q * lda + r : r * lda + q] = __float2bfloat16(A[r * 16 + q]);
            hb[b_col ? q * ldb + r : r * ldb + q] = __float2bfloat16(B[r * 16 + q]);
            hc[c_col ? q * ldc + r : r * ldc + q] = C[r * 16 + q];
        }
    __nv_bfloat16 *da = dev_upload(ha), *db = dev_upload(hb);
    float *dc = dev_upload(hc), *dd = nullptr;
    CK(cudaMalloc(&dd, 16 * ldd * sizeof(float)));
    CK(cudaMemset(dd, 0, 16 * ldd * sizeof(float)));
    void (*kern)(const __nv_bfloat16 *, unsigned, const __nv_bfloat16 *, unsigned, const float *, unsigned, int,
                 float *, unsigned, int) = wmma_tile_kernel<LA, LB>;
    DT_LAUNCH(kern, 1, 32, 0, 0)(da, lda, db, ldb, dc, ldc, c_col, dd, ldd, d_col);
    CK(cudaGetLastError());
    std::vector<float> hd = dev_download(dd, 16 * ldd);
    char what[96];
    snprintf(what, sizeof what, "a %s, b %s, c %s, d %s", a_col ? "col" : "row", b_col ? "col" : "row",
             c_col ? "col" : "row", d_col ? "col" : "row");
    wmma_check_product(A, B, C, 16, 16, 16, [&](int i, int j) { return hd[d_col ? j * ldd + i : i * ldd + j]; },
                       what);
    for (unsigned s = 0; s < 16; s++) /* the store left the padding alone */
        for (unsigned q = 16; q < ldd; q++) cr_assert_eq(hd[s * ldd + q], 0.0f, "%s: padding %u,%u written", what, s, q);
    CK(cudaFree(da));
    CK(cudaFree(db));
    CK(cudaFree(dc));
    CK(cudaFree(dd));
}

Test(cuemu_wmma, one_warp_every_layout) {
    for (int cl = 0; cl < 2; cl++)
        for (int dl = 0; dl < 2; dl++) {
            wmma_tile_case<wm::row_major, wm::row_major>(cl, dl);
            wmma_tile_case<wm::row_major, wm::col_major>(cl, dl);
            wmma_tile_case<wm::col_major, wm::row_major>(cl, dl);
            wmma_tile_case<wm::col_major, wm::col_major>(cl, dl);
        }
    typedef wm::fragment<wm::accumulator, 16, 16, 16, float> acc_t;
    typedef wm::fragment<wm::matrix_a, 16, 16, 16, __nv_bfloat16, wm::row_major> a_t;
    typedef wm::fragment<wm::matrix_b, 16, 16, 16, __nv_bfloat16, wm::col_major> b_t;
    cr_assert_eq((int)acc_t::num_elements, 8);
    cr_assert_eq((int)a_t::num_elements, 8);
    cr_assert_eq((int)b_t::num_elements, 8);
}

/* d = (2a) b + (0.5c + 1), by element-wise work on x[]; d1 = ones(16x16) b (fill_fragment of
 * a bf16 fragment), from a zero accumulator. */
__global__ void wmma_scale_kernel(const __nv_bfloat16 *a, const __nv_bfloat16 *b, const float *c, float *d,
                                  float *d1) {
    wm::fragment<wm::matrix_a, 16, 16, 16, __nv_bfloat16, wm::row_major> fa, ones_a;
    wm::fragment<wm::matrix_b, 16, 16, 16, __nv_bfloat16, wm::col_major> fb;
    wm::fragment<wm::accumulator, 16, 16, 16, float> fc, ones, acc;
    wm::load_matrix_sync(fa, a, 16);
    wm::load_matrix_sync(fb, b, 16);
    wm::load_matrix_sync(fc, c, 16, wm::mem_row_major);
    for (int i = 0; i < fa.num_elements; i++) fa.x[i] = __float2bfloat16(__bfloat162float(fa.x[i]) * 2.0f);
    wm::fill_fragment(ones, 1.0f);
    for (int i = 0; i < fc.num_elements; i++) fc.x[i] = fc.x[i] * 0.5f + ones.x[i];
    wm::fragment<wm::accumulator, 16, 16, 16, float> out;
    wm::mma_sync(out, fa, fb, fc);
    wm::store_matrix_sync(d, out, 16, wm::mem_row_major);
    wm::fill_fragment(ones_a, __float2bfloat16(1.0f));
    wm::fill_fragment(acc, 0.0f);
    wm::mma_sync(acc, ones_a, fb, acc);
    wm::store_matrix_sync(d1, acc, 16, wm::mem_col_major);
}

Test(cuemu_wmma, fragment_elementwise_scaling_and_fill) {
    std::vector<float> A(256), A2(256), B(256), C(256), C2(256), ONES(256, 1.0f);
    std::vector<__nv_bfloat16> ha(256), hb(256);
    for (int r = 0; r < 16; r++)
        for (int q = 0; q < 16; q++) {
            A[r * 16 + q] = bf16_round(frand());
            A2[r * 16 + q] = 2.0f * A[r * 16 + q];
            B[r * 16 + q] = bf16_round(frand());
            C[r * 16 + q] = frand();
            C2[r * 16 + q] = C[r * 16 + q] * 0.5f + 1.0f;
            ha[r * 16 + q] = __float2bfloat16(A[r * 16 + q]);
            hb[q * 16 + r] = __float2bfloat16(B[r * 16 + q]); /* b is column-major */
        }
    __nv_bfloat16 *da = dev_upload(ha), *db = dev_upload(hb);
    float *dc = dev_upload(C), *dd = nullptr, *dd1 = nullptr;
    CK(cudaMalloc(&dd, 256 * sizeof(float)));
    CK(cudaMalloc(&dd1, 256 * sizeof(float)));
    DT_LAUNCH(wmma_scale_kernel, 1, 32, 0, 0)(da, db, dc, dd, dd1);
    CK(cudaGetLastError());
    std::vector<float> hd = dev_download(dd, 256), hd1 = dev_download(dd1, 256);
    wmma_check_product(A2, B, C2, 16, 16, 16, [&](int i, int j) { return hd[i * 16 + j]; }, "scaled x[]");
    wmma_check_product(ONES, B, std::vector<float>(), 16, 16, 16, [&](int i, int j) { return hd1[j * 16 + i]; },
                       "filled a");
    CK(cudaFree(da));
    CK(cudaFree(db));
    CK(cudaFree(dc));
    CK(cudaFree(dd));
    CK(cudaFree(dd1));
}

/* d (64x64) = a (64x32) b (32x64) per block (all row-major, dense): 4 warps, each a 32x32
 * quadrant of 2x2 tiles; a and b staged in shared memory with padded rows. */
__global__ void wmma_block_kernel(const __nv_bfloat16 *a, const __nv_bfloat16 *b, float *d) {
    __shared__ __align__(32) __nv_bfloat16 sa[64 * 40];
    __shared__ __align__(32) __nv_bfloat16 sb[32 * 72];
    a += (size_t)blockIdx.x * 64 * 32;
    b += (size_t)blockIdx.x * 32 * 64;
    d += (size_t)blockIdx.x * 64 * 64;
    for (int i = threadIdx.x; i < 64 * 32; i += blockDim.x) sa[(i / 32) * 40 + i % 32] = a[i];
    for (int i = threadIdx.x; i < 32 * 64; i += blockDim.x) sb[(i / 64) * 72 + i % 64] = b[i];
    __syncthreads();
    int warp = threadIdx.x / 32, wr = (warp / 2) * 32, wc = (warp % 2) * 32;
    wm::fragment<wm::accumulator, 16, 16, 16, float> acc[2][2];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) wm::fill_fragment(acc[i][j], 0.0f);
    for (int k = 0; k < 32; k += 16) {
        wm::fragment<wm::matrix_a, 16, 16, 16, __nv_bfloat16, wm::row_major> fa[2];
        wm::fragment<wm::matrix_b, 16, 16, 16, __nv_bfloat16, wm::row_major> fb[2];
        for (int i = 0; i < 2; i++) wm::load_matrix_sync(fa[i], sa + (wr + 16 * i) * 40 + k, 40);
        for (int j = 0; j < 2; j++) wm::load_matrix_sync(fb[j], sb + k * 72 + wc + 16 * j, 72);
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++) wm::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            wm::store_matrix_sync(d + (wr + 16 * i) * 64 + wc + 16 * j, acc[i][j], 64, wm::mem_row_major);
}

Test(cuemu_wmma, four_warps_tile_64x64x32_through_shared_memory) {
    const int blocks = 2; /* even and odd blocks run their threads in opposite orders here */
    std::vector<float> A(blocks * 64 * 32), B(blocks * 32 * 64);
    std::vector<__nv_bfloat16> ha(A.size()), hb(B.size());
    for (size_t i = 0; i < A.size(); i++) ha[i] = __float2bfloat16(A[i] = bf16_round(frand()));
    for (size_t i = 0; i < B.size(); i++) hb[i] = __float2bfloat16(B[i] = bf16_round(frand()));
    __nv_bfloat16 *da = dev_upload(ha), *db = dev_upload(hb);
    float *dd = nullptr;
    CK(cudaMalloc(&dd, blocks * 64 * 64 * sizeof(float)));
    DT_LAUNCH(wmma_block_kernel, blocks, 128, 0, 0)(da, db, dd);
    CK(cudaGetLastError());
    std::vector<float> hd = dev_download(dd, blocks * 64 * 64);
    for (int blk = 0; blk < blocks; blk++) {
        std::vector<float> a(A.begin() + blk * 2048, A.begin() + (blk + 1) * 2048);
        std::vector<float> b(B.begin() + blk * 2048, B.begin() + (blk + 1) * 2048);
        wmma_check_product(a, b, std::vector<float>(), 64, 64, 32,
                           [&](int i, int j) { return hd[(size_t)blk * 4096 + i * 64 + j]; }, "64x64x32");
    }
    CK(cudaFree(da));
    CK(cudaFree(db));
    CK(cudaFree(dd));
}

#ifdef DT_CUEMU
/* ---- the emulator's loud failures ---------------------------------------------------------------- */
__global__ void divergent_barrier_kernel(float *out) {
    if (threadIdx.x < 16) {
        __syncthreads();
    }
    out[threadIdx.x] = 1.0f;
}

Test(cuemu_loud, divergent_syncthreads_aborts, .signal = SIGABRT) {
    float *d = nullptr;
    CK(cudaMalloc(&d, 64 * sizeof(float)));
    DT_LAUNCH(divergent_barrier_kernel, 1, 64, 0, 0)(d);
}

__global__ void early_exit_barrier_kernel(float *out, int n) {
    int i = threadIdx.x;
    if (i >= n) return;
    __syncthreads();
    out[i] = 1.0f;
}

Test(cuemu_loud, barrier_after_early_return_aborts, .signal = SIGABRT) {
    float *d = nullptr;
    CK(cudaMalloc(&d, 64 * sizeof(float)));
    DT_LAUNCH(early_exit_barrier_kernel, 1, 64, 0, 0)(d, 40);
}

__global__ void two_barriers_kernel(float *out) {
    if (threadIdx.x % 2) {
        __syncthreads();
    } else {
        __syncthreads();
    }
    out[threadIdx.x] = 1.0f;
}

Test(cuemu_loud, different_barriers_abort, .signal = SIGABRT) {
    float *d = nullptr;
    CK(cudaMalloc(&d, 64 * sizeof(float)));
    DT_LAUNCH(two_barriers_kernel, 1, 64, 0, 0)(d);
}

__global__ void shfl_exited_kernel(float *out) {
    if (threadIdx.x >= 24) return;
    out[threadIdx.x] = __shfl_down_sync(0xffffffffu, 1.0f, 1);
}

Test(cuemu_loud, shuffle_with_exited_lane_aborts, .signal = SIGABRT) {
    float *d = nullptr;
    CK(cudaMalloc(&d, 32 * sizeof(float)));
    DT_LAUNCH(shfl_exited_kernel, 1, 32, 0, 0)(d);
}

__global__ void shfl_vs_barrier_kernel(float *out) {
    float v = 1.0f;
    if (threadIdx.x == 0) v = __shfl_xor_sync(0xffffffffu, v, 1);
    __syncthreads();
    out[threadIdx.x] = v;
}

Test(cuemu_loud, shuffle_against_barrier_deadlock_aborts, .signal = SIGABRT) {
    float *d = nullptr;
    CK(cudaMalloc(&d, 32 * sizeof(float)));
    DT_LAUNCH(shfl_vs_barrier_kernel, 1, 32, 0, 0)(d);
}

__global__ void partial_warp_mask_kernel(float *out) {
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

Test(cuemu_loud, full_mask_in_partial_warp_aborts, .signal = SIGABRT) {
    float *d = nullptr;
    CK(cudaMalloc(&d, 48 * sizeof(float)));
    DT_LAUNCH(partial_warp_mask_kernel, 1, 48, 0, 0)(d);
}

__global__ void read_kernel(const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    y[i % 4] = x[i] + (float)n; /* no bounds check: reads past x */
}

Test(cuemu_loud, out_of_bounds_read_faults, .signal = SIGSEGV) {
    float *x = nullptr, *y = nullptr;
    CK(cudaMalloc(&x, 1000 * sizeof(float))); /* 4000 bytes: a multiple of 32, not of 256 */
    CK(cudaMalloc(&y, 4 * sizeof(float)));
    DT_LAUNCH(read_kernel, 40, 256, 0, 0)(x, y, 0);
}

__global__ void write_kernel(float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) y[i] = 0.0f; /* off by one: writes y[n] */
}

Test(cuemu_loud, out_of_bounds_write_aborts, .signal = SIGABRT) {
    float *y = nullptr;
    CK(cudaMalloc(&y, 100 * sizeof(float)));
    DT_LAUNCH(write_kernel, 1, 128, 0, 0)(y, 100);
}

__global__ void smem_overflow_kernel(float *out, int n) {
    DT_DYN_SMEM(float, s);
    for (int i = threadIdx.x; i < n + 1024; i += blockDim.x) s[i] = 0.0f; /* past the end */
    out[0] = s[0];
}

Test(cuemu_loud, dynamic_shared_memory_overflow_faults, .signal = SIGSEGV) {
    float *d = nullptr;
    CK(cudaMalloc(&d, sizeof(float)));
    DT_LAUNCH(smem_overflow_kernel, 1, 64, 256 * sizeof(float), 0)(d, 256);
}

__global__ void big_frame_kernel(float *out, int n) {
    volatile float local[40000]; /* 160 KB: more than a thread's stack here */
    for (int i = 0; i < n; i++) local[i * 997 % 40000] = (float)i;
    out[0] = local[n % 40000];
}

Test(cuemu_loud, stack_overflow_faults, .signal = SIGSEGV) {
    float *d = nullptr;
    CK(cudaMalloc(&d, sizeof(float)));
    DT_LAUNCH(big_frame_kernel, 1, 2, 0, 0)(d, 40000);
}

__global__ void partial_write_kernel(float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n / 2) y[i] = 1.0f;
}

__global__ void misaligned_kernel(const float *x, float *y) {
    float4 v = __ldg(reinterpret_cast<const float4 *>(x + 1)); /* 4-byte aligned, not 16 */
    y[0] = v.x;
}

Test(cuemu_loud, misaligned_vector_load_aborts, .signal = SIGABRT) {
    float *x = nullptr;
    CK(cudaMalloc(&x, 64 * sizeof(float)));
    DT_LAUNCH(misaligned_kernel, 1, 1, 0, 0)(x, x);
}

Test(cuemu_loud, poison_shows_unwritten_memory) {
    const int n = 100;
    float *y = nullptr;
    __nv_bfloat16 *b = nullptr;
    CK(cudaMalloc(&y, n * sizeof(float)));
    CK(cudaMalloc(&b, n * 2));
    DT_LAUNCH(partial_write_kernel, 1, 128, 0, 0)(y, n);
    CK(cudaGetLastError());
    std::vector<float> h = dev_download(y, n);
    std::vector<__nv_bfloat16> hb = dev_download(b, n);
    for (int i = 0; i < n; i++) {
        if (i < n / 2)
            cr_assert_eq(h[i], 1.0f);
        else
            cr_assert(isnan(h[i]), "unwritten element %d is %f, not NaN", i, h[i]);
        cr_assert(isnan(__bfloat162float(hb[i])), "fresh bf16 memory is NaN");
    }
    cudaFree(y);
    cudaFree(b);
}

/* Block b reads its shared array before writing it: poison, not block b-1's values.
 * (Static __shared__ in templates is not covered: GCC puts template statics in their
 * own COMDAT sections whatever the section attribute says.) */
__global__ void stale_shared_kernel(float *out) {
    __shared__ float buf[64];
    __shared__ int ibuf[64];
    out[2 * (blockIdx.x * 64 + threadIdx.x)] = buf[threadIdx.x];
    out[2 * (blockIdx.x * 64 + threadIdx.x) + 1] = (float)ibuf[threadIdx.x];
    __syncthreads();
    buf[threadIdx.x] = 1.0f;
    ibuf[threadIdx.x] = 1;
}

Test(cuemu_loud, static_shared_memory_poisoned_per_block) {
    float *d = nullptr;
    CK(cudaMalloc(&d, 2 * 3 * 64 * sizeof(float)));
    DT_LAUNCH(stale_shared_kernel, 3, 64, 0, 0)(d);
    CK(cudaGetLastError());
    std::vector<float> h = dev_download(d, 2 * 3 * 64);
    for (int i = 0; i < 3 * 64; i++) {
        cr_assert(isnan(h[2 * i]), "float element %d: %f", i, h[2 * i]);
        cr_assert_eq(h[2 * i + 1], -1.0f, "int element %d: %f (0xFFFFFFFF is -1)", i, h[2 * i + 1]);
    }
    cudaFree(d);
}

Test(cuemu_loud, host_dereference_of_device_memory_faults, .signal = SIGSEGV) {
    setenv("DTRUN_CUEMU_HOST_GUARD", "1", 1); /* read at the first call of this process */
    float *d = nullptr;
    CK(cudaMalloc(&d, 16 * sizeof(float)));
    CK(cudaMemset(d, 0, 16 * sizeof(float)));
    volatile float *v = d;
    v[3] = 1.0f; /* host code writing device memory: a crash on a GPU machine too */
}

/* A missing barrier: thread i reads what thread i-1 wrote. Odd blocks run their threads
 * last to first, so the race shows as poison there. */
__global__ void racy_kernel(float *out) {
    __shared__ float s[64];
    s[threadIdx.x] = (float)threadIdx.x;
    out[blockIdx.x * 64 + threadIdx.x] = threadIdx.x > 0 ? s[threadIdx.x - 1] : -1.0f; /* no __syncthreads */
}

Test(cuemu_loud, missing_barrier_shows_in_reverse_order_blocks) {
    float *d = nullptr;
    CK(cudaMalloc(&d, 2 * 64 * sizeof(float)));
    DT_LAUNCH(racy_kernel, 2, 64, 0, 0)(d);
    std::vector<float> h = dev_download(d, 2 * 64);
    for (int i = 1; i < 64; i++) cr_assert_eq(h[i], (float)(i - 1), "block 0 (first to last) element %d", i);
    for (int i = 1; i < 64; i++) cr_assert(isnan(h[64 + i]), "block 1 (last to first) element %d: %f", i, h[64 + i]);
    cudaFree(d);
}

Test(cuemu_loud, memcpy_kind_and_range_checked) {
    float *d = nullptr, h[64];
    memset(h, 0, sizeof h);
    CK(cudaMalloc(&d, 64 * sizeof(float)));
    cr_assert_eq(cudaMemcpy(d, h, sizeof h, cudaMemcpyDeviceToHost), cudaErrorInvalidValue, "D2H into device memory");
    cr_assert_eq(cudaMemcpy(h, d, sizeof h, cudaMemcpyHostToDevice), cudaErrorInvalidValue, "H2D into host memory");
    cr_assert_eq(cudaMemcpy(h, h + 32, 16, cudaMemcpyDeviceToDevice), cudaErrorInvalidValue, "D2D between host");
    cr_assert_eq(cudaMemcpy(d + 1, h, sizeof h, cudaMemcpyHostToDevice), cudaErrorInvalidValue, "4 bytes past the end");
    cr_assert_eq(cudaMemcpy(d, h, sizeof h, (cudaMemcpyKind)7), cudaErrorInvalidMemcpyDirection);
    cr_assert_eq(cudaMemset(h, 0, sizeof h), cudaErrorInvalidValue, "memset of host memory");
    CK(cudaMemcpy(d, h, sizeof h, cudaMemcpyDefault));
    CK(cudaMemcpy(d + 32, d, 32 * sizeof(float), cudaMemcpyDeviceToDevice));
    cr_assert_eq(cudaFree(h), cudaErrorInvalidValue, "cudaFree of a host pointer");
    cr_assert_eq(cudaFree(d + 1), cudaErrorInvalidValue, "cudaFree inside an allocation");
    CK(cudaFree(d));
    cr_assert_eq(cudaFree(d), cudaErrorInvalidValue, "double cudaFree");
    cr_assert_eq(cudaStreamSynchronize((cudaStream_t)(uintptr_t)0x1234), cudaErrorInvalidResourceHandle);
}

Test(cuemu_loud, cuda_visible_devices) {
    setenv("DTRUN_CUEMU_GPUS", "2", 1);
    int n = -1;
    setenv("CUDA_VISIBLE_DEVICES", "1", 1);
    CK(cudaGetDeviceCount(&n));
    cr_assert_eq(n, 1);
    setenv("CUDA_VISIBLE_DEVICES", "0,1,7,1", 1); /* stops at the first invalid entry */
    CK(cudaGetDeviceCount(&n));
    cr_assert_eq(n, 2);
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    cr_assert_eq(cudaGetDeviceCount(&n), cudaErrorNoDevice);
    cr_assert_eq(n, 0);
    unsetenv("CUDA_VISIBLE_DEVICES");
    unsetenv("DTRUN_CUEMU_GPUS");
}

Test(cuemu_loud, no_gpu_when_asked) {
    setenv("DTRUN_CUEMU_GPUS", "0", 1);
    int n = 7;
    void *p = nullptr;
    cr_assert_eq(cudaGetDeviceCount(&n), cudaErrorNoDevice);
    cr_assert_eq(n, 0);
    cr_assert_eq(cudaMalloc(&p, 16), cudaErrorNoDevice);
    cr_assert_eq(cudaSetDevice(0), cudaErrorNoDevice);
    unsetenv("DTRUN_CUEMU_GPUS");
}
/* WMMA misuse: CUDA's rules for load/store/mma_sync, each an abort naming the kernel. */
__global__ void wmma_load_kernel(const __nv_bfloat16 *a, unsigned ldm, int skip_lane, int per_lane_ptr) {
    if ((int)threadIdx.x == skip_lane) return;
    wm::fragment<wm::matrix_a, 16, 16, 16, __nv_bfloat16, wm::row_major> fa;
    wm::load_matrix_sync(fa, per_lane_ptr ? a + 16 * (threadIdx.x % 2) : a, ldm);
}

Test(cuemu_loud, wmma_misaligned_pointer_aborts, .signal = SIGABRT) {
    __nv_bfloat16 *a = nullptr;
    CK(cudaMalloc(&a, 32 * 16 * sizeof(__nv_bfloat16)));
    DT_LAUNCH(wmma_load_kernel, 1, 32, 0, 0)(a + 8, 16u, -1, 0); /* 16-byte aligned, not 32 */
}

Test(cuemu_loud, wmma_bad_ldm_aborts, .signal = SIGABRT) {
    __nv_bfloat16 *a = nullptr;
    CK(cudaMalloc(&a, 32 * 16 * sizeof(__nv_bfloat16)));
    DT_LAUNCH(wmma_load_kernel, 1, 32, 0, 0)(a, 20u, -1, 0); /* not a multiple of 8 */
}

Test(cuemu_loud, wmma_lane_not_participating_aborts, .signal = SIGABRT) {
    __nv_bfloat16 *a = nullptr;
    CK(cudaMalloc(&a, 32 * 16 * sizeof(__nv_bfloat16)));
    DT_LAUNCH(wmma_load_kernel, 1, 64, 0, 0)(a, 16u, 37, 0); /* lane 5 of warp 1 returns */
}

Test(cuemu_loud, wmma_lanes_with_different_pointers_abort, .signal = SIGABRT) {
    __nv_bfloat16 *a = nullptr;
    CK(cudaMalloc(&a, 32 * 16 * sizeof(__nv_bfloat16)));
    DT_LAUNCH(wmma_load_kernel, 1, 32, 0, 0)(a, 32u, -1, 1);
}

Test(cuemu_loud, wmma_partial_warp_aborts, .signal = SIGABRT) {
    __nv_bfloat16 *a = nullptr;
    CK(cudaMalloc(&a, 32 * 16 * sizeof(__nv_bfloat16)));
    DT_LAUNCH(wmma_load_kernel, 1, 48, 0, 0)(a, 16u, -1, 0); /* the second warp has 16 lanes */
}

__global__ void wmma_store_kernel(float *d, unsigned ldm) {
    wm::fragment<wm::accumulator, 16, 16, 16, float> acc;
    wm::fill_fragment(acc, 1.0f);
    wm::store_matrix_sync(d, acc, ldm, wm::mem_col_major);
}

Test(cuemu_loud, wmma_store_bad_float_ldm_aborts, .signal = SIGABRT) {
    float *d = nullptr;
    CK(cudaMalloc(&d, 32 * 16 * sizeof(float)));
    DT_LAUNCH(wmma_store_kernel, 1, 32, 0, 0)(d, 18u); /* floats: a multiple of 4 */
}

/* Lanes 0..15 at mma_sync while lanes 16..31 wait at a __syncthreads: a deadlock. */
__global__ void wmma_divergent_kernel(float *d) {
    wm::fragment<wm::matrix_a, 16, 16, 16, __nv_bfloat16, wm::row_major> fa;
    wm::fragment<wm::matrix_b, 16, 16, 16, __nv_bfloat16, wm::row_major> fb;
    wm::fragment<wm::accumulator, 16, 16, 16, float> acc;
    wm::fill_fragment(fa, __float2bfloat16(1.0f));
    wm::fill_fragment(fb, __float2bfloat16(1.0f));
    wm::fill_fragment(acc, 0.0f);
    if (threadIdx.x < 16) wm::mma_sync(acc, fa, fb, acc);
    __syncthreads();
    wm::store_matrix_sync(d, acc, 16, wm::mem_row_major);
}

Test(cuemu_loud, wmma_divergent_mma_aborts, .signal = SIGABRT) {
    float *d = nullptr;
    CK(cudaMalloc(&d, 256 * sizeof(float)));
    DT_LAUNCH(wmma_divergent_kernel, 1, 32, 0, 0)(d);
}

/* The same kernel, well formed: a column-major store with ldm 32 writes rows 0..15 of
 * each column and leaves rows 16..31 as they were (poison). */
Test(cuemu_loud, wmma_store_good_ldm_runs) {
    float *d = nullptr;
    CK(cudaMalloc(&d, 32 * 16 * sizeof(float)));
    DT_LAUNCH(wmma_store_kernel, 1, 32, 0, 0)(d, 32u);
    CK(cudaGetLastError());
    std::vector<float> h = dev_download(d, 32 * 16);
    for (int c = 0; c < 16; c++)
        for (int r = 0; r < 32; r++)
            cr_assert(r < 16 ? h[c * 32 + r] == 1.0f : isnan(h[c * 32 + r]), "col %d row %d: %f", c, r, h[c * 32 + r]);
    CK(cudaFree(d));
}

#endif /* DT_CUEMU */
