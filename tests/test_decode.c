/*
 * test_decode.c - KV-cache decoding (net.h's decode net, the models' decode slots)
 * and the sampler over it (sample.h) on the CPU device: the logits of every
 * position decoded one at a time equal the full forward's; greedy and seeded
 * sampling give the same ids with and without the cache, also past seq_len where
 * the context slides; the cost is counted in positions computed (linear with the
 * cache, seq_len per token without); a device without attention_decode falls back.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "kernels/kernels.h"
#include "runtime/model/model.h"
#include "runtime/model/net.h"
#include "runtime/model/sample.h"

/* The models with a decode path, small, seq_len 24, vocab 50 (padded to 64). */
static dt_model_spec gpt_spec(void) {
    return (dt_model_spec){.ops = &dt_model_gpt, .n_layer = 2, .n_head = 4, .n_embd = 32, .seq_len = 24,
                           .vocab_size = 50, .vocab_pad_multiple = 64};
}

static void set(dt_model_spec *s, const char *path, double v) {
    const dt_model_key *k = dt_model_key_find(s->ops, path);
    cr_assert_not_null(k, "no key %s", path);
    dt_model_key_set(s, k, v);
}

/* llama: 4 query heads of 8, kv heads as asked (GQA), q/k/v biases and tying as
 * asked, RoPE with llama3 scaling over a short original context (every band). */
static dt_model_spec llama_spec(int nkv, int tied, int bias) {
    dt_model_spec s = {.ops = &dt_model_llama, .seq_len = 24, .vocab_size = 50, .vocab_pad_multiple = 64};
    set(&s, "model.hidden_size", 32);
    set(&s, "model.num_hidden_layers", 2);
    set(&s, "model.num_attention_heads", 4);
    set(&s, "model.num_key_value_heads", nkv);
    set(&s, "model.intermediate_size", 48);
    set(&s, "model.max_position_embeddings", 64);
    set(&s, "model.rope_theta", 500000);
    set(&s, "model.rms_norm_eps", 1e-5);
    set(&s, "model.tie_word_embeddings", tied);
    set(&s, "model.attention_bias", bias);
    set(&s, "model.rope_scaling.factor", 8);
    set(&s, "model.rope_scaling.low_freq_factor", 1);
    set(&s, "model.rope_scaling.high_freq_factor", 4);
    set(&s, "model.rope_scaling.original_max_position_embeddings", 8);
    return s;
}

typedef struct fixture {
    dt_device_t *dev;
    dt_model_layout lay;
    float *params; /* host */
} fixture;

/* Parameters normal(0, 0.3) (LayerNorm weights 1 + that): logits far from uniform,
 * so argmaxes are not near-ties that rounding could flip. */
static void setup(fixture *f, dt_model_spec spec) {
    cr_assert_eq(dt_device_init(&f->dev, DT_DEVICE_CPU, 1), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(dt_model_layout_init(&spec, &f->lay), DT_STATUS_OK, "%s", dt_error_detail());
    f->params = calloc(f->lay.n_params, sizeof(float));
    dt_rng rng;
    dt_rng_seed(&rng, 11, 0);
    for (size_t i = 0; i < f->lay.n_params; i++) f->params[i] = (float)(0.3 * dt_rng_normal(&rng));
    for (int t = 0; t < f->lay.n_tensors; t++)
        if (f->lay.tensors[t].init == DT_MODEL_INIT_ONE) /* norm weights */
            for (size_t i = 0; i < f->lay.tensors[t].numel; i++) f->params[f->lay.tensors[t].offset + i] += 1.0f;
}

static void teardown(fixture *f) {
    dt_model_layout_free(&f->lay);
    dt_device_free(f->dev);
    free(f->params);
}

static void random_tokens(int32_t *t, int n, int V, uint64_t seed) {
    dt_rng rng;
    dt_rng_seed(&rng, seed, 1);
    for (int i = 0; i < n; i++) t[i] = (int32_t)dt_rng_below(&rng, (uint64_t)V);
}

/* Decoding positions 0..T-1 one at a time gives, at each, the full forward's row. */
static void check_decode_equals_forward(dt_model_spec spec) {
    fixture f;
    setup(&f, spec);
    int T = f.lay.seq_len, Vp = f.lay.vocab_padded, V = spec.vocab_size;
    cr_assert(dt_net_can_decode(f.dev, &f.lay));
    dt_net_t full, dec;
    cr_assert_eq(dt_net_init(&full, f.dev, &f.lay, 1), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(dt_net_decode_init(&dec, f.dev, &f.lay), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert(dec.arena_bytes < full.arena_bytes, "decode arena %zu vs full %zu", dec.arena_bytes, full.arena_bytes);
    dt_net_bind(&full, f.params, NULL);
    dt_net_bind(&dec, f.params, NULL);
    int32_t *tok = calloc((size_t)T, sizeof *tok);
    random_tokens(tok, T, V, 5);
    float *want = calloc((size_t)T * Vp, sizeof *want), *got = calloc((size_t)Vp, sizeof *got);
    cr_assert_eq(dt_net_logits_rows(&full, tok, 0, 0, T, want), DT_STATUS_OK, "%s", dt_error_detail());
    double worst = 0, spread = 0;
    for (int p = 0; p < T; p++) {
        cr_assert_eq(dt_net_decode(&dec, tok[p], p, got), DT_STATUS_OK, "%s", dt_error_detail());
        for (int v = 0; v < V; v++) {
            double d = fabs((double)got[v] - want[(size_t)p * Vp + v]);
            if (d > worst) worst = d;
            spread = fmax(spread, fabs(want[(size_t)p * Vp + v]));
        }
    }
    cr_assert(spread > 1.0, "logits this spread make the comparison mean something: %g", spread);
    cr_assert(worst < 1e-4, "decode vs full forward logits: max |diff| %g", worst);
    cr_assert_eq(dec.rows_run, (uint64_t)T);
    /* Re-decoding from position 3 with other tokens overwrites the cache rows. */
    int32_t *tok2 = calloc((size_t)T, sizeof *tok2);
    memcpy(tok2, tok, (size_t)T * sizeof *tok2);
    random_tokens(tok2 + 3, T - 3, V, 6);
    cr_assert_eq(dt_net_logits_rows(&full, tok2, 0, 0, T, want), DT_STATUS_OK);
    worst = 0;
    for (int p = 3; p < T; p++) {
        cr_assert_eq(dt_net_decode(&dec, tok2[p], p, got), DT_STATUS_OK);
        for (int v = 0; v < V; v++) worst = fmax(worst, fabs((double)got[v] - want[(size_t)p * Vp + v]));
    }
    cr_assert(worst < 1e-4, "decode after rewinding to position 3: max |diff| %g", worst);
    /* Bad positions and tokens are errors, not reads past the cache. */
    cr_assert_eq(dt_net_decode(&dec, 1, T, got), DT_STATUS_INVALID);
    cr_assert(strstr(dt_error_detail(), "outside the context"), "%s", dt_error_detail());
    cr_assert_eq(dt_net_decode(&dec, Vp, 0, got), DT_STATUS_INVALID);
    cr_assert_eq(dt_net_decode(&full, 1, 0, got), DT_STATUS_INVALID);
    dt_batch b = {.tokens = tok, .targets = tok};
    double loss;
    cr_assert_eq(dt_net_forward(&dec, &b, &loss), DT_STATUS_INVALID);
    free(tok), free(tok2), free(want), free(got);
    dt_net_free(&full);
    dt_net_free(&dec);
    teardown(&f);
}

Test(decode, gpt_decode_logits_equal_the_full_forward_at_every_position) { check_decode_equals_forward(gpt_spec()); }
Test(decode, llama_gqa_decode_logits_equal_the_full_forward_at_every_position) {
    check_decode_equals_forward(llama_spec(2, 0, 0));
}
Test(decode, llama_mqa_biases_tied_decode_logits_equal_the_full_forward) {
    check_decode_equals_forward(llama_spec(1, 1, 1));
}

/* Same ids with and without the cache: greedy and seeded, short and sliding. */
static void check_sampler_paths(dt_model_spec spec) {
    fixture f;
    setup(&f, spec);
    int T = f.lay.seq_len, V = spec.vocab_size;
    dt_sample_net s;
    cr_assert_eq(dt_sample_net_init(&s, f.dev, &f.lay, f.params, DT_MEM_OTHER), DT_STATUS_OK, "%s",
                 dt_error_detail());
    cr_assert(s.have_dec, "the model and CPU decode");
    int32_t prompt[40];
    random_tokens(prompt, 40, V, 9);
    int32_t a[128], b[128];
    struct {
        int n_prompt, tokens;
        double temperature;
    } cases[] = {{1, 10, 0}, {5, T - 5, 0}, {7, 3 * T, 0}, {40, 12, 0}, {4, 2 * T, 1.0}, {3, 15, 0.7}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        dt_sample_opts o = {.tokens = cases[c].tokens, .temperature = cases[c].temperature, .seed = 3 + c};
        cr_assert_eq(dt_sample_run(&s, prompt, cases[c].n_prompt, &o, a), DT_STATUS_OK, "%s", dt_error_detail());
        o.no_cache = 1;
        cr_assert_eq(dt_sample_run(&s, prompt, cases[c].n_prompt, &o, b), DT_STATUS_OK, "%s", dt_error_detail());
        for (int i = 0; i < o.tokens; i++)
            cr_assert_eq(a[i], b[i], "case %zu (prompt %d, %d tokens, temperature %g): id %d: cached %d, full %d", c,
                         cases[c].n_prompt, o.tokens, o.temperature, i, a[i], b[i]);
        int distinct = 0;
        for (int i = 0; i < o.tokens; i++) {
            int seen = 0;
            for (int j = 0; j < i; j++) seen |= a[j] == a[i];
            distinct += !seen;
        }
        cr_assert(o.tokens < 10 || distinct >= 3, "case %zu: %d distinct ids: the comparison tests little", c,
                  distinct);
    }
    /* The logits of the prompt positions, both paths. */
    float *la = calloc((size_t)6 * V, sizeof *la), *lb = calloc((size_t)6 * V, sizeof *lb);
    dt_sample_opts o = {.tokens = 0, .prompt_logits = la};
    cr_assert_eq(dt_sample_run(&s, prompt, 6, &o, a), DT_STATUS_OK);
    o.prompt_logits = lb, o.no_cache = 1;
    cr_assert_eq(dt_sample_run(&s, prompt, 6, &o, a), DT_STATUS_OK);
    for (int i = 0; i < 6 * V; i++) cr_assert(fabsf(la[i] - lb[i]) < 1e-4, "prompt logit %d: %g vs %g", i, la[i], lb[i]);
    free(la), free(lb);
    dt_sample_net_free(&s);
    teardown(&f);
}

Test(decode, gpt_sampling_with_the_cache_gives_the_ids_of_full_forwards) { check_sampler_paths(gpt_spec()); }
Test(decode, llama_sampling_with_the_cache_gives_the_ids_of_full_forwards) {
    check_sampler_paths(llama_spec(2, 0, 1));
}

/* Positions computed: n_prompt + n - 1 with the cache (one per new token), n full
 * forwards of seq_len without; past seq_len each token is a forward again. */
static void check_linear_cost(dt_model_spec spec) {
    fixture f;
    setup(&f, spec);
    int T = f.lay.seq_len;
    int32_t prompt[4] = {1, 2, 3, 4}, out[128];
    for (int n = 1; n <= T - 4; n += 5) {
        dt_sample_net s;
        cr_assert_eq(dt_sample_net_init(&s, f.dev, &f.lay, f.params, DT_MEM_OTHER), DT_STATUS_OK);
        dt_sample_opts o = {.tokens = n, .temperature = 0};
        cr_assert_eq(dt_sample_run(&s, prompt, 4, &o, out), DT_STATUS_OK);
        cr_assert_eq(dt_sample_rows_run(&s), (uint64_t)(4 + n - 1), "%d tokens: %llu positions", n,
                     (unsigned long long)dt_sample_rows_run(&s));
        cr_assert(!s.have_net, "no full net made while the context fits");
        uint64_t cached = dt_sample_rows_run(&s);
        o.no_cache = 1;
        cr_assert_eq(dt_sample_run(&s, prompt, 4, &o, out), DT_STATUS_OK);
        cr_assert_eq(dt_sample_rows_run(&s) - cached, (uint64_t)n * (uint64_t)T);
        dt_sample_net_free(&s);
    }
    /* Past the context: T - 4 tokens by the cache, then one forward per token. */
    dt_sample_net s;
    cr_assert_eq(dt_sample_net_init(&s, f.dev, &f.lay, f.params, DT_MEM_OTHER), DT_STATUS_OK);
    int n = T + 10;
    dt_sample_opts o = {.tokens = n, .temperature = 0};
    cr_assert_eq(dt_sample_run(&s, prompt, 4, &o, out), DT_STATUS_OK);
    /* the prompt, then one decode for each of the first T-4 new tokens (filling the
     * context), then a forward for each later one but the last (never computed on) */
    uint64_t fits = (uint64_t)T - 4;
    uint64_t want = 4 + fits + ((uint64_t)n - 1 - fits) * (uint64_t)T;
    cr_assert_eq(dt_sample_rows_run(&s), want, "%llu vs %llu", (unsigned long long)dt_sample_rows_run(&s),
                 (unsigned long long)want);
    dt_sample_net_free(&s);
    teardown(&f);
}

Test(decode, gpt_generation_cost_is_one_position_per_token) { check_linear_cost(gpt_spec()); }
Test(decode, llama_generation_cost_is_one_position_per_token) { check_linear_cost(llama_spec(2, 1, 0)); }

/* A device without attention_decode samples by full forwards, with the same ids. */
Test(decode, device_without_attention_decode_falls_back_to_full_forwards) {
    fixture f;
    setup(&f, gpt_spec());
    int32_t prompt[3] = {7, 8, 9}, a[20], b[20];
    dt_sample_net s;
    dt_sample_opts o = {.tokens = 20, .temperature = 0};
    cr_assert_eq(dt_sample_net_init(&s, f.dev, &f.lay, f.params, DT_MEM_OTHER), DT_STATUS_OK);
    cr_assert_eq(dt_sample_run(&s, prompt, 3, &o, a), DT_STATUS_OK);
    dt_sample_net_free(&s);
    const dt_ops_t *real = f.dev->ops;
    dt_ops_t no_decode = *real;
    no_decode.attention_decode = NULL;
    f.dev->ops = &no_decode;
    cr_assert(!dt_net_can_decode(f.dev, &f.lay));
    dt_net_t dec;
    cr_assert_eq(dt_net_decode_init(&dec, f.dev, &f.lay), DT_STATUS_UNSUPPORTED);
    cr_assert(strstr(dt_error_detail(), "attention_decode"), "%s", dt_error_detail());
    cr_assert_eq(dt_sample_net_init(&s, f.dev, &f.lay, f.params, DT_MEM_OTHER), DT_STATUS_OK);
    cr_assert(!s.have_dec);
    cr_assert_eq(dt_sample_run(&s, prompt, 3, &o, b), DT_STATUS_OK);
    cr_assert_eq(dt_sample_rows_run(&s), (uint64_t)20 * f.lay.seq_len);
    cr_assert(memcmp(a, b, sizeof a) == 0, "same greedy ids by full forwards");
    dt_sample_net_free(&s);
    f.dev->ops = real;
    teardown(&f);
}

/* mlp has no logits and no decode path. */
Test(decode, models_without_decode_say_so) {
    dt_model_spec spec = {.ops = &dt_model_mlp, .in_dim = 4, .hidden_dim = 8, .n_hidden_layers = 1, .n_classes = 3};
    dt_model_layout l;
    dt_device_t *dev;
    cr_assert_eq(dt_device_init(&dev, DT_DEVICE_CPU, 1), DT_STATUS_OK);
    cr_assert_eq(dt_model_layout_init(&spec, &l), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert(!dt_net_can_decode(dev, &l));
    dt_net_t dec;
    cr_assert_eq(dt_net_decode_init(&dec, dev, &l), DT_STATUS_UNSUPPORTED);
    cr_assert(strstr(dt_error_detail(), "mlp"), "%s", dt_error_detail());
    dt_model_layout_free(&l);
    dt_device_free(dev);
}
