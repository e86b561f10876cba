/*
 * cuda_device.cu - the CUDA device: open/close, memory, error translation, and the
 * op table. (Placeholder until the backend lands: reports the device unavailable.)
 */
#include "kernels/cuda/cuda_common.cuh"

#include "kernels/cuda/cuda.h"

extern "C" dt_status_t dt_cuda_device_init(dt_device_t *dev, int ordinal, dt_dtype_t dtype) {
    (void)dev; (void)ordinal; (void)dtype;
    return dt_error(DT_STATUS_UNSUPPORTED, "device 'cuda' is not available: the CUDA op table is not implemented yet");
}

extern "C" void dt_cuda_device_free(dt_device_t *dev) { (void)dev; }

extern "C" int dt_cuda_device_count(void) { return 0; }
