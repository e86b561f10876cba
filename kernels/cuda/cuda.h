/*
 * cuda.h - the CUDA backend's entry points, callable from C. Implemented in
 * kernels/cuda/cuda_device.cu, built into the CUDA library; kernels/backend.c
 * looks them up by name through common/cudalib.h (no CUDA types here, so the
 * main binary includes this header without CUDA).
 */
#ifndef DT_KERNELS_CUDA_CUDA_H
#define DT_KERNELS_CUDA_CUDA_H

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Binds GPU `ordinal` (cudaSetDevice), creates the stream, cuBLASLt/cuBLAS handles
 * and workspace, and points dev->ops at the table for `dtype` (F32 or BF16).
 * UNSUPPORTED (with CUDA's message) when there is no such GPU or no driver. */
dt_status_t dt_cuda_device_init(dt_device_t *dev, int ordinal, dt_dtype_t dtype);
void dt_cuda_device_free(dt_device_t *dev);
/* Visible GPUs; 0 when there is no driver or no GPU. */
int dt_cuda_device_count(void);

#ifdef __cplusplus
}
#endif

#endif /* DT_KERNELS_CUDA_CUDA_H */
