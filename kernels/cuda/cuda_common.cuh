/*
 * cuda_common.cuh - what every .cu file of kernels/cuda includes first.
 *
 * The same sources build two ways:
 *  - with nvcc (DT_USE_CUDA): the real CUDA runtime, cuBLASLt and cuBLAS;
 *  - with g++ under the CPU emulator (DT_CUEMU, tests/cuemu/cuemu.h force-included):
 *    kernels run as fibers on the host so `make test` checks their logic on machines
 *    with no GPU. Only what the emulator provides may be used in kernels: see the
 *    list in tests/cuemu/cuemu.h (threadIdx/blockIdx/blockDim/gridDim, __shared__,
 *    DT_DYN_SMEM, __syncthreads, __shfl_*_sync, atomicAdd, bf16 conversions, float4,
 *    the math functions, nvcuda::wmma for 16x16x16 bf16 -> fp32 (<mma.h> is included
 *    here), and the cuBLASLt/cuBLAS calls the backend makes).
 *
 * Two rules make that work:
 *  - launch with DT_LAUNCH(kernel, grid, block, smem_bytes, stream)(args...), never
 *    with the triple-chevron syntax directly;
 *  - declare dynamic shared memory with DT_DYN_SMEM(type, name) at the top of a kernel.
 */
#ifndef DT_KERNELS_CUDA_COMMON_CUH
#define DT_KERNELS_CUDA_COMMON_CUH

#ifndef DT_CUEMU
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>
#define DT_LAUNCH(kernel, grid, block, smem, stream) kernel<<<(grid), (block), (smem), (stream)>>>
#define DT_DYN_SMEM(T, name)                                                                   \
    extern __shared__ __align__(128) unsigned char dt_dyn_smem_[]; /* WMMA wants 32 */                              \
    T *name = reinterpret_cast<T *>(dt_dyn_smem_)
#endif

#include "kernels/cuda/cuda_impl.h"

#endif /* DT_KERNELS_CUDA_COMMON_CUH */
