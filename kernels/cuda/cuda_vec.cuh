/*
 * cuda_vec.cuh - 16-byte packs for vectorised loads and stores in kernels
 * templated on the storage type: 4 floats or 8 bf16 move as one int4 (one 128-bit
 * memory instruction). Callers check dt_cuda_aligned16 on every pointer first and
 * handle the elements past the last whole pack one at a time.
 */
#ifndef DT_KERNELS_CUDA_VEC_CUH
#define DT_KERNELS_CUDA_VEC_CUH

#include <stdint.h>
#include <string.h>

template <typename T> struct dt_pack {
    static constexpr int N = 16 / sizeof(T);
    T e[16 / sizeof(T)];
};

template <typename T> __device__ __forceinline__ dt_pack<T> dt_pack_load(const T *p) {
    int4 raw = *reinterpret_cast<const int4 *>(p);
    dt_pack<T> v;
    memcpy(&v.e, &raw, 16);
    return v;
}

template <typename T> __device__ __forceinline__ void dt_pack_store(T *p, const dt_pack<T> &v) {
    int4 raw;
    memcpy(&raw, &v.e, 16);
    *reinterpret_cast<int4 *>(p) = raw;
}

/* 1 when p (NULL counts as aligned: nothing is loaded through it) sits on 16 bytes. */
static inline int dt_cuda_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

#endif /* DT_KERNELS_CUDA_VEC_CUH */
