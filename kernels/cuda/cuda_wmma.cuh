/*
 * cuda_wmma.cuh - WMMA fragment loads and stores of *shared* memory that reach the
 * hardware's shared-memory instructions.
 *
 * nvcc hands nvcuda::wmma's bf16 loads a generic address (PTX wmma.load with no
 * state space) even when the pointer points into __shared__ memory, static or
 * dynamic, and ptxas lowers a generic wmma.load to eight 32-bit generic LD.E per
 * fragment: each goes through the generic-to-shared window check and none is a
 * matrix load. With the .shared state space and a shared-window address (what
 * these functions pass), ptxas emits one LDSM.16.M88.4 per bf16 fragment (LDSM.T
 * for the transposed layouts) and LDS/STS for the fp32 accumulators. Counted on
 * cuda_attention_fused.cu for sm_90 with cuobjdump (scripts/bench/sass_fused.sh).
 *
 * The pointer must point into shared memory and be 32-byte aligned, ldm a multiple
 * of 8 elements (bf16) or 4 (fp32), as for nvcuda::wmma. Under the CPU emulator
 * (DT_CUEMU) these are nvcuda::wmma's own calls, so its checks (every lane present,
 * alignment) hold for them too.
 */
#ifndef DT_KERNELS_CUDA_WMMA_CUH
#define DT_KERNELS_CUDA_WMMA_CUH

#include "kernels/cuda/cuda_common.cuh"

typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, dt_bf16, nvcuda::wmma::row_major> dt_wfrag_a_row;
typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, dt_bf16, nvcuda::wmma::col_major> dt_wfrag_a_col;
typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, dt_bf16, nvcuda::wmma::row_major> dt_wfrag_b_row;
typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, dt_bf16, nvcuda::wmma::col_major> dt_wfrag_b_col;
typedef nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> dt_wfrag_acc;

#ifdef DT_CUEMU

/* The caller's file and line go on, so the emulator's messages name the kernel's call. */
template <typename F>
static inline void dt_wmma_lds(F &f, const dt_bf16 *p, unsigned ldm, const char *file = __builtin_FILE(),
                               int line = __builtin_LINE()) {
    nvcuda::wmma::load_matrix_sync(f, p, ldm, file, line);
}
static inline void dt_wmma_lds_acc(dt_wfrag_acc &f, const float *p, unsigned ldm,
                                   const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    nvcuda::wmma::load_matrix_sync(f, p, ldm, nvcuda::wmma::mem_row_major, file, line);
}
static inline void dt_wmma_sts_acc(float *p, const dt_wfrag_acc &f, unsigned ldm,
                                   const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    nvcuda::wmma::store_matrix_sync(p, f, ldm, nvcuda::wmma::mem_row_major, file, line);
}

#else

/* The bf16 fragments hold 8 elements in 4 32-bit registers, as the PTX instruction
 * returns them (what <mma.h>'s own loads write through (int *)&frag). "memory": the
 * loads must stay after the __syncthreads that published the tile. */
#define DT_WMMA_LDS_BF16(FRAG, PTX)                                                                     \
    static __device__ __forceinline__ void dt_wmma_lds(FRAG &f, const dt_bf16 *p, unsigned ldm) {         \
        unsigned a = (unsigned)__cvta_generic_to_shared(p);                                             \
        unsigned *x = reinterpret_cast<unsigned *>(&f.x[0]);                                            \
        asm volatile(PTX " {%0, %1, %2, %3}, [%4], %5;"                                                 \
                     : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])                                   \
                     : "r"(a), "r"(ldm)                                                                 \
                     : "memory");                                                                       \
    }
DT_WMMA_LDS_BF16(dt_wfrag_a_row, "wmma.load.a.sync.aligned.row.m16n16k16.shared.bf16")
DT_WMMA_LDS_BF16(dt_wfrag_a_col, "wmma.load.a.sync.aligned.col.m16n16k16.shared.bf16")
DT_WMMA_LDS_BF16(dt_wfrag_b_row, "wmma.load.b.sync.aligned.row.m16n16k16.shared.bf16")
DT_WMMA_LDS_BF16(dt_wfrag_b_col, "wmma.load.b.sync.aligned.col.m16n16k16.shared.bf16")
#undef DT_WMMA_LDS_BF16

static __device__ __forceinline__ void dt_wmma_lds_acc(dt_wfrag_acc &f, const float *p, unsigned ldm) {
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    float *x = f.x;
    asm volatile("wmma.load.c.sync.aligned.row.m16n16k16.shared.f32 {%0, %1, %2, %3, %4, %5, %6, %7}, [%8], %9;"
                 : "=f"(x[0]), "=f"(x[1]), "=f"(x[2]), "=f"(x[3]), "=f"(x[4]), "=f"(x[5]), "=f"(x[6]), "=f"(x[7])
                 : "r"(a), "r"(ldm)
                 : "memory");
}

static __device__ __forceinline__ void dt_wmma_sts_acc(float *p, const dt_wfrag_acc &f, unsigned ldm) {
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    const float *x = f.x;
    asm volatile("wmma.store.d.sync.aligned.row.m16n16k16.shared.f32 [%0], {%1, %2, %3, %4, %5, %6, %7, %8}, %9;"
                 :
                 : "r"(a), "f"(x[0]), "f"(x[1]), "f"(x[2]), "f"(x[3]), "f"(x[4]), "f"(x[5]), "f"(x[6]), "f"(x[7]),
                   "r"(ldm)
                 : "memory");
}

#endif /* DT_CUEMU */

#endif /* DT_KERNELS_CUDA_WMMA_CUH */
