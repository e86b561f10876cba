/*
 * test_cuemu.cu - the CUDA emulator's own tests, written as CUDA: these files are
 * built by g++ against tests/cuemu/cuemu.h (build-emu/tests/cuemu/test_cuemu, run by
 * `make test`) and by nvcc against the real CUDA (build/tests/cuemu/test_cuemu, run
 * by `make gpu-tests` on a GPU machine), so a GPU run cross-checks that the emulator
 * means what CUDA means. Here: blocks, warps, shared memory, atomics, grids, bf16,
 * the runtime API and launch speed. cuBLAS is test_cuemu_blas.cu; tensor cores and
 * the emulator's loud failures (#ifdef DT_CUEMU: aborts, faults, poison that a real
 * GPU does not promise) are test_cuemu_wmma.cu.
 */
#include "tests/cuemu/test_cuemu.cuh"

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
