/*
 * test_packed_cuda.c - packed sequences through nets on the CUDA device (real GPU or
 * the emulator; skipped without one), fp32: gpt and llama with one row packing three
 * documents give each token's loss and the parameter gradients of the documents run
 * alone on the same device (tests/packed_harness.h), with the cuBLAS attention and
 * with the fused kernel, as a whole net under full recomputation and as two
 * pipeline chunks. Tolerance 1e-5 as on the CPU: the two runs' sums differ in
 * order only (the alone rows' untrained tails add zeros).
 */
#include <stdio.h>

#include "tests/gpu/gpu_fixture.h"
#include "tests/packed_harness.h"

static void packed_cuda(int llama, const char *attention) {
    ctx_t x;
    ctx_open_attention(&x, DT_DTYPE_F32, attention);
    dt_model_spec s = pk_spec(llama);
    char what[96];
    pk_run alone = pk_run_whole(x.gpu, &s, DT_MODEL_RECOMPUTE_NONE, 0);
    pk_run packed = pk_run_whole(x.gpu, &s, DT_MODEL_RECOMPUTE_FULL, 1);
    snprintf(what, sizeof what, "%s, %s attention: packed whole, full recomputation", s.ops->name, attention);
    pk_expect_close(&packed, &alone, 1e-5, what);
    pk_run chunks = pk_run_chunks(x.gpu, &s, DT_MODEL_RECOMPUTE_NONE, 1);
    snprintf(what, sizeof what, "%s, %s attention: packed, two chunks", s.ops->name, attention);
    pk_expect_close(&chunks, &alone, 1e-5, what);
    pk_free(&alone), pk_free(&packed), pk_free(&chunks);
    ctx_close(&x);
}

Test(packed_cuda, gpt_cublas) { packed_cuda(0, "cublas"); }
Test(packed_cuda, gpt_fused) { packed_cuda(0, "fused"); }
Test(packed_cuda, llama_cublas) { packed_cuda(1, "cublas"); }
Test(packed_cuda, llama_fused) { packed_cuda(1, "fused"); }
