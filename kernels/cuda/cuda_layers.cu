/*
 * cuda_layers.cu - the layer ops' entry point into the CUDA op table
 * (dt_cuda_fill_layer_ops, called by cuda_device.cu) and the host-side helpers
 * they share: the growing scratch buffer and error recording.
 */
#include <stdio.h>

#include "kernels/cuda/cuda_layers.cuh"

extern "C" void dt_cuda_fill_layer_ops(dt_ops_t *ops, dt_dtype_t dtype) {
    dt_cuda_fill_encoder_ops(ops, dtype);
    dt_cuda_fill_layernorm_ops(ops, dtype);
    dt_cuda_fill_attention_ops(ops, dtype);
    dt_cuda_fill_loss_ops(ops, dtype);
}

/* Keeps the first failure, as dt_cuda_note_launch does: synchronize reports it. */
static void record(dt_device_t *dev, cudaError_t e, const char *op, const char *what) {
    dt_cuda_impl *impl = dt_cuda(dev);
    if (impl->sticky != cudaSuccess) return;
    impl->sticky = e;
    snprintf(impl->sticky_op, sizeof impl->sticky_op, "%s: %s", op, what);
}

void dt_cuda_layer_fail(dt_device_t *dev, cudaError_t e, const char *op, const char *what) {
    record(dev, e, op, what);
}

void dt_cuda_layer_fail_blas(dt_device_t *dev, cublasStatus_t s, const char *op) {
    char what[40];
    snprintf(what, sizeof what, "cuBLAS status %d", (int)s);
    /* The CUDA error code only marks that something failed; the text names cuBLAS. */
    record(dev, cudaErrorUnknown, op, what);
}

/* Stand-in until cuda_device.cu defines the real one (a strong symbol, which the
 * linker takes over this weak one): the same sticky first-error rule. */
__attribute__((weak)) void dt_cuda_note_launch(dt_device_t *dev, const char *op) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) record(dev, e, op, "launch");
}

void *dt_cuda_layer_scratch(dt_device_t *dev, size_t bytes, const char *op) {
    dt_cuda_impl *impl = dt_cuda(dev);
    if (impl->scratch && impl->scratch_bytes >= bytes) return impl->scratch;
    /* Shapes are fixed for a run, so this happens once or twice per device. Grow by
     * half again to avoid creeping by a few bytes at a time. */
    size_t want = bytes + bytes / 2;
    cudaError_t e;
    if (impl->scratch) {
        /* Earlier ops may still be reading the old buffer. */
        e = cudaStreamSynchronize(impl->stream);
        if (e != cudaSuccess) {
            dt_cuda_layer_fail(dev, e, op, "synchronize before growing the scratch");
            return NULL;
        }
        cudaFree(impl->scratch);
        impl->scratch = NULL;
        impl->scratch_bytes = 0;
    }
    void *p = NULL;
    e = cudaMalloc(&p, want);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* the failure is recorded here, not at the next launch */
        dt_cuda_layer_fail(dev, e, op, "cudaMalloc of the scratch");
        return NULL;
    }
    impl->scratch = p;
    impl->scratch_bytes = want;
    return p;
}
