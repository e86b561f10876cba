/*
 * test_cuemu_wmma.cu - tensor cores (nvcuda::wmma 16x16x16, bf16 in, fp32
 * accumulators) against a reference product, and, under DT_CUEMU, the emulator's
 * loud failures: divergent barriers, exited lanes, out-of-bounds and misaligned
 * accesses, poisoned memory, bad wmma use (test_cuemu.cuh).
 */
#include "tests/cuemu/test_cuemu.cuh"

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
