/*
 * test_cp_cuda.c - context parallelism's CUDA ops (kernels/cuda/cuda_attention_block.cu:
 * attention_block_*, attention_kv_pack, attention_kv_grad_add) against the CPU ops
 * (which tests/test_kernels_cp.c holds to the full attention), in both compute
 * dtypes. Runs on a real GPU and on the CPU emulator (make test); skipped where no
 * CUDA device is visible.
 *
 * Each rank of a ring of R (the causal load balance: chunks r and 2R-1-r of 2R)
 * runs its queries over the R blocks on the CPU, with the device's ops (the tiled
 * kernels up to head size 128) and with the simple kernels (one warp a row; the
 * tiled ones' fallback): forward from its own block (first = 1), finish, delta,
 * backward into dqkv (pre-filled at random: += is checked) and each block's dkv
 * (the same), then its own dkv added back with kv_grad_add. Each of the three is
 * held to the others. Inputs are uploaded and read back, so the devices see the
 * same (in bf16, rounded) values; o, lse, dkv and the scratch are poisoned on the
 * GPU first; every backward reads the tiled forward's out and lse, so in bf16 all
 * start from the same rounded output. Shapes: head sizes 8, 16 and 48 in one tile;
 * several query and key tiles (part-filled ones, tiles across the two chunks of a
 * rank, key tiles wholly in the future of a query tile or before its documents,
 * which the tiled kernels skip); head size 128 (shared memory over 48 KiB) and
 * 160 (the fallback); multi-head and grouped-query; packed positions
 * (gpu_fixture.h: documents shorter and longer than a chunk or a tile, of one
 * token).
 *
 * Tolerances, |got - want| <= tol max(1, max |want|): o, lse and dkv are fp32 on
 * every side with sums in another order and expf against the CPU's: 2e-5. out and
 * dqkv are in the compute dtype: fp32 2e-5; in bf16 out is rounded once (2^-9 of
 * max) from values that agree to 2e-5: 2^-8; dqkv's q part is rounded after each
 * of the R blocks, its k|v part once more by kv_grad_add: (R + 1) 2^-9. A block no
 * row sees leaves o and lse bitwise, and its backward adds nothing; the tiled
 * kernels give the same bits run again.
 */
#include <criterion/logging.h>
#include <math.h>
#include <stdio.h>

#include "tests/gpu/gpu_fixture.h"

/* cuda_attention_block.cu: a table's attention_block_forward and _backward set to
 * the simple kernels (one warp a row), the tiled kernels' fallback. */
void dt_cuda_fill_attention_block_simple_ops(dt_ops_t *ops, dt_dtype_t dtype);

typedef struct cp_shape {
    int B, T, C, NH, NKV, R, packed;
} cp_shape;

static double check_max(const char *what, const float *got, const float *want, size_t n, double tol) {
    double top = 1, worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) top = fabs(want[i]) > top ? fabs(want[i]) : top;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= worst)) worst = e, at = i; /* NaN is the worst */
    }
    cr_assert(worst <= tol * top, "%s[%zu]: got %.9g, want %.9g (max |diff| %.3g, max |want| %.3g)", what, at, got[at],
              want[at], worst, top);
    return worst;
}

static void *gpu_f32(ctx_t *x, const float *host, size_t n) {
    void *d = gpu_alloc(x, n * sizeof(float));
    cr_assert_eq(x->g->copy(x->gpu, d, host, n * sizeof(float), DT_COPY_HOST_TO_DEVICE), DT_STATUS_OK, "%s",
                 dt_error_detail());
    return d;
}

static float *fetch_f32(ctx_t *x, const void *d, size_t n) {
    ctx_sync(x);
    float *h = malloc(n * sizeof *h);
    cr_assert_eq(x->g->copy(x->gpu, h, d, n * sizeof *h, DT_COPY_DEVICE_TO_HOST), DT_STATUS_OK, "%s",
                 dt_error_detail());
    return h;
}

/* The tiled kernels (the device's table) against the CPU and against the simple
 * kernels (sx, the same inputs on the GPU); the simple kernels against the CPU too. */
static void cp_vs_cpu(dt_dtype_t dtype, const cp_shape *s, uint64_t seed) {
    ctx_t x;
    ctx_open(&x, dtype);
    dt_ops_t sx = *x.g;
    dt_cuda_fill_attention_block_simple_ops(&sx, dtype);
    rng_seed(seed);
    int B = s->B, T = s->T, C = s->C, NH = s->NH, NKV = s->NKV, R = s->R, HS = C / NH, KV = NKV * HS;
    int C3 = C + 2 * KV, L = T / (2 * R), Tq = 2 * L;
    cr_assert_eq(T % (2 * R), 0);
    double tol = 2e-5, tol_dtype = x.bf16 ? 1.0 / 256 : 2e-5, tol_dq = x.bf16 ? (R + 1) / 512.0 : tol;
    size_t nq = (size_t)B * Tq * C3, no = (size_t)B * Tq * C, nkv = (size_t)B * Tq * 2 * KV, nl = (size_t)B * NH * Tq;
    int *pos = s->packed ? packed_positions(B, T) : NULL;
    float *qkv = frand((size_t)B * T * C3, 1.5f, 0), *dout = frand((size_t)B * T * C, 1, 0);
    int *qidx[R], *qlo[R], *gqidx[R], *gqlo[R];
    float *q[R], *kv[R];
    void *gq[R], *gkv[R];
    for (int r = 0; r < R; r++) {
        qidx[r] = malloc(sizeof(int) * (size_t)B * Tq), qlo[r] = malloc(sizeof(int) * (size_t)B * Tq);
        q[r] = malloc(sizeof(float) * nq), kv[r] = malloc(sizeof(float) * nkv);
        for (int b = 0; b < B; b++)
            for (int i = 0; i < Tq; i++) {
                int t = i < L ? r * L + i : (2 * R - 1 - r) * L + (i - L), at = b * Tq + i;
                qidx[r][at] = t, qlo[r][at] = pos ? t - pos[b * T + t] : 0;
                memcpy(q[r] + (size_t)at * C3, qkv + ((size_t)b * T + t) * C3, sizeof(float) * (size_t)C3);
            }
        gq[r] = gpu_tensor(&x, q[r], nq); /* q[r] now holds the GPU's values */
        gqidx[r] = gpu_positions(&x, qidx[r], B, Tq), gqlo[r] = gpu_positions(&x, qlo[r], B, Tq);
        x.c->attention_kv_pack(x.cpu, kv[r], q[r], B, Tq, C, NH, NKV);
        gkv[r] = gpu_alloc(&x, nkv * dt_dtype_size(dtype));
        poison(&x, gkv[r], nkv * dt_dtype_size(dtype));
        x.g->attention_kv_pack(x.gpu, gkv[r], gq[r], B, Tq, C, NH, NKV);
        float *back = fetch(&x, gkv[r], nkv);
        check_max("kv_pack", back, kv[r], nkv, 0);
        free(back);
    }
    size_t cs = x.c->attention_block_scratch_bytes(x.cpu, B, Tq, Tq, C, NH, NKV);
    size_t gs = x.g->attention_block_scratch_bytes(x.gpu, B, Tq, Tq, C, NH, NKV);
    void *cscr = malloc(cs ? cs : 1), *gscr = gpu_alloc(&x, gs);
    poison(&x, gscr, gs ? gs : 1);
    /* w: tiled vs cpu; v: tiled vs simple; u: simple vs cpu */
    double w_o = 0, w_lse = 0, w_out = 0, w_dq = 0, w_dkv = 0, v_o = 0, v_lse = 0, v_dq = 0, v_dkv = 0, u_o = 0,
           u_dq = 0, u_dkv = 0;
    for (int r = 0; r < R; r++) {
        float *o = malloc(sizeof(float) * no), *lse = malloc(sizeof(float) * nl), *out = malloc(sizeof(float) * no);
        float *delta = malloc(sizeof(float) * nl), *dO = malloc(sizeof(float) * no);
        for (int at = 0; at < B * Tq; at++)
            memcpy(dO + (size_t)at * C, dout + ((size_t)(at / Tq) * T + qidx[r][at]) * C, sizeof(float) * (size_t)C);
        void *gdO = gpu_tensor(&x, dO, no);
        float *go = gpu_alloc(&x, sizeof(float) * no), *glse = gpu_alloc(&x, sizeof(float) * nl);
        float *so = gpu_alloc(&x, sizeof(float) * no), *slse = gpu_alloc(&x, sizeof(float) * nl);
        float *gdelta = gpu_alloc(&x, sizeof(float) * nl);
        void *gout = gpu_alloc(&x, no * dt_dtype_size(dtype));
        poison(&x, go, sizeof(float) * no), poison(&x, glse, sizeof(float) * nl);
        poison(&x, so, sizeof(float) * no), poison(&x, slse, sizeof(float) * nl);
        for (int step = 0; step < R; step++) {
            int src = (r - step + R) % R;
            x.c->attention_block_forward(x.cpu, o, lse, cscr, q[r], kv[src], qidx[r], qlo[r], qidx[src], step == 0,
                                         B, Tq, Tq, C, NH, NKV);
            x.g->attention_block_forward(x.gpu, go, glse, gscr, gq[r], gkv[src], gqidx[r], gqlo[r], gqidx[src],
                                         step == 0, B, Tq, Tq, C, NH, NKV);
            sx.attention_block_forward(x.gpu, so, slse, gscr, gq[r], gkv[src], gqidx[r], gqlo[r], gqidx[src],
                                       step == 0, B, Tq, Tq, C, NH, NKV);
        }
        float *ho = fetch_f32(&x, go, no), *hlse = fetch_f32(&x, glse, nl);
        float *hso = fetch_f32(&x, so, no), *hslse = fetch_f32(&x, slse, nl);
        w_o = fmax(w_o, check_max("o", ho, o, no, tol));
        w_lse = fmax(w_lse, check_max("lse", hlse, lse, nl, tol));
        v_o = fmax(v_o, check_max("o (tiled vs simple)", ho, hso, no, tol));
        v_lse = fmax(v_lse, check_max("lse (tiled vs simple)", hlse, hslse, nl, tol));
        u_o = fmax(u_o, check_max("o (simple)", hso, o, no, tol));
        x.c->attention_block_finish(x.cpu, out, o, B, Tq, C);
        x.g->attention_block_finish(x.gpu, gout, go, B, Tq, C);
        float *hout = fetch(&x, gout, no);
        w_out = fmax(w_out, check_max("out", hout, out, no, tol_dtype));
        /* The backward, all three from the tiled forward's out and lse. */
        x.c->attention_block_delta(x.cpu, delta, dO, hout, B, Tq, C, NH);
        x.g->attention_block_delta(x.gpu, gdelta, gdO, gout, B, Tq, C, NH);
        float *dq = frand(nq, 1, 0), *dkv[R];
        void *gdq = gpu_tensor(&x, dq, nq), *sdq = gpu_tensor(&x, dq, nq);
        float *gdkv[R], *sdkv[R];
        for (int k = 0; k < R; k++) {
            dkv[k] = frand(nkv, 1, 0);
            gdkv[k] = gpu_f32(&x, dkv[k], nkv), sdkv[k] = gpu_f32(&x, dkv[k], nkv);
        }
        for (int step = 0; step < R; step++) {
            int src = (r - step + R) % R;
            x.c->attention_block_backward(x.cpu, dq, dkv[src], cscr, dO, q[r], kv[src], lse, delta, qidx[r], qlo[r],
                                          qidx[src], B, Tq, Tq, C, NH, NKV);
            x.g->attention_block_backward(x.gpu, gdq, gdkv[src], gscr, gdO, gq[r], gkv[src], glse, gdelta, gqidx[r],
                                          gqlo[r], gqidx[src], B, Tq, Tq, C, NH, NKV);
            sx.attention_block_backward(x.gpu, sdq, sdkv[src], gscr, gdO, gq[r], gkv[src], glse, gdelta, gqidx[r],
                                        gqlo[r], gqidx[src], B, Tq, Tq, C, NH, NKV);
        }
        x.c->attention_kv_grad_add(x.cpu, dq, dkv[r], B, Tq, C, NH, NKV);
        x.g->attention_kv_grad_add(x.gpu, gdq, gdkv[r], B, Tq, C, NH, NKV);
        x.g->attention_kv_grad_add(x.gpu, sdq, sdkv[r], B, Tq, C, NH, NKV);
        float *hdq = fetch(&x, gdq, nq), *hsdq = fetch(&x, sdq, nq);
        w_dq = fmax(w_dq, check_max("dqkv", hdq, dq, nq, tol_dq));
        v_dq = fmax(v_dq, check_max("dqkv (tiled vs simple)", hdq, hsdq, nq, tol_dq));
        u_dq = fmax(u_dq, check_max("dqkv (simple)", hsdq, dq, nq, tol_dq));
        for (int k = 0; k < R; k++) {
            float *h = fetch_f32(&x, gdkv[k], nkv), *hs = fetch_f32(&x, sdkv[k], nkv);
            w_dkv = fmax(w_dkv, check_max("dkv", h, dkv[k], nkv, x.bf16 ? 1e-4 : tol));
            v_dkv = fmax(v_dkv, check_max("dkv (tiled vs simple)", h, hs, nkv, x.bf16 ? 1e-4 : tol));
            u_dkv = fmax(u_dkv, check_max("dkv (simple)", hs, dkv[k], nkv, x.bf16 ? 1e-4 : tol));
            free(h), free(hs), free(dkv[k]);
        }
        free(o), free(lse), free(out), free(delta), free(dO), free(ho), free(hlse), free(hso), free(hslse);
        free(hout), free(dq), free(hdq), free(hsdq);
    }
    cr_log_info("%s B %d T %d C %d NH %d NKV %d %s, %d ranks: max |tiled - cpu| o %.3g lse %.3g out %.3g dqkv %.3g "
                "dkv %.3g; |tiled - simple| o %.3g lse %.3g dqkv %.3g dkv %.3g; |simple - cpu| o %.3g dqkv %.3g "
                "dkv %.3g",
                x.bf16 ? "bf16" : "fp32", B, T, C, NH, NKV, pos ? "packed" : "unpacked", R, w_o, w_lse, w_out, w_dq,
                w_dkv, v_o, v_lse, v_dq, v_dkv, u_o, u_dq, u_dkv);
    for (int r = 0; r < R; r++) free(qidx[r]), free(qlo[r]), free(q[r]), free(kv[r]);
    free(qkv), free(dout), free(pos), free(cscr);
    ctx_close(&x);
}

static const cp_shape mha = {.B = 2, .T = 48, .C = 32, .NH = 2, .NKV = 2, .R = 2};
static const cp_shape gqa = {.B = 2, .T = 48, .C = 32, .NH = 4, .NKV = 2, .R = 3, .packed = 1};
static const cp_shape wide = {.B = 1, .T = 40, .C = 96, .NH = 2, .NKV = 1, .R = 2, .packed = 1};
/* Several query and key tiles of 32 (Tq = 2 T / 2R: 128 and 96 rows): whole key
 * tiles in the future of every row of a query tile (rank 0's first chunk against
 * the other ranks' blocks), or before every row's document (packed), documents
 * across tiles, grouped-query (3 query heads a key/value head). */
static const cp_shape tiles = {.B = 2, .T = 256, .C = 64, .NH = 4, .NKV = 2, .R = 2};
static const cp_shape tiles_gqa = {.B = 2, .T = 288, .C = 96, .NH = 6, .NKV = 2, .R = 3, .packed = 1};
/* Chunks of 40 rows: tiles cut across both chunks of a rank, the last one part-filled. */
static const cp_shape tiles_ragged = {.B = 1, .T = 320, .C = 64, .NH = 2, .NKV = 1, .R = 4, .packed = 1};
/* The largest head the tiled kernels take (shared memory above 48 KiB), and one
 * wider, which falls back to the simple kernels. */
static const cp_shape head_128 = {.B = 1, .T = 128, .C = 256, .NH = 2, .NKV = 1, .R = 2, .packed = 1};
static const cp_shape head_160 = {.B = 1, .T = 64, .C = 320, .NH = 2, .NKV = 2, .R = 2};

Test(cp_cuda, multi_head_f32) { cp_vs_cpu(DT_DTYPE_F32, &mha, 1); }
Test(cp_cuda, multi_head_bf16) { cp_vs_cpu(DT_DTYPE_BF16, &mha, 2); }
Test(cp_cuda, grouped_query_packed_f32) { cp_vs_cpu(DT_DTYPE_F32, &gqa, 3); }
Test(cp_cuda, grouped_query_packed_bf16) { cp_vs_cpu(DT_DTYPE_BF16, &gqa, 4); }
Test(cp_cuda, head_48_packed_f32) { cp_vs_cpu(DT_DTYPE_F32, &wide, 5); }
Test(cp_cuda, head_48_packed_bf16) { cp_vs_cpu(DT_DTYPE_BF16, &wide, 6); }
Test(cp_cuda, tiles_f32, .timeout = 300) { cp_vs_cpu(DT_DTYPE_F32, &tiles, 11); }
Test(cp_cuda, tiles_bf16, .timeout = 300) { cp_vs_cpu(DT_DTYPE_BF16, &tiles, 12); }
Test(cp_cuda, tiles_grouped_query_packed_f32, .timeout = 300) { cp_vs_cpu(DT_DTYPE_F32, &tiles_gqa, 13); }
Test(cp_cuda, tiles_grouped_query_packed_bf16, .timeout = 300) { cp_vs_cpu(DT_DTYPE_BF16, &tiles_gqa, 14); }
Test(cp_cuda, tiles_ragged_packed_f32, .timeout = 300) { cp_vs_cpu(DT_DTYPE_F32, &tiles_ragged, 15); }
Test(cp_cuda, tiles_ragged_packed_bf16, .timeout = 300) { cp_vs_cpu(DT_DTYPE_BF16, &tiles_ragged, 16); }
Test(cp_cuda, head_128_packed_f32, .timeout = 300) { cp_vs_cpu(DT_DTYPE_F32, &head_128, 17); }
Test(cp_cuda, head_128_packed_bf16, .timeout = 300) { cp_vs_cpu(DT_DTYPE_BF16, &head_128, 18); }
Test(cp_cuda, head_160_falls_back_f32, .timeout = 300) { cp_vs_cpu(DT_DTYPE_F32, &head_160, 19); }
Test(cp_cuda, head_160_falls_back_bf16, .timeout = 300) { cp_vs_cpu(DT_DTYPE_BF16, &head_160, 20); }

/* A block in every row's future: first = 1 starts o = 0, lse = -inf (finish 0);
 * after a block the rows see, it leaves o and lse bitwise, and its backward adds
 * nothing. */
Test(cp_cuda, unseen_block) {
    ctx_t x;
    ctx_open(&x, DT_DTYPE_F32);
    rng_seed(7);
    enum { B = 1, Tq = 5, Tk = 3, C = 16, NH = 2, NKV = 1, KV = NKV * C / NH, C3 = C + 2 * KV };
    static const int qidx[Tq] = {0, 1, 2, 5, 6}, qlo[Tq] = {0, 0, 0, 0, 4};
    static const int past[Tk] = {0, 1, 2}, future[Tk] = {10, 11, 12};
    float *q = frand(B * Tq * C3, 1.5f, 0), *kv = frand(B * Tk * 2 * KV, 1, 0);
    void *gq = gpu_tensor(&x, q, B * Tq * C3), *gkv = gpu_tensor(&x, kv, B * Tk * 2 * KV);
    int *gqi = gpu_positions(&x, qidx, B, Tq), *gql = gpu_positions(&x, qlo, B, Tq);
    int *gpast = gpu_positions(&x, past, B, Tk), *gfut = gpu_positions(&x, future, B, Tk);
    float *go = gpu_alloc(&x, sizeof(float) * B * Tq * C), *glse = gpu_alloc(&x, sizeof(float) * B * NH * Tq);
    void *gout = gpu_alloc(&x, sizeof(float) * B * Tq * C);
    poison(&x, go, sizeof(float) * B * Tq * C), poison(&x, glse, sizeof(float) * B * NH * Tq);
    x.g->attention_block_forward(x.gpu, go, glse, NULL, gq, gkv, gqi, gql, gfut, 1, B, Tq, Tk, C, NH, NKV);
    x.g->attention_block_finish(x.gpu, gout, go, B, Tq, C);
    float *o = fetch_f32(&x, go, B * Tq * C), *lse = fetch_f32(&x, glse, B * NH * Tq);
    float *out = fetch(&x, gout, B * Tq * C);
    for (int i = 0; i < B * Tq * C; i++) cr_assert(o[i] == 0.0f && out[i] == 0.0f, "o[%d] %g, out %g", i, o[i], out[i]);
    for (int i = 0; i < B * NH * Tq; i++) cr_assert(isinf(lse[i]) && lse[i] < 0, "lse[%d] %g", i, lse[i]);
    free(o), free(lse), free(out);
    /* The past block: row 4's document starts at 4, so it sees none of it either. */
    x.g->attention_block_forward(x.gpu, go, glse, NULL, gq, gkv, gqi, gql, gpast, 0, B, Tq, Tk, C, NH, NKV);
    float *o1 = fetch_f32(&x, go, B * Tq * C), *l1 = fetch_f32(&x, glse, B * NH * Tq);
    for (int h = 0; h < NH; h++) {
        cr_assert(isfinite(l1[h * Tq + 3]), "row 3 saw the past block");
        cr_assert(isinf(l1[h * Tq + 4]), "row 4 saw keys before its document");
    }
    x.g->attention_block_forward(x.gpu, go, glse, NULL, gq, gkv, gqi, gql, gfut, 0, B, Tq, Tk, C, NH, NKV);
    float *o2 = fetch_f32(&x, go, B * Tq * C), *l2 = fetch_f32(&x, glse, B * NH * Tq);
    cr_assert(memcmp(o1, o2, sizeof(float) * B * Tq * C) == 0, "o changed by an unseen block");
    cr_assert(memcmp(l1, l2, sizeof(float) * B * NH * Tq) == 0, "lse changed by an unseen block");
    float *dO = frand(B * Tq * C, 1, 0), *dq = frand(B * Tq * C3, 1, 0), *dkv = frand(B * Tk * 2 * KV, 1, 0);
    void *gdO = gpu_tensor(&x, dO, B * Tq * C), *gdq = gpu_tensor(&x, dq, B * Tq * C3);
    float *gdkv = gpu_f32(&x, dkv, B * Tk * 2 * KV), *gdelta = gpu_alloc(&x, sizeof(float) * B * NH * Tq);
    x.g->attention_block_finish(x.gpu, gout, go, B, Tq, C);
    x.g->attention_block_delta(x.gpu, gdelta, gdO, gout, B, Tq, C, NH);
    x.g->attention_block_backward(x.gpu, gdq, gdkv, NULL, gdO, gq, gkv, glse, gdelta, gqi, gql, gfut, B, Tq, Tk, C, NH,
                                  NKV);
    float *dq2 = fetch(&x, gdq, B * Tq * C3), *dkv2 = fetch_f32(&x, gdkv, B * Tk * 2 * KV);
    cr_assert(memcmp(dq, dq2, sizeof(float) * B * Tq * C3) == 0, "dqkv changed by an unseen block");
    cr_assert(memcmp(dkv, dkv2, sizeof(float) * B * Tk * 2 * KV) == 0, "dkv changed by an unseen block");
    free(q), free(kv), free(o1), free(l1), free(o2), free(l2), free(dO), free(dq), free(dkv), free(dq2), free(dkv2);
    ctx_close(&x);
}

/* The same at several tiles (Tq 70, Tk 45: part-filled tiles, 4 query heads on 2
 * key/value heads): a future block leaves o, lse, dqkv and dkv bitwise; rows whose
 * document starts after the past block (60 on) keep lse -inf and their dq; and the
 * tiled kernels give the same bits when run again. */
static void unseen_tiles(dt_dtype_t dtype) {
    ctx_t x;
    ctx_open(&x, dtype);
    rng_seed(8);
    enum { B = 2, Tq = 70, Tk = 45, C = 64, NH = 4, NKV = 2, KV = NKV * C / NH, C3 = C + 2 * KV };
    size_t es = dt_dtype_size(dtype), nq = (size_t)B * Tq * C3, no = (size_t)B * Tq * C, nl = (size_t)B * NH * Tq;
    size_t nkv = (size_t)B * Tk * 2 * KV;
    int qidx[B * Tq], qlo[B * Tq], past[B * Tk], future[B * Tk];
    for (int i = 0; i < B * Tq; i++) qidx[i] = 100 + i % Tq, qlo[i] = i % Tq >= 60 ? 150 : 0;
    for (int j = 0; j < B * Tk; j++) past[j] = j % Tk, future[j] = 1000 + j % Tk;
    float *q = frand(nq, 1.5f, 0), *kv = frand(nkv, 1, 0);
    void *gq = gpu_tensor(&x, q, nq), *gkv = gpu_tensor(&x, kv, nkv);
    int *gqi = gpu_positions(&x, qidx, B, Tq), *gql = gpu_positions(&x, qlo, B, Tq);
    int *gpast = gpu_positions(&x, past, B, Tk), *gfut = gpu_positions(&x, future, B, Tk);
    float *go = gpu_alloc(&x, sizeof(float) * no), *glse = gpu_alloc(&x, sizeof(float) * nl);
    void *gout = gpu_alloc(&x, no * es);
    poison(&x, go, sizeof(float) * no), poison(&x, glse, sizeof(float) * nl);
    x.g->attention_block_forward(x.gpu, go, glse, NULL, gq, gkv, gqi, gql, gfut, 1, B, Tq, Tk, C, NH, NKV);
    float *o0 = fetch_f32(&x, go, no), *l0 = fetch_f32(&x, glse, nl);
    for (size_t i = 0; i < no; i++) cr_assert(o0[i] == 0.0f, "o[%zu] %g", i, o0[i]);
    for (size_t i = 0; i < nl; i++) cr_assert(isinf(l0[i]) && l0[i] < 0, "lse[%zu] %g", i, l0[i]);
    x.g->attention_block_forward(x.gpu, go, glse, NULL, gq, gkv, gqi, gql, gpast, 0, B, Tq, Tk, C, NH, NKV);
    float *o1 = fetch_f32(&x, go, no), *l1 = fetch_f32(&x, glse, nl);
    for (size_t i = 0; i < nl; i++)
        cr_assert(i % Tq >= 60 ? isinf(l1[i]) : isfinite(l1[i]), "lse[%zu] %g (row %zu)", i, l1[i], i % Tq);
    /* again from the start: the same bits */
    x.g->attention_block_forward(x.gpu, go, glse, NULL, gq, gkv, gqi, gql, gfut, 1, B, Tq, Tk, C, NH, NKV);
    x.g->attention_block_forward(x.gpu, go, glse, NULL, gq, gkv, gqi, gql, gpast, 0, B, Tq, Tk, C, NH, NKV);
    float *o1b = fetch_f32(&x, go, no), *l1b = fetch_f32(&x, glse, nl);
    cr_assert(memcmp(o1, o1b, sizeof(float) * no) == 0 && memcmp(l1, l1b, sizeof(float) * nl) == 0,
              "forward not reproducible");
    x.g->attention_block_forward(x.gpu, go, glse, NULL, gq, gkv, gqi, gql, gfut, 0, B, Tq, Tk, C, NH, NKV);
    float *o2 = fetch_f32(&x, go, no), *l2 = fetch_f32(&x, glse, nl);
    cr_assert(memcmp(o1, o2, sizeof(float) * no) == 0, "o changed by an unseen block");
    cr_assert(memcmp(l1, l2, sizeof(float) * nl) == 0, "lse changed by an unseen block");
    /* backward: the future block adds nothing; the past one twice gives the same bits */
    float *dO = frand(no, 1, 0), *dq = frand(nq, 1, 0), *dkv = frand(nkv, 1, 0);
    void *gdO = gpu_tensor(&x, dO, no), *gdq = gpu_tensor(&x, dq, nq), *gdq2 = gpu_tensor(&x, dq, nq);
    float *gdkv = gpu_f32(&x, dkv, nkv), *gdkv2 = gpu_f32(&x, dkv, nkv), *gdelta = gpu_alloc(&x, sizeof(float) * nl);
    x.g->attention_block_finish(x.gpu, gout, go, B, Tq, C);
    x.g->attention_block_delta(x.gpu, gdelta, gdO, gout, B, Tq, C, NH);
    x.g->attention_block_backward(x.gpu, gdq, gdkv, NULL, gdO, gq, gkv, glse, gdelta, gqi, gql, gfut, B, Tq, Tk, C,
                                  NH, NKV);
    float *dqf = fetch(&x, gdq, nq), *dkvf = fetch_f32(&x, gdkv, nkv);
    cr_assert(memcmp(dq, dqf, sizeof(float) * nq) == 0, "dqkv changed by an unseen block");
    cr_assert(memcmp(dkv, dkvf, sizeof(float) * nkv) == 0, "dkv changed by an unseen block");
    x.g->attention_block_backward(x.gpu, gdq, gdkv, NULL, gdO, gq, gkv, glse, gdelta, gqi, gql, gpast, B, Tq, Tk, C,
                                  NH, NKV);
    x.g->attention_block_backward(x.gpu, gdq2, gdkv2, NULL, gdO, gq, gkv, glse, gdelta, gqi, gql, gpast, B, Tq, Tk,
                                  C, NH, NKV);
    float *dqa = fetch(&x, gdq, nq), *dqb = fetch(&x, gdq2, nq);
    float *dkva = fetch_f32(&x, gdkv, nkv), *dkvb = fetch_f32(&x, gdkv2, nkv);
    cr_assert(memcmp(dqa, dqb, sizeof(float) * nq) == 0, "dqkv not reproducible");
    cr_assert(memcmp(dkva, dkvb, sizeof(float) * nkv) == 0, "dkv not reproducible");
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tq; t++) {
            const float *a = dqa + ((size_t)b * Tq + t) * C3, *w = dq + ((size_t)b * Tq + t) * C3;
            int same = memcmp(a, w, sizeof(float) * C) == 0;
            cr_assert(t >= 60 ? same : !same, "row %d of sequence %d: dq %s", t, b, same ? "untouched" : "changed");
            cr_assert(memcmp(a + C, w + C, sizeof(float) * 2 * KV) == 0, "the k|v part of dqkv was written");
        }
    free(q), free(kv), free(o0), free(l0), free(o1), free(l1), free(o1b), free(l1b), free(o2), free(l2);
    free(dO), free(dq), free(dkv), free(dqf), free(dkvf), free(dqa), free(dqb), free(dkva), free(dkvb);
    ctx_close(&x);
}

Test(cp_cuda, unseen_block_tiles_f32) { unseen_tiles(DT_DTYPE_F32); }
Test(cp_cuda, unseen_block_tiles_bf16) { unseen_tiles(DT_DTYPE_BF16); }
