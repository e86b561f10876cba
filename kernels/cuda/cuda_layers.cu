/*
 * cuda_layers.cu - the layer ops' entry point into the CUDA op table
 * (dt_cuda_fill_layer_ops, called by cuda_device.cu) and the host-side helpers
 * they share: the device's scratch buffer, grown on demand.
 */
#include "kernels/cuda/cuda_layers.cuh"

extern "C" void dt_cuda_fill_layer_ops(dt_ops_t *ops, dt_dtype_t dtype) {
    dt_cuda_fill_encoder_ops(ops, dtype);
    dt_cuda_fill_layernorm_ops(ops, dtype);
    dt_cuda_fill_attention_ops(ops, dtype);
    dt_cuda_fill_loss_ops(ops, dtype);
    dt_cuda_fill_llama_ops(ops, dtype);
    dt_cuda_fill_lora_ops(ops, dtype);
    dt_cuda_fill_attention_block_ops(ops, dtype);
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
            dt_cuda_note_error(dev, op, e);
            return NULL;
        }
        cudaFree(impl->scratch);
        dt_mem_account(DT_MEM_OTHER, -(int64_t)impl->scratch_bytes);
        impl->scratch = NULL;
        impl->scratch_bytes = 0;
    }
    void *p = NULL;
    e = cudaMalloc(&p, want);
    if (e != cudaSuccess) {
        dt_cuda_note_error(dev, op, e);
        return NULL;
    }
    /* Accounted as cuda_device.cu accounts the scratch it allocates and frees. */
    dt_mem_account(DT_MEM_OTHER, (int64_t)want);
    impl->scratch = p;
    impl->scratch_bytes = want;
    return p;
}
