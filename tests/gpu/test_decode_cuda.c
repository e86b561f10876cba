/*
 * test_decode_cuda.c - KV-cache decoding of whole models on the CUDA device (real
 * GPU or the emulator): gpt and llama (GQA; MQA with q/k/v biases and a tied head)
 * decoded one position at a time on the GPU give the CPU full forward's logits at
 * every position, and the GPU sampler gives the same greedy ids with and without
 * its cache at one position per token. Skips without a CUDA device.
 */
#include <math.h>

#include "common/rng.h"
#include "runtime/model/model.h"
#include "runtime/model/net.h"
#include "runtime/model/sample.h"
#include "tests/gpu/gpu_fixture.h"

enum { SEQ = 20, VOCAB = 50 };

static void set(dt_model_spec *s, const char *path, double v) {
    const dt_model_key *k = dt_model_key_find(s->ops, path);
    cr_assert_not_null(k, "no key %s", path);
    dt_model_key_set(s, k, v);
}

static dt_model_spec gpt_spec(void) {
    return (dt_model_spec){.ops = &dt_model_gpt, .n_layer = 2, .n_head = 4, .n_embd = 32, .seq_len = SEQ,
                           .vocab_size = VOCAB, .vocab_pad_multiple = 64};
}

static dt_model_spec llama_spec(int nkv, int tied, int bias) {
    dt_model_spec s = {.ops = &dt_model_llama, .seq_len = SEQ, .vocab_size = VOCAB, .vocab_pad_multiple = 64};
    set(&s, "model.hidden_size", 32);
    set(&s, "model.num_hidden_layers", 2);
    set(&s, "model.num_attention_heads", 4);
    set(&s, "model.num_key_value_heads", nkv);
    set(&s, "model.intermediate_size", 48);
    set(&s, "model.max_position_embeddings", 64);
    set(&s, "model.rope_theta", 10000);
    set(&s, "model.rms_norm_eps", 1e-5);
    set(&s, "model.tie_word_embeddings", tied);
    set(&s, "model.attention_bias", bias);
    return s;
}

/* Random parameters, normal(0, 0.3), norm weights around 1. */
static float *random_params(const dt_model_layout *l) {
    float *p = calloc(l->n_params, sizeof *p);
    dt_rng rng;
    dt_rng_seed(&rng, 21, 0);
    for (size_t i = 0; i < l->n_params; i++) p[i] = (float)(0.3 * dt_rng_normal(&rng));
    for (int t = 0; t < l->n_tensors; t++)
        if (l->tensors[t].init == DT_MODEL_INIT_ONE)
            for (size_t i = 0; i < l->tensors[t].numel; i++) p[l->tensors[t].offset + i] += 1.0f;
    return p;
}

static void check_model(dt_model_spec spec) {
    ctx_t x;
    ctx_open(&x, DT_DTYPE_F32);
    dt_model_layout l;
    cr_assert_eq(dt_model_layout_init(&spec, &l), DT_STATUS_OK, "%s", dt_error_detail());
    float *params = random_params(&l);
    int T = l.seq_len, Vp = l.vocab_padded;
    int32_t tok[SEQ];
    dt_rng rng;
    dt_rng_seed(&rng, 4, 0);
    for (int i = 0; i < T; i++) tok[i] = (int32_t)dt_rng_below(&rng, VOCAB);

    /* the CPU full forward: the reference */
    dt_net_t full;
    cr_assert_eq(dt_net_init(&full, x.cpu, &l, 1), DT_STATUS_OK, "%s", dt_error_detail());
    dt_net_bind(&full, params, NULL);
    float *want = calloc((size_t)T * Vp, sizeof *want), *got = calloc((size_t)Vp, sizeof *got);
    cr_assert_eq(dt_net_logits_rows(&full, tok, 0, 0, T, want), DT_STATUS_OK, "%s", dt_error_detail());
    dt_net_free(&full);

    /* the GPU decode net, through the sampler's setup */
    cr_assert(dt_net_can_decode(x.gpu, &l), "the CUDA device has attention_decode");
    dt_sample_net s;
    cr_assert_eq(dt_sample_net_init(&s, x.gpu, &l, params, DT_MEM_OTHER), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert(s.have_dec);
    double worst = 0;
    for (int p = 0; p < T; p++) {
        cr_assert_eq(dt_net_decode(&s.dec, tok[p], p, got), DT_STATUS_OK, "%s", dt_error_detail());
        for (int v = 0; v < VOCAB; v++) worst = fmax(worst, fabs((double)got[v] - want[(size_t)p * Vp + v]));
    }
    cr_assert(worst < 1e-3, "%s: GPU decode vs CPU full forward: max |diff| %g", spec.ops->name, worst);

    /* greedy ids, cached and not, on the GPU; the cache at one position per token */
    int32_t a[SEQ], b[SEQ], prompt[3] = {tok[0], tok[1], tok[2]};
    dt_sample_opts o = {.tokens = T - 3, .temperature = 0};
    uint64_t before = dt_sample_rows_run(&s);
    cr_assert_eq(dt_sample_run(&s, prompt, 3, &o, a), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(dt_sample_rows_run(&s) - before, (uint64_t)(3 + o.tokens - 1));
    o.no_cache = 1;
    cr_assert_eq(dt_sample_run(&s, prompt, 3, &o, b), DT_STATUS_OK, "%s", dt_error_detail());
    for (int i = 0; i < o.tokens; i++) cr_assert_eq(a[i], b[i], "%s: id %d: cached %d, full %d", spec.ops->name, i, a[i], b[i]);
    dt_sample_net_free(&s);
    free(want), free(got), free(params);
    dt_model_layout_free(&l);
    ctx_close(&x);
}

Test(decode_cuda, gpt) { check_model(gpt_spec()); }
Test(decode_cuda, llama_gqa) { check_model(llama_spec(2, 0, 0)); }
Test(decode_cuda, llama_mqa_biases_tied) { check_model(llama_spec(1, 1, 1)); }
