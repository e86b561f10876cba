/*
 * sr_hash.h - the random bits of stochastic rounding to bf16, shared by the CUDA
 * AdamW (kernels/cuda/cuda_optim.cu) and the host AdamW of optimizer offload
 * (kernels/cpu/cpu_optim.c), so the two round every element the same way: one
 * definition, compiled by both nvcc and the C compiler.
 *
 * murmur3's 32-bit finaliser as a counter-based hash of (key, i): any thread can
 * compute any element's bits, and the same (seed, step, i) always gives the same bits.
 * Rounding adds the low 16 bits below bf16's last mantissa bit of the fp32 pattern and
 * truncates (on the magnitude, so negative numbers round symmetrically); callers round
 * infinities and NaN to nearest instead.
 */
#ifndef DT_KERNELS_SR_HASH_H
#define DT_KERNELS_SR_HASH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define DT_SR_FN static __host__ __device__ __forceinline__
#else
#define DT_SR_FN static inline
#endif

/* murmur3's finaliser: a bijection whose output bits each depend on all input bits. */
DT_SR_FN uint32_t dt_sr_fmix32(uint32_t h) {
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h;
}

/* 32 random bits for element i under key. */
DT_SR_FN uint32_t dt_sr_bits(uint32_t key, size_t i) {
    return dt_sr_fmix32(dt_sr_fmix32((uint32_t)i ^ key) ^ (uint32_t)((uint64_t)i >> 32));
}

/* The fp32 bit pattern b (finite) rounded stochastically with bits r: a bf16's bits in
 * the upper half. */
DT_SR_FN uint32_t dt_sr_round_bits(uint32_t b, uint32_t r) { return (b + (r & 0xffffu)) & 0xffff0000u; }

#endif /* DT_KERNELS_SR_HASH_H */
