/*
 * test_recompute.c - activation recomputation (model.h: dt_model_recompute_t) on
 * CPU nets of gpt and llama: losses and gradients with each policy (selective, full,
 * full every 2) equal, bitwise, those without, over two accumulated micro-steps and
 * for the two chunks of a stage layout; the arena's bytes per policy by hand; the
 * hooks a recomputed block adds inside the backward.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "kernels/kernels.h"
#include "runtime/model/model.h"
#include "runtime/model/net.h"
#include "runtime/tools/plan.h"

enum { T = 8, B = 2, NL = 3 };

static void set(dt_model_spec *s, const char *path, double v) {
    const dt_model_key *k = dt_model_key_find(s->ops, path);
    cr_assert_not_null(k, "no key %s", path);
    dt_model_key_set(s, k, v);
}

/* gpt: C 16, 2 heads, 3 layers; llama: hidden 16, 4 heads (2 key/value), 3 layers,
 * intermediate 24, untied head. Vocabulary 50 padded to 64. */
static dt_model_spec spec_of(int llama) {
    dt_model_spec s = {.ops = llama ? &dt_model_llama : &dt_model_gpt, .seq_len = T, .vocab_size = 50,
                       .vocab_pad_multiple = 64};
    if (!llama) {
        s.n_layer = NL, s.n_head = 2, s.n_embd = 16;
        return s;
    }
    set(&s, "model.hidden_size", 16);
    set(&s, "model.num_hidden_layers", NL);
    set(&s, "model.num_attention_heads", 4);
    set(&s, "model.num_key_value_heads", 2);
    set(&s, "model.intermediate_size", 24);
    set(&s, "model.max_position_embeddings", 64);
    set(&s, "model.rope_theta", 10000);
    set(&s, "model.rms_norm_eps", 1e-6);
    return s;
}

typedef struct run_out {
    double loss[2];
    float *grads;
    size_t n;
} run_out;

static void batch_of(int step, int32_t *tok, int32_t *tgt) {
    dt_rng r;
    dt_rng_seed(&r, 11, (uint64_t)step);
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)dt_rng_below(&r, 50), tgt[i] = (int32_t)dt_rng_below(&r, 50);
}

/* Two forward+backward micro-steps (gradients accumulate) of the whole model. */
static run_out run_whole(int llama, dt_model_recompute_t policy, int every) {
    dt_device_t *dev;
    cr_assert_eq(dt_device_init(&dev, DT_DEVICE_CPU, 1), DT_STATUS_OK, "%s", dt_error_detail());
    dt_model_spec s = spec_of(llama);
    dt_model_layout lay;
    cr_assert_eq(dt_model_layout_init(&s, &lay), DT_STATUS_OK, "%s", dt_error_detail());
    dt_model_layout_set_recompute(&lay, policy, every);
    dt_net_t net;
    cr_assert_eq(dt_net_init(&net, dev, &lay, B), DT_STATUS_OK, "%s", dt_error_detail());
    float *params = calloc(lay.n_params, sizeof(float));
    run_out r = {.grads = calloc(lay.n_params, sizeof(float)), .n = lay.n_params};
    dt_model_init_params(&lay, 5, params);
    dt_net_bind(&net, params, r.grads);
    for (int step = 0; step < 2; step++) {
        int32_t tok[B * T], tgt[B * T];
        batch_of(step, tok, tgt);
        dt_batch b = {.tokens = tok, .targets = tgt};
        cr_assert_eq(dt_net_forward(&net, &b, &r.loss[step]), DT_STATUS_OK, "%s", dt_error_detail());
        cr_assert_eq(dt_net_backward(&net, 1.0f / (B * T)), DT_STATUS_OK, "%s", dt_error_detail());
    }
    dt_net_free(&net);
    dt_model_layout_free(&lay);
    dt_device_free(dev);
    free(params);
    return r;
}

static void expect_equal(run_out a, run_out b, const char *what) {
    cr_assert_eq(a.n, b.n);
    for (int i = 0; i < 2; i++)
        cr_assert(memcmp(&a.loss[i], &b.loss[i], sizeof(double)) == 0, "%s: loss %d %.17g vs %.17g", what, i,
                  a.loss[i], b.loss[i]);
    size_t diff = 0;
    for (size_t i = 0; i < a.n; i++) diff += memcmp(&a.grads[i], &b.grads[i], sizeof(float)) != 0;
    cr_assert_eq(diff, 0, "%s: %zu of %zu gradients differ", what, diff, a.n);
    free(a.grads), free(b.grads);
}

static void policies_equal(int llama) {
    const struct {
        dt_model_recompute_t p;
        int every;
        const char *name;
    } cases[] = {{DT_MODEL_RECOMPUTE_SELECTIVE, 1, "selective"},
                 {DT_MODEL_RECOMPUTE_FULL, 1, "full"},
                 {DT_MODEL_RECOMPUTE_FULL, 2, "full every 2"},
                 {DT_MODEL_RECOMPUTE_SELECTIVE, 2, "selective every 2"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        expect_equal(run_whole(llama, DT_MODEL_RECOMPUTE_NONE, 1), run_whole(llama, cases[c].p, cases[c].every),
                     cases[c].name);
}

Test(recompute, gpt_each_policy_bitwise) { policies_equal(0); }
Test(recompute, llama_each_policy_bitwise) { policies_equal(1); }

/* ---- a stage layout: two chunks of one rank, one arena each ---------------- */

/* Two pipeline ranks' stage layouts (blocks 0 | 1-2 of the 3) run in one process:
 * stage 0's forward, its output copied into stage 1's input, stage 1's forward (the
 * loss) and backward, its input gradient copied to stage 0, stage 0's backward. The
 * gradients of both stages, one after the other. */
static run_out run_chunks(int llama, dt_model_recompute_t policy) {
    dt_device_t *dev;
    cr_assert_eq(dt_device_init(&dev, DT_DEVICE_CPU, 1), DT_STATUS_OK, "%s", dt_error_detail());
    dt_model_spec s = spec_of(llama);
    int bounds[3] = {0, 1, NL};
    dt_model_layout lay[2];
    dt_net_t net[2];
    float *params[2];
    run_out r = {0};
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(dt_model_layout_init_stage(&s, 1, 0, 0, 2, k, 1, bounds, &lay[k]), DT_STATUS_OK, "%s",
                     dt_error_detail());
        dt_model_layout_set_recompute(&lay[k], policy, 1);
        cr_assert_eq(dt_net_init(&net[k], dev, &lay[k], B), DT_STATUS_OK, "%s", dt_error_detail());
        r.n += lay[k].n_params;
    }
    r.grads = calloc(r.n, sizeof(float));
    for (int k = 0; k < 2; k++) {
        params[k] = calloc(lay[k].n_params, sizeof(float));
        dt_model_init_range(&lay[k], 5, 0, lay[k].n_params, params[k]);
        dt_net_bind(&net[k], params[k], r.grads + (k ? lay[0].n_params : 0));
    }
    /* gpt's head is tied: stage 1 gets a copy of the embedding's rows */
    float *head_dw = NULL;
    if (lay[1].has_tied_copy) {
        net[1].head_w = params[0];
        head_dw = calloc(lay[0].tensors[0].numel, sizeof(float));
        net[1].head_dw = head_dw;
    }
    size_t bytes = dt_net_stage_elems(&net[0]) * sizeof(float);
    int32_t tok[B * T], tgt[B * T];
    batch_of(0, tok, tgt);
    dt_batch b = {.tokens = tok, .targets = tgt};
    double nan_loss;
    cr_assert_eq(dt_net_forward(&net[0], &b, &nan_loss), DT_STATUS_OK, "%s", dt_error_detail());
    memcpy(dt_net_stage_buf(&net[1], DT_NET_STAGE_IN), dt_net_stage_buf(&net[0], DT_NET_STAGE_OUT), bytes);
    cr_assert_eq(dt_net_forward(&net[1], &b, &r.loss[0]), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(dt_net_backward(&net[1], 1.0f / (B * T)), DT_STATUS_OK, "%s", dt_error_detail());
    memcpy(dt_net_stage_buf(&net[0], DT_NET_STAGE_DOUT), dt_net_stage_buf(&net[1], DT_NET_STAGE_DIN), bytes);
    cr_assert_eq(dt_net_backward(&net[0], 0), DT_STATUS_OK, "%s", dt_error_detail());
    r.loss[1] = r.loss[0];
    for (int k = 0; k < 2; k++) {
        dt_net_free(&net[k]);
        dt_model_layout_free(&lay[k]);
        free(params[k]);
    }
    free(head_dw);
    dt_device_free(dev);
    return r;
}

Test(recompute, stage_chunks_bitwise) {
    for (int llama = 0; llama < 2; llama++) {
        expect_equal(run_chunks(llama, DT_MODEL_RECOMPUTE_NONE), run_chunks(llama, DT_MODEL_RECOMPUTE_FULL),
                     "chunks full");
        expect_equal(run_chunks(llama, DT_MODEL_RECOMPUTE_NONE), run_chunks(llama, DT_MODEL_RECOMPUTE_SELECTIVE),
                     "chunks selective");
    }
}

/* ---- the arena by hand ----------------------------------------------------- */

static size_t arena_of(int llama, dt_model_recompute_t policy, int every) {
    dt_device_t *dev;
    cr_assert_eq(dt_device_init(&dev, DT_DEVICE_CPU, 1), DT_STATUS_OK);
    dt_model_spec s = spec_of(llama);
    dt_model_layout lay;
    cr_assert_eq(dt_model_layout_init(&s, &lay), DT_STATUS_OK);
    dt_model_layout_set_recompute(&lay, policy, every);
    size_t n = dt_net_arena_bytes(dev, &lay, B);
    dt_model_layout_free(&lay);
    dt_device_free(dev);
    return n;
}

/* gpt, B 2, T 8, C 16, 2 heads, fp32 (each slot a multiple of 64 bytes already):
 * a block's set is ln1, atty, attention probabilities (B*NH*T*T*4), attproj, res2,
 * ln2, fcproj, res3 of 1024 bytes, qkv 3072, fch and fch_gelu 4096, four norm
 * statistics of 64: 19712. selective keeps qkv, res2, fch, res3 (9216), full res3
 * (1024); the scratch set is the rest of one block. */
Test(recompute, gpt_arena_bytes_by_hand) {
    size_t none = arena_of(0, DT_MODEL_RECOMPUTE_NONE, 1), once = none - NL * 19712;
    cr_assert_eq(arena_of(0, DT_MODEL_RECOMPUTE_FULL, 1), once + NL * 1024 + (19712 - 1024));
    cr_assert_eq(arena_of(0, DT_MODEL_RECOMPUTE_SELECTIVE, 1), once + NL * 9216 + (19712 - 9216));
    /* every 2: blocks 0 and 2 checkpointed, block 1 whole */
    cr_assert_eq(arena_of(0, DT_MODEL_RECOMPUTE_FULL, 2), once + 2 * 1024 + 19712 + (19712 - 1024));
    cr_assert_eq(arena_of(0, DT_MODEL_RECOMPUTE_FULL, 3), once + 1024 + 2 * 19712 + (19712 - 1024));
}

/* llama, B 2, T 8, hidden 16, 4 heads of 4 (2 key/value), intermediate 24: ln1,
 * attproj, res2, ln2, fcproj, res3 1024 each; atty 1024; probabilities
 * B*4*T*T*4 = 2048; qkv (4+4)*4 = 32 wide: 2048; gate|up 48 wide: 3072; swiglu 24 wide:
 * 1536; two rstd 64: 6*1024 + 1024 + 2048 + 2048 + 3072 + 1536 + 128 = 16000.
 * selective keeps qkv, res2, gate|up, res3: 2048 + 1024 + 3072 + 1024 = 7168. */
Test(recompute, llama_arena_bytes_by_hand) {
    size_t none = arena_of(1, DT_MODEL_RECOMPUTE_NONE, 1), once = none - NL * 16000;
    cr_assert_eq(arena_of(1, DT_MODEL_RECOMPUTE_FULL, 1), once + NL * 1024 + (16000 - 1024));
    cr_assert_eq(arena_of(1, DT_MODEL_RECOMPUTE_SELECTIVE, 1), once + NL * 7168 + (16000 - 7168));
}

/* ---- hooks ----------------------------------------------------------------- */

typedef struct trace {
    int n;
    int unit[256], phase[256];
} trace;

static void record(void *ctx, int unit, dt_net_phase_t phase) {
    trace *t = ctx;
    if (t->n < 256) t->unit[t->n] = unit, t->phase[t->n++] = (int)phase;
}

/* full every 2 on gpt (units: 0 embeddings, 1-3 blocks, 4 final norm): the backward
 * brackets blocks 0 and 2 (units 1 and 3) with FWD_PRE/FWD_POST just before their
 * BWD_PRE; block 1 (unit 2) has no recompute. */
Test(recompute, hooks_around_the_recompute) {
    dt_device_t *dev;
    cr_assert_eq(dt_device_init(&dev, DT_DEVICE_CPU, 1), DT_STATUS_OK);
    dt_model_spec s = spec_of(0);
    dt_model_layout lay;
    cr_assert_eq(dt_model_layout_init(&s, &lay), DT_STATUS_OK);
    dt_model_layout_set_recompute(&lay, DT_MODEL_RECOMPUTE_FULL, 2);
    dt_net_t net;
    cr_assert_eq(dt_net_init(&net, dev, &lay, B), DT_STATUS_OK);
    float *params = calloc(lay.n_params, sizeof(float)), *grads = calloc(lay.n_params, sizeof(float));
    dt_model_init_params(&lay, 5, params);
    dt_net_bind(&net, params, grads);
    trace tr = {0};
    int32_t tok[B * T], tgt[B * T];
    batch_of(0, tok, tgt);
    dt_batch b = {.tokens = tok, .targets = tgt};
    double loss;
    cr_assert_eq(dt_net_forward(&net, &b, &loss), DT_STATUS_OK);
    net.hook = record, net.hook_ctx = &tr;
    cr_assert_eq(dt_net_backward(&net, 1.0f), DT_STATUS_OK);
    enum { FP = DT_NET_FWD_PRE, FQ = DT_NET_FWD_POST, BP = DT_NET_BWD_PRE, BQ = DT_NET_BWD_POST };
    const int want_u[] = {0, 4, 4, 3, 3, 3, 3, 2, 2, 1, 1, 1, 1, 0};
    const int want_p[] = {BP, BP, BQ, FP, FQ, BP, BQ, BP, BQ, FP, FQ, BP, BQ, BQ};
    cr_assert_eq(tr.n, 14, "%d hook calls", tr.n);
    for (int i = 0; i < 14; i++)
        cr_assert(tr.unit[i] == want_u[i] && tr.phase[i] == want_p[i], "call %d: unit %d phase %d", i, tr.unit[i],
                  tr.phase[i]);
    dt_net_free(&net);
    dt_model_layout_free(&lay);
    dt_device_free(dev);
    free(params), free(grads);
}

/* ---- dtrun plan's formula equals the arena, byte for byte ------------------- */

/* Each policy and every 1..3, gpt and llama, the whole model and each stage of a
 * 2-stage cut (blocks 0 | 1-2: the stages' largest chunks differ). */
Test(recompute, plan_equals_the_arena_per_policy) {
    dt_device_t *dev;
    cr_assert_eq(dt_device_init(&dev, DT_DEVICE_CPU, 1), DT_STATUS_OK);
    int checked = 0;
    for (int llama = 0; llama < 2; llama++)
        for (int p = DT_MODEL_RECOMPUTE_NONE; p <= DT_MODEL_RECOMPUTE_FULL; p++)
            for (int every = 1; every <= 3; every++)
                for (int stage = -1; stage < 2; stage++) {
                    dt_model_spec s = spec_of(llama);
                    int bounds[3] = {0, 1, NL};
                    dt_model_layout lay;
                    dt_status_t st = stage < 0 ? dt_model_layout_init(&s, &lay)
                                               : dt_model_layout_init_stage(&s, 1, 0, 0, 2, stage, 1, bounds, &lay);
                    cr_assert_eq(st, DT_STATUS_OK, "%s", dt_error_detail());
                    dt_model_layout_set_recompute(&lay, (dt_model_recompute_t)p, every);
                    dt_plan_model m;
                    cr_assert_eq(dt_plan_model_from_layout(&lay, &m), DT_STATUS_OK);
                    m.n_layer = dt_model_max_chunk_blocks(&lay); /* what a stage's view holds */
                    m.pp_no_first = !dt_model_has_first(&lay);
                    m.pp_no_head = !dt_model_has_last(&lay);
                    m.recompute_every = every;
                    double want = (double)dt_net_arena_bytes(dev, &lay, B);
                    double got = dt_plan_activation_bytes(&m, B, 4, 1, p);
                    cr_assert_eq(got, want, "llama %d policy %d every %d stage %d: plan %.0f, arena %.0f", llama, p,
                                 every, stage, got, want);
                    dt_plan_model_free(&m);
                    dt_model_layout_free(&lay);
                    checked++;
                }
    cr_assert_eq(checked, 54);
    dt_device_free(dev);
}

/* The recompute cost: full with every block is a forward more (x 4/3), every 3 of 3
 * blocks a third of that; selective the attention core's forward only. */
Test(recompute, plan_recompute_cost) {
    dt_model_spec s = spec_of(0);
    dt_model_layout lay;
    cr_assert_eq(dt_model_layout_init(&s, &lay), DT_STATUS_OK);
    dt_plan_model m;
    cr_assert_eq(dt_plan_model_from_layout(&lay, &m), DT_STATUS_OK);
    cr_assert_float_eq(dt_plan_recompute_factor(&m, DT_MODEL_RECOMPUTE_FULL), 4.0 / 3.0, 1e-12);
    cr_assert_eq(dt_plan_recompute_factor(&m, DT_MODEL_RECOMPUTE_NONE), 1.0);
    double sel = dt_plan_recompute_factor(&m, DT_MODEL_RECOMPUTE_SELECTIVE);
    cr_assert_float_eq(sel, 1.0 + NL * 4.0 * 16 * T / m.flops_per_token, 1e-12);
    m.recompute_every = 3;
    cr_assert_float_eq(dt_plan_recompute_factor(&m, DT_MODEL_RECOMPUTE_FULL), 1.0 + 1.0 / 9.0, 1e-12);
    dt_plan_model_free(&m);
    dt_model_layout_free(&lay);
}
