/*
 * cuda_elementwise.cu - GELU (tanh form) and ReLU forward/backward, residual
 * forward/backward and in-place scaling, for float and bf16 storage with fp32
 * arithmetic (the same formulas as kernels/cpu/cpu_layers.c).
 *
 * One kernel template does all of them: out[i] = op(x[i], y[i]), plus out[i] when
 * the op accumulates (every backward, kernels.h). When every pointer sits on 16
 * bytes the body moves 16-byte packs (4 floats, 8 bf16) and the last n % pack
 * elements go one at a time; otherwise everything goes one at a time.
 */
#include "kernels/cuda/cuda_common.cuh"

#include "kernels/cuda/cuda_vec.cuh"

#define EW_BLOCK 256

#define GELU_K0 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_K1 0.044715f

/* 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3). */
struct gelu_fwd_op {
    __device__ float operator()(float x, float) const {
        float u = GELU_K0 * (x + GELU_K1 * x * x * x);
        return x / (1.0f + expf(-2.0f * u));
    }
};

/* d/dx [x s(2u)] = s + 2 x s (1 - s) du/dx, times dout. */
struct gelu_bwd_op {
    __device__ float operator()(float x, float dout) const {
        float u = GELU_K0 * (x + GELU_K1 * x * x * x);
        float du = GELU_K0 * (1.0f + 3.0f * GELU_K1 * x * x);
        float s = 1.0f / (1.0f + expf(-2.0f * u));
        return (s + 2.0f * x * s * (1.0f - s) * du) * dout;
    }
};

struct relu_fwd_op {
    __device__ float operator()(float x, float) const { return x > 0.0f ? x : 0.0f; }
};

struct relu_bwd_op {
    __device__ float operator()(float x, float dout) const { return x > 0.0f ? dout : 0.0f; }
};

struct add_op {
    __device__ float operator()(float a, float b) const { return a + b; }
};

struct copy_op {
    __device__ float operator()(float a, float) const { return a; }
};

struct scale_op {
    float s;
    __device__ float operator()(float a, float) const { return a * s; }
};

/* out (n) = op(x, y) [+ out when ACC]; y is read only when HAS_Y; vec: all pointers
 * are 16-byte aligned. */
template <typename T, typename Op, bool HAS_Y, bool ACC>
__global__ void ew_kernel(T *out, const T *x, const T *y, size_t n, int vec, Op op) {
    constexpr int V = dt_pack<T>::N;
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t npack = vec ? n / V : 0;
    for (size_t p = tid; p < npack; p += stride) {
        dt_pack<T> a = dt_pack_load(x + p * V), b = a, o = a; /* b, o: overwritten when used */
        if (HAS_Y) b = dt_pack_load(y + p * V);
        if (ACC) o = dt_pack_load(out + p * V);
#pragma unroll
        for (int k = 0; k < V; k++) {
            float r = op(dt_ld(a.e[k]), HAS_Y ? dt_ld(b.e[k]) : 0.0f);
            if (ACC) r += dt_ld(o.e[k]);
            o.e[k] = dt_st<T>(r);
        }
        dt_pack_store(out + p * V, o);
    }
    for (size_t i = npack * V + tid; i < n; i += stride) {
        float r = op(dt_ld(x[i]), HAS_Y ? dt_ld(y[i]) : 0.0f);
        if (ACC) r += dt_ld(out[i]);
        out[i] = dt_st<T>(r);
    }
}

template <typename T, typename Op, bool HAS_Y, bool ACC>
static void ew_launch(dt_device_t *dev, void *out, const void *x, const void *y, size_t n, Op op,
                      const char *opname) {
    if (!n) return;
    int vec = dt_cuda_aligned16(out) && dt_cuda_aligned16(x) && (!HAS_Y || dt_cuda_aligned16(y));
    size_t work = vec ? n / dt_pack<T>::N + n % dt_pack<T>::N : n;
    DT_LAUNCH((ew_kernel<T, Op, HAS_Y, ACC>), dt_cuda_grid(dev, work, EW_BLOCK), EW_BLOCK, 0,
              dt_cuda_stream(dev))((T *)out, (const T *)x, (const T *)y, n, vec, op);
    dt_cuda_note_launch(dev, opname);
}

template <typename T> static void gelu_forward(dt_device_t *dev, void *out, const void *inp, size_t n) {
    ew_launch<T, gelu_fwd_op, false, false>(dev, out, inp, NULL, n, gelu_fwd_op(), "gelu_forward");
}

template <typename T>
static void gelu_backward(dt_device_t *dev, void *dinp, const void *inp, const void *dout, size_t n) {
    ew_launch<T, gelu_bwd_op, true, true>(dev, dinp, inp, dout, n, gelu_bwd_op(), "gelu_backward");
}

template <typename T> static void relu_forward(dt_device_t *dev, void *out, const void *inp, size_t n) {
    ew_launch<T, relu_fwd_op, false, false>(dev, out, inp, NULL, n, relu_fwd_op(), "relu_forward");
}

template <typename T>
static void relu_backward(dt_device_t *dev, void *dinp, const void *inp, const void *dout, size_t n) {
    ew_launch<T, relu_bwd_op, true, true>(dev, dinp, inp, dout, n, relu_bwd_op(), "relu_backward");
}

template <typename T>
static void residual_forward(dt_device_t *dev, void *out, const void *a, const void *b, size_t n) {
    ew_launch<T, add_op, true, false>(dev, out, a, b, n, add_op(), "residual_forward");
}

template <typename T>
static void residual_backward(dt_device_t *dev, void *da, void *db, const void *dout, size_t n) {
    if (da) ew_launch<T, copy_op, false, true>(dev, da, dout, NULL, n, copy_op(), "residual_backward");
    if (db) ew_launch<T, copy_op, false, true>(dev, db, dout, NULL, n, copy_op(), "residual_backward");
}

template <typename T> static void scale(dt_device_t *dev, void *x, float s, size_t n) {
    scale_op op;
    op.s = s;
    ew_launch<T, scale_op, false, false>(dev, x, x, NULL, n, op, "scale");
}

template <typename T> static void fill(dt_ops_t *o) {
    o->gelu_forward = gelu_forward<T>;
    o->gelu_backward = gelu_backward<T>;
    o->relu_forward = relu_forward<T>;
    o->relu_backward = relu_backward<T>;
    o->residual_forward = residual_forward<T>;
    o->residual_backward = residual_backward<T>;
    o->scale = scale<T>;
}

void dt_cuda_fill_elementwise_ops(dt_ops_t *ops, dt_dtype_t dtype) {
    if (dtype == DT_DTYPE_BF16)
        fill<dt_bf16>(ops);
    else
        fill<float>(ops);
}
