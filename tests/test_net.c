/*
 * test_net.c - whole-model forward/backward on the CPU device: loss at init,
 * gradients against central finite differences, overfitting one batch, hooks.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "kernels/kernels.h"
#include "runtime/model/model.h"
#include "runtime/model/net.h"

typedef struct fixture {
    dt_device_t *dev;
    dt_model_layout lay;
    dt_net_t net;
    float *params, *grads;
    int32_t *tok, *tgt;
    float *feat;
} fixture;

static void setup_model(fixture *f, const dt_model_spec *spec, int B) {
    cr_assert_eq(dt_device_init(&f->dev, DT_DEVICE_CPU, 1), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(dt_model_layout_init(spec, &f->lay), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(dt_net_init(&f->net, f->dev, &f->lay, B), DT_STATUS_OK, "%s", dt_error_detail());
    f->params = calloc(f->lay.n_params, sizeof(float));
    f->grads = calloc(f->lay.n_params, sizeof(float));
    dt_model_init_params(&f->lay, 7, f->params);
    dt_net_bind(&f->net, f->params, f->grads);
    int rows = f->net.n_rows;
    f->tok = calloc((size_t)rows, sizeof(int32_t));
    f->tgt = calloc((size_t)rows, sizeof(int32_t));
    dt_rng rng;
    dt_rng_seed(&rng, 99, 0);
    int V = spec->ops == &dt_model_gpt ? spec->vocab_size : spec->n_classes;
    for (int i = 0; i < rows; i++) {
        f->tok[i] = (int32_t)dt_rng_below(&rng, (uint64_t)(spec->ops == &dt_model_gpt ? V : 1));
        f->tgt[i] = (int32_t)dt_rng_below(&rng, (uint64_t)V);
    }
    if (spec->ops == &dt_model_mlp) {
        f->feat = calloc((size_t)B * (size_t)spec->in_dim, sizeof(float));
        for (int i = 0; i < B * spec->in_dim; i++) f->feat[i] = (float)dt_rng_normal(&rng);
    }
}

static void teardown_model(fixture *f) {
    dt_net_free(&f->net);
    dt_model_layout_free(&f->lay);
    dt_device_free(f->dev);
    free(f->params), free(f->grads), free(f->tok), free(f->tgt), free(f->feat);
}

static double loss_of(fixture *f) {
    dt_batch b = {.tokens = f->tok, .features = f->feat, .targets = f->tgt};
    double l;
    cr_assert_eq(dt_net_forward(&f->net, &b, &l), DT_STATUS_OK);
    f->net.have_forward = 0;
    return l;
}

static const dt_model_spec tiny_gpt = {.ops = &dt_model_gpt, .n_layer = 2, .n_head = 2, .n_embd = 8,
                                       .seq_len = 5, .vocab_size = 11, .vocab_pad_multiple = 16};

Test(net, gpt_loss_at_init_is_ln_vocab) {
    fixture f = {0};
    setup_model(&f, &tiny_gpt, 3);
    double l = loss_of(&f);
    cr_assert_float_eq(l, log(11.0), 0.05, "loss %g vs ln(11) %g", l, log(11.0));
    teardown_model(&f);
}

/* Central differences of the mean loss against the analytic gradient, for every
 * parameter of the small tensors and a sample of the large ones. */
static void gradcheck(fixture *f, double eps, int relu) {
    dt_batch b = {.tokens = f->tok, .features = f->feat, .targets = f->tgt};
    double l;
    memset(f->grads, 0, f->lay.n_params * sizeof(float));
    cr_assert_eq(dt_net_forward(&f->net, &b, &l), DT_STATUS_OK);
    cr_assert_eq(dt_net_backward(&f->net, 1.0f / (float)f->net.n_rows), DT_STATUS_OK);
    dt_rng rng;
    dt_rng_seed(&rng, 5, 0);
    int checked = 0, bad = 0, kinks = 0;
    double worst = 0;
    for (int t = 0; t < f->lay.n_tensors; t++) {
        const dt_tensor_info *ti = &f->lay.tensors[t];
        int n = ti->numel <= 24 ? (int)ti->numel : 24;
        for (int k = 0; k < n; k++) {
            size_t i = ti->offset + (ti->numel <= 24 ? (size_t)k : dt_rng_below(&rng, ti->numel));
            if (!strcmp(ti->name, "wte.weight") && i - ti->offset >= (size_t)11 * 8) continue;
            float keep = f->params[i];
            f->params[i] = keep + (float)eps;
            double lp = loss_of(f);
            f->params[i] = keep - (float)eps;
            double lm = loss_of(f);
            f->params[i] = keep;
            double l0 = loss_of(f);
            double fd = (lp - lm) / (2 * eps), g = f->grads[i];
            /* At a ReLU kink the two one-sided slopes differ: no derivative to check. */
            if (relu && fabs((lp - l0) - (l0 - lm)) / eps > 5e-4 + 0.1 * fabs(fd)) {
                kinks++;
                continue;
            }
            double err = fabs(fd - g) / (1e-3 + fabs(fd));
            if (err > worst) worst = err;
            if (fabs(fd - g) > 2e-4 + 2e-2 * fabs(fd)) {
                bad++;
                cr_log_error("%s[%zu]: analytic %.6g, finite difference %.6g", ti->name, i - ti->offset, g, fd);
            }
            checked++;
        }
    }
    cr_assert_eq(bad, 0, "%d of %d gradients off (worst relative %.3g)", bad, checked, worst);
    cr_assert_gt(checked, 80);
    cr_assert_leq(kinks, 3, "%d points at kinks", kinks);
}

Test(net, gpt_gradients_match_finite_differences) {
    fixture f = {0};
    dt_model_spec s = tiny_gpt;
    setup_model(&f, &s, 2);
    /* Larger weights than GPT-2's init so every path carries signal. */
    dt_rng rng;
    dt_rng_seed(&rng, 3, 0);
    for (size_t i = 0; i < f.lay.n_params; i++) f.params[i] += (float)(0.3 * dt_rng_normal(&rng));
    gradcheck(&f, 1e-2, 0);
    teardown_model(&f);
}

Test(net, mlp_gradients_match_finite_differences) {
    fixture f = {0};
    dt_model_spec s = {.ops = &dt_model_mlp, .in_dim = 6, .hidden_dim = 9, .n_hidden_layers = 2, .n_classes = 4};
    setup_model(&f, &s, 5);
    /* Small steps: a larger one would cross ReLU kinks. */
    gradcheck(&f, 1e-3, 1);
    teardown_model(&f);
}

/* AdamW on one fixed batch: a tiny GPT memorises it. */
Test(net, gpt_overfits_one_batch) {
    fixture f = {0};
    setup_model(&f, &tiny_gpt, 4);
    float *m = calloc(f.lay.n_params, sizeof(float)), *v = calloc(f.lay.n_params, sizeof(float));
    dt_batch b = {.tokens = f.tok, .targets = f.tgt};
    double l = 0, first = 0;
    for (int step = 1; step <= 300; step++) {
        memset(f.grads, 0, f.lay.n_params * sizeof(float));
        cr_assert_eq(dt_net_forward(&f.net, &b, &l), DT_STATUS_OK);
        if (step == 1) first = l;
        cr_assert_eq(dt_net_backward(&f.net, 1.0f / (float)f.net.n_rows), DT_STATUS_OK);
        dt_adamw_args_t a = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .step = step,
                             .grad_scale = 1.0f};
        f.dev->ops->adamw(f.dev, f.params, NULL, f.grads, m, v, f.lay.n_params, &a, 0);
    }
    cr_assert_lt(l, 0.05, "loss %g after 300 steps (started at %g)", l, first);
    free(m), free(v);
    teardown_model(&f);
}

typedef struct trace {
    int n;
    int unit[64];
    dt_net_phase_t phase[64];
} trace;

static void record(void *ctx, int unit, dt_net_phase_t phase) {
    trace *t = ctx;
    if (t->n < 64) t->unit[t->n] = unit, t->phase[t->n] = phase;
    t->n++;
}

Test(net, hooks_follow_unit_order) {
    fixture f = {0};
    setup_model(&f, &tiny_gpt, 1);
    trace tr = {0};
    f.net.hook = record;
    f.net.hook_ctx = &tr;
    dt_batch b = {.tokens = f.tok, .targets = f.tgt};
    double l;
    cr_assert_eq(dt_net_forward(&f.net, &b, &l), DT_STATUS_OK);
    /* 0, 1, 2, 3 (lnf), then 0 again for the tied head. */
    int fwd_units[] = {0, 0, 1, 1, 2, 2, 3, 3, 0, 0};
    cr_assert_eq(tr.n, 10);
    for (int i = 0; i < 10; i++) {
        cr_assert_eq(tr.unit[i], fwd_units[i]);
        cr_assert_eq(tr.phase[i], i % 2 ? DT_NET_FWD_POST : DT_NET_FWD_PRE);
    }
    tr.n = 0;
    cr_assert_eq(dt_net_backward(&f.net, 1.0f), DT_STATUS_OK);
    int bwd_units[] = {0, 3, 3, 2, 2, 1, 1, 0};
    cr_assert_eq(tr.n, 8);
    for (int i = 0; i < 8; i++) cr_assert_eq(tr.unit[i], bwd_units[i], "event %d", i);
    cr_assert_eq(tr.phase[7], DT_NET_BWD_POST);
    teardown_model(&f);
}
