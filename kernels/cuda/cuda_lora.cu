/*
 * cuda_lora.cu - the CUDA ops LoRA needs (kernels.h): the strided gemm (cublasGemmEx
 * with the row-major/column-major swap of cuda_matmul.cu: C^T = op(B)^T op(A)^T), and
 * the int8 matmuls, which dequantize a tile of weight rows into the device's layer
 * scratch (at most 8 MiB: the fp32 or bf16 weight never exists whole) and multiply it
 * with cublasGemmEx, tile after tile on the one stream.
 */
#include "kernels/cuda/cuda_layers.cuh"

#define Q8_TILE_BYTES ((size_t)8 << 20)

template <typename T> static cudaDataType_t dtype_of() { return sizeof(T) == 2 ? CUDA_R_16BF : CUDA_R_32F; }

template <typename T>
static void gemm(dt_device_t *dev, int trans_a, int trans_b, int M, int N, int K, float alpha, const void *A, int lda,
                 const void *B, int ldb, float beta, void *C, int ldc) {
    dt_cuda_impl *c = dt_cuda(dev);
    cudaDataType_t t = dtype_of<T>();
    cublasStatus_t s = cublasGemmEx(c->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    N, M, K, &alpha, B, t, ldb, A, t, lda, &beta, C, t, ldc, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT);
    dt_cuda_note_blas(dev, "gemm", s);
}

/* w (rows x C) = q[o0 + r, :] * scale[o0 + r] */
template <typename T>
__global__ void dequant_kernel(T *w, const int8_t *q, const float *scale, size_t o0, size_t rows, int C) {
    size_t n = rows * (size_t)C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / (size_t)C;
        w[i] = dt_st<T>((float)q[o0 * C + i] * scale[o0 + r]);
    }
}

/* out[r, o] = bias[o] for every row */
template <typename T> __global__ void bias_rows_kernel(T *out, const T *bias, int N, int OC) {
    size_t n = (size_t)N * OC;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = bias[i % (size_t)OC];
}

/* Rows of a tile: as many as fit the scratch, at least 1. */
static size_t tile_rows(int C, size_t es) {
    size_t r = Q8_TILE_BYTES / ((size_t)C * es);
    return r ? r : 1;
}

template <typename T>
static T *dequant_tile(dt_device_t *dev, const int8_t *wq, const float *scale, size_t t0, size_t t1, int C,
                       const char *op) {
    T *w = (T *)dt_cuda_layer_scratch(dev, tile_rows(C, sizeof(T)) * (size_t)C * sizeof(T), op);
    if (!w) return NULL;
    size_t n = (t1 - t0) * (size_t)C;
    DT_LAUNCH(dequant_kernel<T>, dt_cuda_grid(dev, n, 256), 256, 0, dt_cuda_stream(dev))(w, wq, scale, t0, t1 - t0, C);
    dt_cuda_note_launch(dev, op);
    return w;
}

template <typename T>
static void matmul_forward_q8(dt_device_t *dev, void *out, const void *inp, const int8_t *wq, const float *scale,
                              const void *bias, int N, int C, int OC) {
    float beta = 0.0f;
    if (bias) {
        DT_LAUNCH(bias_rows_kernel<T>, dt_cuda_grid(dev, (size_t)N * OC, 256), 256, 0, dt_cuda_stream(dev))(
            (T *)out, (const T *)bias, N, OC);
        dt_cuda_note_launch(dev, "matmul_forward_q8");
        beta = 1.0f;
    }
    size_t step = tile_rows(C, sizeof(T));
    for (size_t t0 = 0; t0 < (size_t)OC; t0 += step) {
        size_t t1 = t0 + step < (size_t)OC ? t0 + step : (size_t)OC;
        T *w = dequant_tile<T>(dev, wq, scale, t0, t1, C, "matmul_forward_q8");
        if (!w) return;
        /* out[:, t0:t1] (N, rows) = inp (N, C) @ w^T */
        gemm<T>(dev, 0, 1, N, (int)(t1 - t0), C, 1.0f, inp, C, w, C, beta, (T *)out + t0, OC);
    }
}

template <typename T>
static void matmul_backward_q8(dt_device_t *dev, void *dinp, const void *dout, const int8_t *wq, const float *scale,
                               int N, int C, int OC) {
    size_t step = tile_rows(C, sizeof(T));
    for (size_t t0 = 0; t0 < (size_t)OC; t0 += step) {
        size_t t1 = t0 + step < (size_t)OC ? t0 + step : (size_t)OC;
        T *w = dequant_tile<T>(dev, wq, scale, t0, t1, C, "matmul_backward_q8");
        if (!w) return;
        /* dinp (N, C) += dout[:, t0:t1] (N, rows) @ w (rows, C) */
        gemm<T>(dev, 0, 0, N, C, (int)(t1 - t0), 1.0f, (const T *)dout + t0, OC, w, C, 1.0f, dinp, C);
    }
}

void dt_cuda_fill_lora_ops(dt_ops_t *ops, dt_dtype_t dtype) {
    if (dtype == DT_DTYPE_BF16) {
        ops->gemm = gemm<dt_bf16>;
        ops->matmul_forward_q8 = matmul_forward_q8<dt_bf16>;
        ops->matmul_backward_q8 = matmul_backward_q8<dt_bf16>;
    } else {
        ops->gemm = gemm<float>;
        ops->matmul_forward_q8 = matmul_forward_q8<float>;
        ops->matmul_backward_q8 = matmul_backward_q8<float>;
    }
}
