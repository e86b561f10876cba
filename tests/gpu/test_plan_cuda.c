/*
 * test_plan_cuda.c - `dtrun plan`'s activation formula for the GPU is the arena
 * the trainer allocates on a CUDA device (runtime/model/net.c with the CUDA backend's
 * attention sizes), byte for byte, in bf16 and fp32, for both attention kinds
 * (DTRUN_CUDA_ATTENTION=cublas and =fused; a head size of 136 checks that plan
 * follows the fused kind's fallback to cuBLAS above 128), for gpt and llama (GQA, head
 * sizes apart from hidden / heads). Runs on a real GPU
 * (scripts/gpu_check.sh) and on the CPU emulator (make test); skips elsewhere.
 */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "kernels/kernels.h"
#include "runtime/model/model.h"
#include "runtime/model/net.h"
#include "runtime/tools/plan.h"

/* A llama of hidden 40 (or 256), 2 layers, 4 query heads, nkv key/value heads, head_dim
 * hd (0: hidden / 4), intermediate 52, seq 33, vocab 77. */
static dt_model_spec llama(int hidden, int tied, int bias, int hd, int nkv) {
    dt_model_spec s = {.ops = &dt_model_llama, .seq_len = 33, .vocab_size = 77, .vocab_pad_multiple = 64};
    const char *paths[] = {"model.hidden_size", "model.num_hidden_layers", "model.num_attention_heads",
                           "model.num_key_value_heads", "model.head_dim", "model.intermediate_size",
                           "model.max_position_embeddings", "model.rope_theta", "model.tie_word_embeddings",
                           "model.attention_bias"};
    double v[] = {hidden, 2, 4, nkv, hd, 52, 64, 10000, tied, bias};
    for (int i = 0; i < 10; i++) dt_model_key_set(&s, dt_model_key_find(s.ops, paths[i]), v[i]);
    return s;
}

Test(plan_cuda, activations_match_the_trainers_arena) {
    if (dt_device_count(DT_DEVICE_CUDA) == 0) cr_skip_test("no CUDA device");
    dt_model_spec specs[] = {
        llama(40, 0, 0, 0, 2),  /* GQA */
        llama(40, 1, 1, 12, 4), /* attention width 48 > hidden 40, tied, biases */
        llama(256, 0, 0, 0, 1), /* head size 64 (the fused kernel's), MQA */
        llama(40, 0, 0, 136, 2), /* head size 136: fused falls back to cuBLAS */
        {.ops = &dt_model_gpt, .n_layer = 3, .n_head = 3, .n_embd = 12, .seq_len = 7, .vocab_size = 50,
         .vocab_pad_multiple = 1},
        {.ops = &dt_model_gpt, .n_layer = 2, .n_head = 4, .n_embd = 64, .seq_len = 100, .vocab_size = 256,
         .vocab_pad_multiple = 64},
        {.ops = &dt_model_gpt, .n_layer = 12, .n_head = 12, .n_embd = 768, .seq_len = 1024,
         .vocab_size = 50257, .vocab_pad_multiple = 128},
        {.ops = &dt_model_gpt, .n_layer = 1, .n_head = 2, .n_embd = 272, .seq_len = 40, .vocab_size = 64,
         .vocab_pad_multiple = 1},
    };
    const char *kinds[] = {"cublas", "fused"};
    int attn[] = {DT_PLAN_ATTENTION_CUBLAS, DT_PLAN_ATTENTION_FUSED};
    dt_dtype_t dtypes[] = {DT_DTYPE_BF16, DT_DTYPE_F32};
    for (int a = 0; a < 2; a++)
    for (int d = 0; d < 2; d++) {
        cr_assert_eq(setenv("DTRUN_CUDA_ATTENTION", kinds[a], 1), 0);
        dt_device_opts_t o = {.kind = DT_DEVICE_CUDA, .nthreads = 1, .dtype = dtypes[d]};
        dt_device_t *dev;
        cr_assert_eq(dt_device_open(&dev, &o), DT_STATUS_OK, "%s", dt_error_detail());
        for (size_t i = 0; i < sizeof specs / sizeof *specs; i++)
            for (int B = 1; B <= 5; B += 2) {
                dt_model_layout l;
                cr_assert_eq(dt_model_layout_init(&specs[i], &l), DT_STATUS_OK);
                dt_plan_model m;
                cr_assert_eq(dt_plan_model_from_layout(&l, &m), DT_STATUS_OK);
                double want = (double)dt_net_arena_bytes(dev, &l, B);
                double got = dt_plan_activation_bytes(&m, B, (int)dt_dtype_size(dtypes[d]), attn[a], 0);
                cr_assert_eq(got, want, "%s, %s attention, spec %zu, B %d: plan %.0f, net.c %.0f",
                             dt_dtype_name(dtypes[d]), kinds[a], i, B, got, want);
                dt_plan_model_free(&m);
                dt_model_layout_free(&l);
            }
        dt_device_free(dev);
    }
}
