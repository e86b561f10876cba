/*
 * cuemu_blas.cc - the emulator's cuBLASLt and cuBLAS: the subset in cuemu.h, with
 * CUDA 13's semantics. Column-major; D = epilogue(alpha op(A) op(B) + beta C [+ bias]);
 * fp32 accumulation (inputs widened to fp32, each sum in order over k), bf16
 * outputs rounded to nearest even. As in BLAS, C is not read when beta == 0 and A, B
 * are not read when alpha == 0 (so poisoned, unwritten outputs do not leak in).
 *
 * Validation returns the library's statuses: CUBLAS_STATUS_NOT_INITIALIZED for a null
 * handle, CUBLAS_STATUS_INVALID_VALUE for bad sizes, leading dimensions, null pointers
 * or buffers that the operation would read or write past the end of (the emulator
 * knows each cudaMalloc'd buffer's size), CUBLAS_STATUS_NOT_SUPPORTED for type,
 * order or epilogue combinations outside the subset. Each failure says why on stderr.
 *
 * Epilogues (the cuBLAS documentation's meaning; GELU is the tanh approximation):
 *   BIAS        bias[i] (length rows of D) added to every column before the activation
 *   RELU, GELU  applied to the result; *_AUX writes the activation's input (after the
 *               bias) to the aux matrix (type of D unless AUX_DATA_TYPE, ld AUX_LD)
 *   DGELU       D = result * gelu'(aux) (aux holds the forward pass's GELU input)
 *   DGELU_BGRAD also bias[i] = sum over the columns of D (after the gradient)
 *   BGRADA      bias[i] = sum over k of op(A)[i, k] (length rows of D)
 *   BGRADB      bias[j] = sum over k of op(B)[k, j] (length columns of D)
 */
#include <stdarg.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "tests/cuemu/cuemu_internal.h"

using namespace cuemu;

struct cublasLtContext {
    int magic;
};
struct cublasContext {
    cudaStream_t stream;
    cublasMath_t math;
};

namespace {

constexpr int LT_MAGIC = 0x4c74;
constexpr uint64_t ALGO_MAGIC = 0x6375656d75ull; /* "cuemu" */

/* The largest power of two (up to 256) dividing the address; 256 for NULL. */
uint64_t ptr_align(const void *p) {
    uintptr_t u = (uintptr_t)p;
    if (!u) return 256;
    uint64_t a = 1;
    while (a < 256 && u % (a * 2) == 0) a *= 2;
    return a;
}

struct layout_t {
    cudaDataType type;
    uint64_t rows, cols;
    int64_t ld;
    int32_t order;
    int32_t batch;
    int64_t stride;
};
static_assert(sizeof(layout_t) <= sizeof(cublasLtMatrixLayoutOpaque_t), "layout fits the opaque type");

struct desc_t {
    cublasComputeType_t compute;
    cudaDataType scale;
    int32_t pointer_mode;
    int32_t transa, transb, transc;
    uint32_t epilogue;
    const void *bias;
    int64_t bias_batch_stride;
    int32_t bias_type; /* -1: default */
    void *aux;
    int64_t aux_ld, aux_batch_stride;
    int32_t aux_type; /* -1: default */
};
static_assert(sizeof(desc_t) <= sizeof(cublasLtMatmulDescOpaque_t), "desc fits the opaque type");

void say(const char *fn, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void say(const char *fn, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cuemu: %s: ", fn);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

size_t type_size(cudaDataType t) { return t == CUDA_R_16BF ? 2 : 4; }

float load(const void *p, cudaDataType t, size_t i) {
    if (t == CUDA_R_16BF) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    return ((const float *)p)[i];
}

void store(void *p, cudaDataType t, size_t i, float v) {
    if (t == CUDA_R_16BF)
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else
        ((float *)p)[i] = v;
}

/* The device buffer must hold `elems` elements of `esize` bytes from p. */
bool check_range(const char *fn, const char *what, const void *p, size_t elems, size_t esize) {
    if (elems == 0) return true;
    if (!p) {
        say(fn, "%s is NULL", what);
        return false;
    }
    bool inside;
    char why[256] = "";
    mem_kind k = mem_classify(p, elems * esize, &inside, why, sizeof why);
    if (k != MEM_DEVICE) {
        say(fn, "%s (%p) is not device memory", what, p);
        return false;
    }
    if (!inside) {
        say(fn, "%s: the operation would touch %s", what, why);
        return false;
    }
    return true;
}

/* Elements spanned by `batch` column-major matrices rows x cols with ld and stride. */
size_t span(uint64_t rows, uint64_t cols, int64_t ld, int batch, int64_t stride) {
    if (rows == 0 || cols == 0 || batch == 0) return 0;
    return (size_t)((int64_t)(batch - 1) * stride + (int64_t)(cols - 1) * ld + (int64_t)rows);
}

const float GELU_S = 0.7978845608028654f; /* sqrt(2 / pi) */

float gelu(float x) {
    float t = tanhf(GELU_S * (x + 0.044715f * x * x * x));
    return 0.5f * x * (1.0f + t);
}

float dgelu(float x) {
    float t = tanhf(GELU_S * (x + 0.044715f * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_S * (1.0f + 3.0f * 0.044715f * x * x);
}

/* Widens a stored rows x cols column-major matrix (leading dimension ld) to dense floats. */
void widen(const void *p, cudaDataType t, uint64_t rows, uint64_t cols, int64_t ld, std::vector<float> &out) {
    out.resize((size_t)(rows * cols));
    for (uint64_t j = 0; j < cols; j++)
        for (uint64_t i = 0; i < rows; i++) out[(size_t)(j * rows + i)] = load(p, t, (size_t)(j * (uint64_t)ld + i));
}

/* One GEMM into dense fp32: T (m x n, ld m) = op(A) op(B), from the widened stored
 * matrices a (arows x ?, dense) and b. Each element accumulates over k in order, in
 * fp32; the inner loop runs down a column (vectorisable without reassociation). */
void product(bool ta, bool tb, uint64_t m, uint64_t n, uint64_t k, const std::vector<float> &a, uint64_t arows,
             const std::vector<float> &b, uint64_t brows, std::vector<float> &t) {
    t.assign((size_t)(m * n), 0.0f);
    if (m == 0 || n == 0 || k == 0) return;
    std::vector<float> opa;
    const float *A = a.data(); /* op(A), m x k column-major */
    if (ta) {
        opa.resize((size_t)(m * k));
        for (uint64_t i = 0; i < m; i++)
            for (uint64_t kk = 0; kk < k; kk++) opa[(size_t)(kk * m + i)] = a[(size_t)(i * arows + kk)];
        A = opa.data();
    }
    for (uint64_t j = 0; j < n; j++) {
        float *tc = &t[(size_t)(j * m)];
        for (uint64_t kk = 0; kk < k; kk++) {
            float bv = tb ? b[(size_t)(kk * brows + j)] : b[(size_t)(j * brows + kk)];
            const float *ac = A + (size_t)(kk * m);
            for (uint64_t i = 0; i < m; i++) tc[i] += ac[i] * bv;
        }
    }
}

bool supported_compute(cublasComputeType_t c) {
    return c == CUBLAS_COMPUTE_32F || c == CUBLAS_COMPUTE_32F_FAST_TF32 || c == CUBLAS_COMPUTE_32F_PEDANTIC ||
           c == CUBLAS_COMPUTE_32F_FAST_16BF;
}

bool supported_types(cudaDataType ab, cudaDataType cd) {
    if (ab == CUDA_R_32F) return cd == CUDA_R_32F;
    if (ab == CUDA_R_16BF) return cd == CUDA_R_16BF || cd == CUDA_R_32F;
    return false;
}

const char *status_name(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *status_string(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "an error was detected when checking the current licensing";
    }
    return "unknown error";
}

/* ---- the shared engine: batched GEMM with an epilogue ------------------------------------------ */
struct gemm_t {
    const char *fn;
    bool ta, tb;
    uint64_t m, n, k;
    float alpha, beta;
    cudaDataType ab_type, c_type, d_type;
    const void *A, *B, *C;
    void *D;
    int64_t lda, ldb, ldc, ldd;
    int64_t sa, sb, sc, sd;
    int batch;
    uint32_t epilogue;
    void *bias;
    cudaDataType bias_type;
    int64_t bias_stride;
    void *aux;
    cudaDataType aux_type;
    int64_t aux_ld, aux_stride;
};

bool epi_has(uint32_t e, uint32_t bit) { return (e & bit) != 0; }

void run_gemm(const gemm_t &g) {
    uint64_t arows = g.ta ? g.k : g.m, acols = g.ta ? g.m : g.k;
    uint64_t brows = g.tb ? g.n : g.k, bcols = g.tb ? g.k : g.n;
    std::vector<float> a, b, t;
    const uint32_t e = g.epilogue;
    const bool is_bias = e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS ||
                         e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    const bool is_relu = e == CUBLASLT_EPILOGUE_RELU || e == CUBLASLT_EPILOGUE_RELU_BIAS;
    const bool is_gelu = e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
                         e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    const bool aux_out = e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    const bool is_dgelu = e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_DGELU_BGRAD;
    for (int bi = 0; bi < g.batch; bi++) {
        const char *Ab = (const char *)g.A + (size_t)(bi * g.sa) * type_size(g.ab_type);
        const char *Bb = (const char *)g.B + (size_t)(bi * g.sb) * type_size(g.ab_type);
        char *Db = (char *)g.D + (size_t)(bi * g.sd) * type_size(g.d_type);
        const char *Cb = g.C ? (const char *)g.C + (size_t)(bi * g.sc) * type_size(g.c_type) : nullptr;
        char *bias = g.bias ? (char *)g.bias + (size_t)(bi * g.bias_stride) * type_size(g.bias_type) : nullptr;
        char *aux = g.aux ? (char *)g.aux + (size_t)(bi * g.aux_stride) * type_size(g.aux_type) : nullptr;
        if (g.alpha != 0.0f) {
            widen(Ab, g.ab_type, arows, acols, g.lda, a);
            widen(Bb, g.ab_type, brows, bcols, g.ldb, b);
            product(g.ta, g.tb, g.m, g.n, g.k, a, arows, b, brows, t);
        } else {
            t.assign((size_t)(g.m * g.n), 0.0f);
        }
        if (e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB) {
            /* Sums over k of op(A) rows / op(B) columns, from the stored inputs. */
            if (g.alpha == 0.0f) {
                widen(Ab, g.ab_type, arows, acols, g.lda, a);
                widen(Bb, g.ab_type, brows, bcols, g.ldb, b);
            }
            if (e == CUBLASLT_EPILOGUE_BGRADA) {
                for (uint64_t i = 0; i < g.m; i++) {
                    float s = 0;
                    for (uint64_t kk = 0; kk < g.k; kk++) s += g.ta ? a[(size_t)(i * arows + kk)] : a[(size_t)(kk * arows + i)];
                    store(bias, g.bias_type, (size_t)i, s);
                }
            } else {
                for (uint64_t j = 0; j < g.n; j++) {
                    float s = 0;
                    for (uint64_t kk = 0; kk < g.k; kk++) s += g.tb ? b[(size_t)(kk * brows + j)] : b[(size_t)(j * brows + kk)];
                    store(bias, g.bias_type, (size_t)j, s);
                }
            }
        }
        std::vector<float> bgrad(is_dgelu && e == CUBLASLT_EPILOGUE_DGELU_BGRAD ? g.m : 0, 0.0f);
        for (uint64_t j = 0; j < g.n; j++)
            for (uint64_t i = 0; i < g.m; i++) {
                float v = g.alpha * t[(size_t)(j * g.m + i)];
                if (g.beta != 0.0f) v += g.beta * load(Cb, g.c_type, (size_t)(j * (uint64_t)g.ldc + i));
                if (is_bias) v += load(bias, g.bias_type, (size_t)i);
                if (aux_out) store(aux, g.aux_type, (size_t)(j * (uint64_t)g.aux_ld + i), v);
                if (is_relu) v = v > 0.0f ? v : 0.0f;
                if (is_gelu) v = gelu(v);
                if (is_dgelu) v *= dgelu(load(aux, g.aux_type, (size_t)(j * (uint64_t)g.aux_ld + i)));
                if (!bgrad.empty()) bgrad[(size_t)i] += v;
                store(Db, g.d_type, (size_t)(j * (uint64_t)g.ldd + i), v);
            }
        for (size_t i = 0; i < bgrad.size(); i++) store(bias, g.bias_type, i, bgrad[i]);
    }
}

/* Validates the buffers a GEMM touches (sizes and types already checked). */
cublasStatus_t check_buffers(const gemm_t &g) {
    uint64_t arows = g.ta ? g.k : g.m, acols = g.ta ? g.m : g.k;
    uint64_t brows = g.tb ? g.n : g.k, bcols = g.tb ? g.k : g.n;
    bool reads_ab = g.alpha != 0.0f || g.epilogue == CUBLASLT_EPILOGUE_BGRADA || g.epilogue == CUBLASLT_EPILOGUE_BGRADB;
    if (g.m == 0 || g.n == 0) return CUBLAS_STATUS_SUCCESS;
    if (reads_ab && g.k > 0) {
        if (!check_range(g.fn, "A", g.A, span(arows, acols, g.lda, g.batch, g.sa), type_size(g.ab_type)) ||
            !check_range(g.fn, "B", g.B, span(brows, bcols, g.ldb, g.batch, g.sb), type_size(g.ab_type)))
            return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (g.beta != 0.0f && !check_range(g.fn, "C", g.C, span(g.m, g.n, g.ldc, g.batch, g.sc), type_size(g.c_type)))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!check_range(g.fn, "D", g.D, span(g.m, g.n, g.ldd, g.batch, g.sd), type_size(g.d_type)))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (g.bias) {
        uint64_t len = g.epilogue == CUBLASLT_EPILOGUE_BGRADB ? g.n : g.m;
        if (!check_range(g.fn, "bias", g.bias, span(len, 1, (int64_t)len, g.batch, g.bias_stride), type_size(g.bias_type)))
            return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (g.aux && !check_range(g.fn, "aux", g.aux, span(g.m, g.n, g.aux_ld, g.batch, g.aux_stride), type_size(g.aux_type)))
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

layout_t *L(cublasLtMatrixLayout_t l) { return reinterpret_cast<layout_t *>(l); }
desc_t *Dd(cublasLtMatmulDesc_t d) { return reinterpret_cast<desc_t *>(d); }

bool known_epilogue(uint32_t e) {
    switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT:
    case CUBLASLT_EPILOGUE_RELU:
    case CUBLASLT_EPILOGUE_BIAS:
    case CUBLASLT_EPILOGUE_RELU_BIAS:
    case CUBLASLT_EPILOGUE_GELU:
    case CUBLASLT_EPILOGUE_GELU_AUX:
    case CUBLASLT_EPILOGUE_GELU_BIAS:
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
    case CUBLASLT_EPILOGUE_DGELU:
    case CUBLASLT_EPILOGUE_DGELU_BGRAD:
    case CUBLASLT_EPILOGUE_BGRADA:
    case CUBLASLT_EPILOGUE_BGRADB: return true;
    default: return false;
    }
}

/* Builds and validates a cublasLtMatmul problem (pointers may be null: heuristics). */
cublasStatus_t lt_problem(const char *fn, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Ad,
                          cublasLtMatrixLayout_t Bd, cublasLtMatrixLayout_t Cd, cublasLtMatrixLayout_t Dd_,
                          gemm_t &g) {
    if (!desc || !Ad || !Bd || !Cd || !Dd_) {
        say(fn, "a descriptor or layout is NULL");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    const desc_t &d = *Dd(desc);
    const layout_t &a = *L(Ad), &b = *L(Bd), &c = *L(Cd), &dl = *L(Dd_);
    if (!supported_compute(d.compute) || d.scale != CUDA_R_32F) {
        say(fn, "compute type %d with scale type %d is not emulated (CUBLAS_COMPUTE_32F*, CUDA_R_32F)", (int)d.compute,
            (int)d.scale);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (d.pointer_mode != 0) {
        say(fn, "only host alpha/beta (CUBLASLT_POINTER_MODE_HOST) are emulated");
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (d.transc != CUBLAS_OP_N) {
        say(fn, "TRANSC must be CUBLAS_OP_N");
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if ((d.transa != CUBLAS_OP_N && d.transa != CUBLAS_OP_T) || (d.transb != CUBLAS_OP_N && d.transb != CUBLAS_OP_T)) {
        say(fn, "TRANSA/TRANSB must be CUBLAS_OP_N or CUBLAS_OP_T");
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    const layout_t *ls[4] = {&a, &b, &c, &dl};
    const char *names[4] = {"A", "B", "C", "D"};
    for (int i = 0; i < 4; i++) {
        if (ls[i]->order != CUBLASLT_ORDER_COL) {
            say(fn, "%s: only CUBLASLT_ORDER_COL is emulated", names[i]);
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
        if (ls[i]->ld < (int64_t)(ls[i]->rows > 0 ? ls[i]->rows : 1)) {
            say(fn, "%s: ld %lld is less than its %llu rows", names[i], (long long)ls[i]->ld,
                (unsigned long long)ls[i]->rows);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        if (ls[i]->batch != a.batch) {
            say(fn, "batch counts differ: A %d, %s %d", a.batch, names[i], ls[i]->batch);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    }
    g = gemm_t();
    g.fn = fn;
    g.ta = d.transa == CUBLAS_OP_T;
    g.tb = d.transb == CUBLAS_OP_T;
    g.m = g.ta ? a.cols : a.rows;
    g.k = g.ta ? a.rows : a.cols;
    g.n = g.tb ? b.rows : b.cols;
    uint64_t kb = g.tb ? b.cols : b.rows;
    if (kb != g.k || c.rows != g.m || c.cols != g.n || dl.rows != g.m || dl.cols != g.n) {
        say(fn, "shapes do not agree: op(A) %llux%llu, op(B) %llux%llu, C %llux%llu, D %llux%llu",
            (unsigned long long)g.m, (unsigned long long)g.k, (unsigned long long)kb, (unsigned long long)g.n,
            (unsigned long long)c.rows, (unsigned long long)c.cols, (unsigned long long)dl.rows,
            (unsigned long long)dl.cols);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (a.type != b.type || c.type != dl.type || !supported_types(a.type, dl.type)) {
        say(fn, "types A %d, B %d, C %d, D %d are not a supported combination (A = B in {32F, 16BF}, C = D, "
                "16BF inputs with 16BF or 32F outputs)",
            (int)a.type, (int)b.type, (int)c.type, (int)dl.type);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!known_epilogue(d.epilogue)) {
        say(fn, "epilogue %u is not emulated", d.epilogue);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    g.ab_type = a.type;
    g.c_type = c.type;
    g.d_type = dl.type;
    g.lda = a.ld;
    g.ldb = b.ld;
    g.ldc = c.ld;
    g.ldd = dl.ld;
    g.sa = a.stride;
    g.sb = b.stride;
    g.sc = c.stride;
    g.sd = dl.stride;
    g.batch = a.batch;
    g.epilogue = d.epilogue;
    uint32_t e = d.epilogue;
    bool uses_bias = e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
                     e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU_BGRAD ||
                     e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB;
    bool uses_aux = e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
                    e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_DGELU_BGRAD;
    if (uses_bias) {
        g.bias = const_cast<void *>(d.bias);
        g.bias_type = d.bias_type < 0 ? dl.type : (cudaDataType)d.bias_type;
        bool ok = g.bias_type == dl.type || (dl.type == CUDA_R_16BF && g.bias_type == CUDA_R_32F);
        if (!ok) {
            say(fn, "bias type %d with D type %d is not supported", (int)g.bias_type, (int)dl.type);
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
        g.bias_stride = d.bias_batch_stride;
    }
    if (uses_aux) {
        g.aux = d.aux;
        g.aux_type = d.aux_type < 0 ? dl.type : (cudaDataType)d.aux_type;
        if (g.aux_type != dl.type) {
            say(fn, "aux type %d differs from the D type %d", (int)g.aux_type, (int)dl.type);
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
        if (d.aux_ld < (int64_t)g.m || d.aux_ld % 8 != 0) {
            say(fn, "EPILOGUE_AUX_LD %lld must be a multiple of 8 and at least the %llu rows of D",
                (long long)d.aux_ld, (unsigned long long)g.m);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        if (d.aux_batch_stride % 8 != 0) {
            say(fn, "EPILOGUE_AUX_BATCH_STRIDE %lld must be a multiple of 8", (long long)d.aux_batch_stride);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        g.aux_ld = d.aux_ld;
        g.aux_stride = d.aux_batch_stride;
    }
    return CUBLAS_STATUS_SUCCESS;
}

} /* namespace */

/* ---- cuBLASLt ------------------------------------------------------------------------------------- */
cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle) {
    if (!lightHandle) return CUBLAS_STATUS_INVALID_VALUE;
    if (!device_present()) return CUBLAS_STATUS_NOT_INITIALIZED;
    *lightHandle = new cublasLtContext{LT_MAGIC};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
    if (!lightHandle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (lightHandle->magic != LT_MAGIC) die("cublasLtDestroy: not a live handle");
    lightHandle->magic = 0;
    delete lightHandle;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasLtGetStatusName(cublasStatus_t status) { return status_name(status); }
const char *cublasLtGetStatusString(cublasStatus_t status) { return status_string(status); }

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
    if (!matLayout) return CUBLAS_STATUS_INVALID_VALUE;
    layout_t *l = new layout_t{type, rows, cols, ld, CUBLASLT_ORDER_COL, 1, 0};
    *matLayout = reinterpret_cast<cublasLtMatrixLayout_t>(l);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
    delete L(matLayout);
    return CUBLAS_STATUS_SUCCESS;
}

template <typename T> static bool get_attr(const void *buf, size_t size, T *out) {
    if (!buf || size != sizeof(T)) return false;
    memcpy(out, buf, sizeof(T));
    return true;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t sizeInBytes) {
    const char *fn = "cublasLtMatrixLayoutSetAttribute";
    if (!matLayout) return CUBLAS_STATUS_INVALID_VALUE;
    layout_t *l = L(matLayout);
    bool ok = false;
    switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: {
        uint32_t v;
        ok = get_attr(buf, sizeInBytes, &v);
        if (ok) l->type = (cudaDataType)v;
        break;
    }
    case CUBLASLT_MATRIX_LAYOUT_ORDER: ok = get_attr(buf, sizeInBytes, &l->order); break;
    case CUBLASLT_MATRIX_LAYOUT_ROWS: ok = get_attr(buf, sizeInBytes, &l->rows); break;
    case CUBLASLT_MATRIX_LAYOUT_COLS: ok = get_attr(buf, sizeInBytes, &l->cols); break;
    case CUBLASLT_MATRIX_LAYOUT_LD: ok = get_attr(buf, sizeInBytes, &l->ld); break;
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT:
        ok = get_attr(buf, sizeInBytes, &l->batch) && l->batch >= 1;
        break;
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: ok = get_attr(buf, sizeInBytes, &l->stride); break;
    default: say(fn, "attribute %d is not emulated", (int)attr); return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (!ok) {
        say(fn, "attribute %d: wrong size %zu or value", (int)attr, sizeInBytes);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc, cublasComputeType_t computeType,
                                        cudaDataType_t scaleType) {
    if (!matmulDesc) return CUBLAS_STATUS_INVALID_VALUE;
    desc_t *d = new desc_t();
    d->compute = computeType;
    d->scale = scaleType;
    d->transa = d->transb = d->transc = CUBLAS_OP_N;
    d->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    d->bias_type = -1;
    d->aux_type = -1;
    *matmulDesc = reinterpret_cast<cublasLtMatmulDesc_t>(d);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
    delete Dd(matmulDesc);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t sizeInBytes) {
    const char *fn = "cublasLtMatmulDescSetAttribute";
    if (!matmulDesc) return CUBLAS_STATUS_INVALID_VALUE;
    desc_t *d = Dd(matmulDesc);
    bool ok = false;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: {
        int32_t v;
        ok = get_attr(buf, sizeInBytes, &v);
        if (ok) d->compute = (cublasComputeType_t)v;
        break;
    }
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: {
        int32_t v;
        ok = get_attr(buf, sizeInBytes, &v);
        if (ok) d->scale = (cudaDataType)v;
        break;
    }
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: ok = get_attr(buf, sizeInBytes, &d->pointer_mode); break;
    case CUBLASLT_MATMUL_DESC_TRANSA: ok = get_attr(buf, sizeInBytes, &d->transa); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: ok = get_attr(buf, sizeInBytes, &d->transb); break;
    case CUBLASLT_MATMUL_DESC_TRANSC: ok = get_attr(buf, sizeInBytes, &d->transc); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: ok = get_attr(buf, sizeInBytes, &d->epilogue); break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: ok = get_attr(buf, sizeInBytes, &d->bias); break;
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: ok = get_attr(buf, sizeInBytes, &d->bias_batch_stride); break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: ok = get_attr(buf, sizeInBytes, &d->bias_type); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: ok = get_attr(buf, sizeInBytes, &d->aux); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: ok = get_attr(buf, sizeInBytes, &d->aux_ld); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE: ok = get_attr(buf, sizeInBytes, &d->aux_batch_stride); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: ok = get_attr(buf, sizeInBytes, &d->aux_type); break;
    default: say(fn, "attribute %d is not emulated", (int)attr); return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (!ok) {
        say(fn, "attribute %d: expected %s bytes, got %zu", (int)attr, "its type's", sizeInBytes);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

struct pref_t {
    uint64_t max_workspace;
    uint32_t reduction_mask;
    uint32_t align[4]; /* A B C D, bytes; 1 (not checked) unless set */
    uint64_t impl_mask;
    float max_waves;
};

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
    if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
    *pref = reinterpret_cast<cublasLtMatmulPreference_t>(
        new pref_t{0, CUBLASLT_REDUCTION_SCHEME_MASK, {1, 1, 1, 1}, ~(uint64_t)0, 0.0f});
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    delete reinterpret_cast<pref_t *>(pref);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t sizeInBytes) {
    if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
    pref_t *p = reinterpret_cast<pref_t *>(pref);
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
        return get_attr(buf, sizeInBytes, &p->max_workspace) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE: {
        uint32_t v;
        return get_attr(buf, sizeInBytes, &v) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    }
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
        return get_attr(buf, sizeInBytes, &p->reduction_mask) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
        return get_attr(buf, sizeInBytes, &p->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES])
                   ? CUBLAS_STATUS_SUCCESS
                   : CUBLAS_STATUS_INVALID_VALUE;
    case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT:
        return get_attr(buf, sizeInBytes, &p->max_waves) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    case CUBLASLT_MATMUL_PREF_IMPL_MASK:
        return get_attr(buf, sizeInBytes, &p->impl_mask) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    }
    say("cublasLtMatmulPreferenceSetAttribute", "attribute %d is not emulated", (int)attr);
    return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int *returnAlgoCount) {
    const char *fn = "cublasLtMatmulAlgoGetHeuristic";
    if (!lightHandle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (requestedAlgoCount < 1 || !heuristicResultsArray || !returnAlgoCount || !preference)
        return CUBLAS_STATUS_INVALID_VALUE;
    *returnAlgoCount = 0;
    gemm_t g;
    cublasStatus_t s = lt_problem(fn, operationDesc, Adesc, Bdesc, Cdesc, Ddesc, g);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    const pref_t *pr = reinterpret_cast<const pref_t *>(preference);
    const desc_t &d = *Dd(operationDesc);
    cublasLtMatmulHeuristicResult_t &r = heuristicResultsArray[0];
    memset(&r, 0, sizeof r);
    /* The algorithm remembers the alignments it may assume: the preference's, when set
     * (the library's default of 256 is not enforced here: which algorithms need it is the
     * library's secret), and the bias/aux pointers' own as the library reads them here,
     * up to 16 bytes (vector loads); cublasLtMatmul checks. */
    r.algo.data[0] = ALGO_MAGIC;
    for (int i = 0; i < 4; i++) r.algo.data[1 + i] = pr->align[i];
    r.algo.data[5] = d.bias ? (ptr_align(d.bias) < 16 ? ptr_align(d.bias) : 16) : 1;
    r.algo.data[6] = d.aux ? (ptr_align(d.aux) < 16 ? ptr_align(d.aux) : 16) : 1;
    r.workspaceSize = 0;
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = 1.0f;
    *returnAlgoCount = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t Adesc, const void *B,
                              cublasLtMatrixLayout_t Bdesc, const void *beta, const void *C,
                              cublasLtMatrixLayout_t Cdesc, void *D, cublasLtMatrixLayout_t Ddesc,
                              const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspaceSizeInBytes,
                              cudaStream_t stream) {
    const char *fn = "cublasLtMatmul";
    device_access access;
    count(COUNT_BLAS_CALL);
    if (!lightHandle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (lightHandle->magic != LT_MAGIC) die("cublasLtMatmul: the handle is not a live cublasLtHandle_t");
    if (!stream_valid(stream)) {
        say(fn, "stream %p is not a live stream", (void *)stream);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (!alpha || !beta) {
        say(fn, "alpha and beta must be host pointers");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (workspaceSizeInBytes > 0 && !workspace) {
        say(fn, "a workspace size of %zu with a NULL workspace", workspaceSizeInBytes);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (algo && algo->data[0] != ALGO_MAGIC) {
        say(fn, "the algorithm was not returned by cublasLtMatmulAlgoGetHeuristic");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    gemm_t g;
    cublasStatus_t s = lt_problem(fn, computeDesc, Adesc, Bdesc, Cdesc, Ddesc, g);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    memcpy(&g.alpha, alpha, sizeof(float));
    memcpy(&g.beta, beta, sizeof(float));
    g.A = A;
    g.B = B;
    g.C = C;
    g.D = D;
    if (C && C == D) {
        const layout_t &c = *L(Cdesc), &d = *L(Ddesc);
        if (c.ld != d.ld || c.type != d.type || c.stride != d.stride) {
            say(fn, "C and D are the same buffer with different layouts (in place needs equal layouts)");
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    }
    uint32_t e = g.epilogue;
    bool needs_bias = e != CUBLASLT_EPILOGUE_DEFAULT && e != CUBLASLT_EPILOGUE_RELU && e != CUBLASLT_EPILOGUE_GELU &&
                      e != CUBLASLT_EPILOGUE_GELU_AUX && e != CUBLASLT_EPILOGUE_DGELU;
    if (needs_bias && !g.bias) {
        say(fn, "epilogue %u needs CUBLASLT_MATMUL_DESC_BIAS_POINTER", e);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    bool needs_aux = e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
                     e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_DGELU_BGRAD;
    if (needs_aux && !g.aux) {
        say(fn, "epilogue %u needs CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER", e);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (algo) {
        const void *ptrs[6] = {A, B, C, D, g.bias, g.aux};
        const char *names[6] = {"A", "B", "C", "D", "the bias", "the aux buffer"};
        for (int i = 0; i < 6; i++) {
            uint64_t want = algo->data[1 + i];
            if (ptrs[i] && ptr_align(ptrs[i]) < want) {
                say(fn, "%s (%p) is aligned to %llu bytes, but the algorithm was chosen for %llu-byte alignment "
                        "(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES; bias/aux: the pointer given to the "
                        "heuristic)",
                    names[i], ptrs[i], (unsigned long long)ptr_align(ptrs[i]), (unsigned long long)want);
                return CUBLAS_STATUS_NOT_SUPPORTED;
            }
        }
    }
    s = check_buffers(g);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    run_gemm(g);
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- cuBLAS v2 ------------------------------------------------------------------------------------ */
cublasStatus_t cublasCreate(cublasHandle_t *handle) {
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    if (!device_present()) return CUBLAS_STATUS_NOT_INITIALIZED;
    *handle = new cublasContext{nullptr, CUBLAS_DEFAULT_MATH};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t streamId) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!stream_valid(streamId)) {
        say("cublasSetStream", "stream %p is not a live stream", (void *)streamId);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    handle->stream = streamId;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void *workspace, size_t workspaceSizeInBytes) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (workspaceSizeInBytes > 0 && !workspace) return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusName(cublasStatus_t status) { return status_name(status); }
const char *cublasGetStatusString(cublasStatus_t status) { return status_string(status); }

/* cublasGemmBatchedEx: the arrays of per-matrix pointers live in device memory, as
 * cuBLAS requires; every matrix is checked before any runs, then each runs as a
 * batch of one. Two members writing the same C would race on a GPU: refused. */
static cublasStatus_t gemm_pointer_arrays(gemm_t g, int batch, const void *const *Aarr, const void *const *Barr,
                                          void *const *Carr) {
    const void *arrs[3] = {Aarr, Barr, Carr};
    for (int a = 0; a < 3; a++) {
        bool inside = false;
        char why[200] = "";
        if (!arrs[a] || mem_classify(arrs[a], (size_t)batch * sizeof(void *), &inside, why, sizeof why) != MEM_DEVICE ||
            !inside) {
            say(g.fn, "the %c pointer array must lie in device memory (%s)", "ABC"[a], why[0] ? why : "host or NULL");
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    }
    std::vector<const void *> outs(Carr, Carr + batch);
    std::sort(outs.begin(), outs.end());
    if (std::adjacent_find(outs.begin(), outs.end()) != outs.end()) {
        say(g.fn, "two members of the batch write the same C matrix (a race on a GPU)");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    g.batch = 1;
    g.sa = g.sb = g.sc = g.sd = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < batch; i++) {
            g.A = Aarr[i];
            g.B = Barr[i];
            g.C = g.D = Carr[i];
            if (pass == 0) {
                cublasStatus_t s = check_buffers(g);
                if (s != CUBLAS_STATUS_SUCCESS) return s;
            } else {
                run_gemm(g);
            }
        }
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t gemm_v2(const char *fn, cublasHandle_t handle, cublasOperation_t transa,
                              cublasOperation_t transb, int m, int n, int k, const void *alpha, const void *A,
                              cudaDataType Atype, int lda, long long sa, const void *B, cudaDataType Btype, int ldb,
                              long long sb, const void *beta, void *C, cudaDataType Ctype, int ldc, long long sc,
                              int batch, cublasComputeType_t computeType, cublasGemmAlgo_t algo,
                              const void *const *Aarr = nullptr, const void *const *Barr = nullptr,
                              void *const *Carr = nullptr) {
    device_access access;
    count(COUNT_BLAS_CALL);
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!stream_valid(handle->stream)) {
        say(fn, "the handle's stream was destroyed");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if ((transa != CUBLAS_OP_N && transa != CUBLAS_OP_T && transa != CUBLAS_OP_C) ||
        (transb != CUBLAS_OP_N && transb != CUBLAS_OP_T && transb != CUBLAS_OP_C)) {
        say(fn, "bad transa/transb");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N; /* real types: C is T */
    int arows = ta ? k : m, brows = tb ? n : k;
    if (m < 0 || n < 0 || k < 0 || batch < 0) {
        say(fn, "negative size m %d n %d k %d batch %d", m, n, k, batch);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (lda < (arows > 1 ? arows : 1) || ldb < (brows > 1 ? brows : 1) || ldc < (m > 1 ? m : 1)) {
        say(fn, "leading dimension too small: lda %d (A has %d rows), ldb %d (B has %d rows), ldc %d (C has %d rows)",
            lda, arows, ldb, brows, ldc, m);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (!supported_compute(computeType)) {
        say(fn, "compute type %d is not emulated", (int)computeType);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (Atype != Btype || !supported_types(Atype, Ctype)) {
        say(fn, "types A %d, B %d, C %d are not a supported combination", (int)Atype, (int)Btype, (int)Ctype);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (algo != CUBLAS_GEMM_DEFAULT && algo != CUBLAS_GEMM_DEFAULT_TENSOR_OP) {
        say(fn, "algo %d is not emulated (CUBLAS_GEMM_DEFAULT)", (int)algo);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!alpha || !beta) {
        say(fn, "alpha and beta must be host pointers");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
    gemm_t g = gemm_t();
    g.fn = fn;
    g.ta = ta;
    g.tb = tb;
    g.m = (uint64_t)m;
    g.n = (uint64_t)n;
    g.k = (uint64_t)k;
    memcpy(&g.alpha, alpha, sizeof(float));
    memcpy(&g.beta, beta, sizeof(float));
    if (k == 0) g.alpha = 0.0f;
    g.ab_type = Atype;
    g.c_type = g.d_type = Ctype;
    g.A = A;
    g.B = B;
    g.C = C;
    g.D = C;
    g.lda = lda;
    g.ldb = ldb;
    g.ldc = g.ldd = ldc;
    g.sa = sa;
    g.sb = sb;
    g.sc = g.sd = sc;
    g.batch = batch;
    g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    if (Aarr) return gemm_pointer_arrays(g, batch, Aarr, Barr, Carr);
    cublasStatus_t s = check_buffers(g);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    run_gemm(g);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    return gemm_v2("cublasGemmEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0, beta, C,
                   Ctype, ldc, 0, 1, computeType, algo);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void *alpha, const void *A, cudaDataType Atype,
                                          int lda, long long int strideA, const void *B, cudaDataType Btype, int ldb,
                                          long long int strideB, const void *beta, void *C, cudaDataType Ctype,
                                          int ldc, long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    return gemm_v2("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B,
                   Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, algo);
}

cublasStatus_t cublasGemmBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                                   int n, int k, const void *alpha, const void *const Aarray[], cudaDataType Atype,
                                   int lda, const void *const Barray[], cudaDataType Btype, int ldb, const void *beta,
                                   void *const Carray[], cudaDataType Ctype, int ldc, int batchCount,
                                   cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    static const char dummy = 0; /* non-NULL A/B/C for the shared checks; the arrays are checked after */
    return gemm_v2("cublasGemmBatchedEx", handle, transa, transb, m, n, k, alpha, &dummy, Atype, lda, 0, &dummy, Btype,
                   ldb, 0, beta, (void *)&dummy, Ctype, ldc, 0, batchCount, computeType, algo,
                   Aarray ? Aarray : (const void *const *)&dummy, Barray, Carray);
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                           const float *beta, float *C, int ldc) {
    return gemm_v2("cublasSgemm", handle, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, 0, B, CUDA_R_32F, ldb, 0,
                   beta, C, CUDA_R_32F, ldc, 0, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}
