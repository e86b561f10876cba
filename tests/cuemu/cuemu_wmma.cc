/*
 * cuemu_wmma.cc - the emulator's tensor cores: nvcuda::wmma's warp-collective loads,
 * stores and mma_sync for 16x16x16 bf16 -> fp32 (the API is in cuemu.h; the warp
 * rendezvous is cuemu.cc's warp_call, which calls wmma_run once every lane of the warp
 * has arrived, with every lane's arguments).
 *
 * Fragments: each lane holds 8 elements of the 16x16 logical matrix. The mapping is
 * unspecified in CUDA; the emulator's differs between matrix_a, matrix_b and the
 * accumulator (see frag_rc), so a kernel that copies x[] between fragments of different
 * uses, or that assumes which row a lane holds, gives wrong numbers here instead of
 * passing by luck. The memory layout (row_major/col_major, mem_row_major/mem_col_major)
 * only says where (r, c) lives in memory; it never changes the mapping.
 *
 * mma_sync: every product of two bf16 values is exact in double; the 16 products and c
 * are summed in double and rounded to fp32 once (tensor cores keep at least fp32).
 */
#include <stdint.h>
#include <stdio.h>

#include "tests/cuemu/cuemu_internal.h"

namespace cuemu {

/* Row and column of element k (0..7) of lane l (0..31) for a fragment of this use. */
static inline void frag_rc(wmma_op use, int l, int k, int *r, int *c) {
    switch (use) {
    case WMMA_LOAD_A: /* column-major index l + 32k */
        *r = l % 16;
        *c = 2 * k + l / 16;
        break;
    case WMMA_LOAD_B: /* row-major index 8l + k */
        *r = l / 2;
        *c = 8 * (l % 2) + k;
        break;
    default: /* accumulator: row-major index l + 32k */
        *r = 2 * k + l / 16;
        *c = l % 16;
        break;
    }
}

static inline size_t mem_index(int r, int c, unsigned ldm, int col_major) {
    return col_major ? (size_t)c * ldm + (size_t)r : (size_t)r * ldm + (size_t)c;
}

bool wmma_check_lane(const wmma_args *a, char *why, size_t len) {
    if (a->op == WMMA_MMA) return true;
    size_t elem = a->op == WMMA_LOAD_A || a->op == WMMA_LOAD_B ? 2 : 4;
    if (!a->ptr) {
        snprintf(why, len, "the pointer is NULL");
        return false;
    }
    if ((uintptr_t)a->ptr % 32) {
        snprintf(why, len, "the pointer %p is not 256-bit (32-byte) aligned", a->ptr);
        return false;
    }
    if (a->ldm % (16 / elem)) {
        snprintf(why, len, "ldm %u is not a multiple of %zu (16 bytes of %s elements)", a->ldm, 16 / elem,
                 elem == 2 ? "16-bit" : "32-bit");
        return false;
    }
    if (a->col_major != 0 && a->col_major != 1) {
        snprintf(why, len, "the layout is neither mem_row_major nor mem_col_major");
        return false;
    }
    return true;
}

int wmma_mismatch(wmma_args *const lanes[32], char *why, size_t len) {
    const wmma_args *z = lanes[0];
    for (int l = 1; l < 32; l++) {
        const wmma_args *o = lanes[l];
        if (o->op != z->op) {
            snprintf(why, len, "lane %d and lane 0 make different WMMA calls", l);
            return l;
        }
        if (o->ptr != z->ptr || o->ldm != z->ldm || o->col_major != z->col_major) {
            snprintf(why, len, "lane %d passes pointer %p, ldm %u, %s while lane 0 passes %p, ldm %u, %s", l, o->ptr,
                     o->ldm, o->col_major ? "column-major" : "row-major", z->ptr, z->ldm,
                     z->col_major ? "column-major" : "row-major");
            return l;
        }
    }
    return -1;
}

void wmma_run(wmma_args *const lanes[32]) {
    const wmma_args *z = lanes[0];
    switch (z->op) {
    case WMMA_LOAD_A:
    case WMMA_LOAD_B: {
        const __nv_bfloat16 *p = (const __nv_bfloat16 *)z->ptr;
        for (int l = 0; l < 32; l++)
            for (int k = 0; k < 8; k++) {
                int r, c;
                frag_rc(z->op, l, k, &r, &c);
                ((__nv_bfloat16 *)lanes[l]->frag)[k] = p[mem_index(r, c, z->ldm, z->col_major)];
            }
        break;
    }
    case WMMA_LOAD_C: {
        const float *p = (const float *)z->ptr;
        for (int l = 0; l < 32; l++)
            for (int k = 0; k < 8; k++) {
                int r, c;
                frag_rc(z->op, l, k, &r, &c);
                ((float *)lanes[l]->frag)[k] = p[mem_index(r, c, z->ldm, z->col_major)];
            }
        break;
    }
    case WMMA_STORE_D: {
        float *p = (float *)const_cast<void *>(z->ptr);
        for (int l = 0; l < 32; l++)
            for (int k = 0; k < 8; k++) {
                int r, c;
                frag_rc(z->op, l, k, &r, &c);
                p[mem_index(r, c, z->ldm, z->col_major)] = ((const float *)lanes[l]->frag)[k];
            }
        break;
    }
    case WMMA_MMA: {
        /* Gather all of a, b and c before writing d: d may be c. */
        double A[16][16], B[16][16], C[16][16];
        for (int l = 0; l < 32; l++)
            for (int k = 0; k < 8; k++) {
                int r, c;
                frag_rc(WMMA_LOAD_A, l, k, &r, &c);
                A[r][c] = (double)__bfloat162float(lanes[l]->a[k]);
                frag_rc(WMMA_LOAD_B, l, k, &r, &c);
                B[r][c] = (double)__bfloat162float(lanes[l]->b[k]);
                frag_rc(WMMA_LOAD_C, l, k, &r, &c);
                C[r][c] = (double)lanes[l]->c[k];
            }
        for (int l = 0; l < 32; l++)
            for (int k = 0; k < 8; k++) {
                int r, c;
                frag_rc(WMMA_STORE_D, l, k, &r, &c);
                double s = 0;
                for (int i = 0; i < 16; i++) s += A[r][i] * B[i][c];
                ((float *)lanes[l]->frag)[k] = (float)(s + C[r][c]);
            }
        break;
    }
    }
}

} /* namespace cuemu */
