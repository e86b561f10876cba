/*
 * test_llama_net.c - llama's forward and backward (runtime/model/llama.c) on the CPU
 * device: the loss against a double-precision reference of the whole model written
 * out here from the Llama definition (RMSNorm, fused q|k|v with biases, RoPE
 * rotate_half, grouped-query causal attention, SwiGLU, untied and tied heads);
 * gradients of every tensor against central finite differences of the mean loss;
 * tied vs untied equality; the hook order FSDP relies on; overfitting one batch.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "kernels/kernels.h"
#include "runtime/model/model.h"
#include "runtime/model/net.h"

/* vocab 11 (padded to 16), hidden 16, 2 layers, 4 query heads of 4, 2 key/value
 * heads, intermediate 12, seq 5; q/k/v biases and tying as asked. */
enum { V = 11, C = 16, L = 2, NH = 4, NKV = 2, HD = 4, IC = 12, T = 5 };

static void set(dt_model_spec *s, const char *path, double v) {
    const dt_model_key *k = dt_model_key_find(s->ops, path);
    cr_assert_not_null(k, "no key %s", path);
    dt_model_key_set(s, k, v);
}

static dt_model_spec tiny(int tied, int bias, double rope_factor) {
    dt_model_spec s = {.ops = &dt_model_llama, .seq_len = T, .vocab_size = V, .vocab_pad_multiple = 16};
    set(&s, "model.hidden_size", C);
    set(&s, "model.num_hidden_layers", L);
    set(&s, "model.num_attention_heads", NH);
    set(&s, "model.num_key_value_heads", NKV);
    set(&s, "model.intermediate_size", IC);
    set(&s, "model.max_position_embeddings", 64);
    set(&s, "model.rope_theta", 10000);
    set(&s, "model.rms_norm_eps", 1e-6);
    set(&s, "model.tie_word_embeddings", tied);
    set(&s, "model.attention_bias", bias);
    set(&s, "model.rope_scaling.factor", rope_factor);
    set(&s, "model.rope_scaling.low_freq_factor", 1);
    set(&s, "model.rope_scaling.high_freq_factor", 4);
    set(&s, "model.rope_scaling.original_max_position_embeddings", 4); /* short: every band is rescaled */
    return s;
}

typedef struct fixture {
    dt_device_t *dev;
    dt_model_layout lay;
    dt_net_t net;
    float *params, *grads;
    int32_t tok[3 * T], tgt[3 * T];
} fixture;

/* Parameters: the model's init plus normal(0, 0.3) noise so that every path
 * (biases, norms) carries signal. */
static void setup(fixture *f, const dt_model_spec *s, int B) {
    memset(f, 0, sizeof *f);
    cr_assert_eq(dt_device_init(&f->dev, DT_DEVICE_CPU, 1), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(dt_model_layout_init(s, &f->lay), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(dt_net_init(&f->net, f->dev, &f->lay, B), DT_STATUS_OK, "%s", dt_error_detail());
    f->params = calloc(f->lay.n_params, sizeof(float));
    f->grads = calloc(f->lay.n_params, sizeof(float));
    dt_model_init_params(&f->lay, 7, f->params);
    dt_rng rng;
    dt_rng_seed(&rng, 3, 0);
    for (int t = 0; t < f->lay.n_tensors; t++) {
        const dt_tensor_info *ti = &f->lay.tensors[t];
        int vocab = strstr(ti->name, "embed_tokens") || strstr(ti->name, "lm_head");
        size_t n = vocab ? (size_t)V * C : ti->numel; /* padded rows stay 0 */
        for (size_t j = 0; j < n; j++) f->params[ti->offset + j] += (float)(0.3 * dt_rng_normal(&rng));
    }
    dt_net_bind(&f->net, f->params, f->grads);
    dt_rng_seed(&rng, 99, 0);
    for (int i = 0; i < B * T; i++) {
        f->tok[i] = (int32_t)dt_rng_below(&rng, V);
        f->tgt[i] = (int32_t)dt_rng_below(&rng, V);
    }
}

static void teardown(fixture *f) {
    dt_net_free(&f->net);
    dt_model_layout_free(&f->lay);
    dt_device_free(f->dev);
    free(f->params), free(f->grads);
}

static double loss_of(fixture *f) {
    dt_batch b = {.tokens = f->tok, .targets = f->tgt};
    double l;
    cr_assert_eq(dt_net_forward(&f->net, &b, &l), DT_STATUS_OK);
    f->net.have_forward = 0;
    return l;
}

/* ---- the reference --------------------------------------------------------- */

static const float *tensor(const fixture *f, const char *fmt, int i) {
    char name[DT_MODEL_NAME_LEN];
    snprintf(name, sizeof name, fmt, i);
    int t = dt_model_find(&f->lay, name);
    cr_assert_geq(t, 0, "no tensor %s", name);
    return f->params + f->lay.tensors[t].offset;
}

static void rmsnorm(double *out, const double *x, const float *w, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double r = 1 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * r * w[i];
}

/* out (rows) = W (rows, n) x (+ b) */
static void linear(double *out, const float *W, const float *b, const double *x, int rows, int n) {
    for (int r = 0; r < rows; r++) {
        double s = b ? b[r] : 0;
        for (int i = 0; i < n; i++) s += (double)W[(size_t)r * n + i] * x[i];
        out[r] = s;
    }
}

/* rotate_half: pair (x[i], x[i + HD/2]) turned by pos * inv_freq[i]. */
static void rope(double *x, int pos, const float *inv_freq) {
    for (int i = 0; i < HD / 2; i++) {
        double a = (double)(float)((float)pos * inv_freq[i]), c = cos(a), s = sin(a);
        double x0 = x[i], x1 = x[i + HD / 2];
        x[i] = x0 * c - x1 * s;
        x[i + HD / 2] = x1 * c + x0 * s;
    }
}

/* The mean loss of sequence rows [0, B*T) in double precision. */
static double reference_loss(const fixture *f, int B) {
    const dt_model_spec *s = &f->lay.spec;
    int tied = f->lay.tied_head, bias = dt_model_key_get(s, dt_model_key_find(s->ops, "model.attention_bias")) != 0;
    dt_rope_args_t ra = {.theta = 10000,
                         .factor = dt_model_key_get(s, dt_model_key_find(s->ops, "model.rope_scaling.factor")),
                         .low_freq_factor = 1, .high_freq_factor = 4, .original_max_pos = 4};
    float inv_freq[HD / 2];
    dt_rope_inv_freq(&ra, HD, inv_freq);
    double total = 0;
    for (int b = 0; b < B; b++) {
        static double x[T][C], h[C], q[T][NH * HD], k[T][NKV * HD], v[T][NKV * HD], y[NH * HD], o[C], g[2 * IC];
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) x[t][c] = tensor(f, "model.embed_tokens.weight", 0)[f->tok[b * T + t] * C + c];
        for (int l = 0; l < L; l++) {
            for (int t = 0; t < T; t++) {
                rmsnorm(h, x[t], tensor(f, "model.layers.%d.input_layernorm.weight", l), C, 1e-6);
                linear(q[t], tensor(f, "model.layers.%d.self_attn.q_proj.weight", l),
                       bias ? tensor(f, "model.layers.%d.self_attn.q_proj.bias", l) : NULL, h, NH * HD, C);
                linear(k[t], tensor(f, "model.layers.%d.self_attn.k_proj.weight", l),
                       bias ? tensor(f, "model.layers.%d.self_attn.k_proj.bias", l) : NULL, h, NKV * HD, C);
                linear(v[t], tensor(f, "model.layers.%d.self_attn.v_proj.weight", l),
                       bias ? tensor(f, "model.layers.%d.self_attn.v_proj.bias", l) : NULL, h, NKV * HD, C);
                for (int hh = 0; hh < NH; hh++) rope(q[t] + hh * HD, t, inv_freq);
                for (int hh = 0; hh < NKV; hh++) rope(k[t] + hh * HD, t, inv_freq);
            }
            for (int t = 0; t < T; t++) { /* attention, then x += o_proj(y) */
                for (int hh = 0; hh < NH; hh++) {
                    int kv = hh / (NH / NKV); /* repeat_kv */
                    double sc[T], mx = -INFINITY, sum = 0;
                    for (int u = 0; u <= t; u++) {
                        sc[u] = 0;
                        for (int i = 0; i < HD; i++) sc[u] += q[t][hh * HD + i] * k[u][kv * HD + i];
                        sc[u] /= sqrt((double)HD);
                        mx = fmax(mx, sc[u]);
                    }
                    for (int u = 0; u <= t; u++) sum += sc[u] = exp(sc[u] - mx);
                    for (int i = 0; i < HD; i++) {
                        double acc = 0;
                        for (int u = 0; u <= t; u++) acc += sc[u] / sum * v[u][kv * HD + i];
                        y[hh * HD + i] = acc;
                    }
                }
                linear(o, tensor(f, "model.layers.%d.self_attn.o_proj.weight", l), NULL, y, C, NH * HD);
                for (int c = 0; c < C; c++) x[t][c] += o[c];
            }
            for (int t = 0; t < T; t++) { /* x += down(silu(gate h) * up h) */
                rmsnorm(h, x[t], tensor(f, "model.layers.%d.post_attention_layernorm.weight", l), C, 1e-6);
                linear(g, tensor(f, "model.layers.%d.mlp.gate_proj.weight", l), NULL, h, IC, C);
                linear(g + IC, tensor(f, "model.layers.%d.mlp.up_proj.weight", l), NULL, h, IC, C);
                for (int i = 0; i < IC; i++) g[i] = g[i] / (1 + exp(-g[i])) * g[IC + i];
                linear(o, tensor(f, "model.layers.%d.mlp.down_proj.weight", l), NULL, g, C, IC);
                for (int c = 0; c < C; c++) x[t][c] += o[c];
            }
        }
        const float *head = tied ? tensor(f, "model.embed_tokens.weight", 0) : tensor(f, "lm_head.weight", 0);
        for (int t = 0; t < T; t++) {
            double logits[V], mx = -INFINITY, sum = 0;
            rmsnorm(h, x[t], tensor(f, "model.norm.weight", 0), C, 1e-6);
            linear(logits, head, NULL, h, V, C); /* the real vocabulary's rows only */
            for (int i = 0; i < V; i++) mx = fmax(mx, logits[i]);
            for (int i = 0; i < V; i++) sum += exp(logits[i] - mx);
            total += log(sum) + mx - logits[f->tgt[b * T + t]];
        }
    }
    return total / (B * T);
}

Test(llama_net, loss_matches_a_double_precision_reference) {
    for (int variant = 0; variant < 4; variant++) {
        int tied = variant & 1, bias = (variant >> 1) & 1;
        double factor = variant == 3 ? 8 : 0; /* Llama 3 rescaled frequencies in one */
        dt_model_spec s = tiny(tied, bias, factor);
        fixture f;
        setup(&f, &s, 3);
        double got = loss_of(&f), want = reference_loss(&f, 3);
        cr_assert(fabs(got - want) <= 2e-5 * fabs(want), "tied %d bias %d: loss %.9g, reference %.9g", tied, bias,
                  got, want);
        cr_assert_gt(want, 0.5, "a loss that is not trivially 0");
        teardown(&f);
    }
}

/* At init (std 0.02) the logits are nearly equal: ln V. */
Test(llama_net, loss_at_init_is_ln_vocab) {
    dt_model_spec s = tiny(0, 0, 0);
    fixture f;
    setup(&f, &s, 2);
    dt_model_init_params(&f.lay, 7, f.params);
    cr_assert_float_eq(loss_of(&f), log((double)V), 0.02);
    teardown(&f);
}

/* ---- gradients ------------------------------------------------------------- */

/* Central differences of the mean loss against the analytic gradient, for every
 * element of tensors up to 24 elements and 24 random ones of larger tensors (the
 * real vocabulary's rows only: padded rows have no loss). */
static void gradcheck(fixture *f) {
    dt_batch b = {.tokens = f->tok, .targets = f->tgt};
    double l;
    memset(f->grads, 0, f->lay.n_params * sizeof(float));
    cr_assert_eq(dt_net_forward(&f->net, &b, &l), DT_STATUS_OK);
    cr_assert_eq(dt_net_backward(&f->net, 1.0f / (float)f->net.n_rows), DT_STATUS_OK);
    dt_rng rng;
    dt_rng_seed(&rng, 5, 0);
    const double eps = 3e-3;
    int checked = 0, bad = 0;
    double worst = 0;
    for (int t = 0; t < f->lay.n_tensors; t++) {
        const dt_tensor_info *ti = &f->lay.tensors[t];
        int vocab = strstr(ti->name, "embed_tokens") || strstr(ti->name, "lm_head");
        size_t numel = vocab ? (size_t)V * C : ti->numel;
        int n = numel <= 24 ? (int)numel : 24, nonzero = 0;
        for (int k = 0; k < n; k++) {
            size_t i = ti->offset + (numel <= 24 ? (size_t)k : dt_rng_below(&rng, numel));
            float keep = f->params[i];
            f->params[i] = keep + (float)eps;
            double lp = loss_of(f);
            f->params[i] = keep - (float)eps;
            double lm = loss_of(f);
            f->params[i] = keep;
            double fd = (lp - lm) / (2 * eps), g = f->grads[i];
            double err = fabs(fd - g) / (1e-3 + fabs(fd));
            if (err > worst) worst = err;
            if (fabs(fd - g) > 2e-4 + 2e-2 * fabs(fd)) {
                bad++;
                cr_log_error("%s[%zu]: analytic %.6g, finite difference %.6g", ti->name, i - ti->offset, g, fd);
            }
            nonzero += fabs(g) > 1e-5;
            checked++;
        }
        cr_assert_gt(nonzero, 0, "%s: some gradient is not 0 (the check sees the tensor)", ti->name);
    }
    cr_assert_eq(bad, 0, "%d of %d gradients off (worst relative %.3g)", bad, checked, worst);
    cr_assert_gt(checked, 300);
}

Test(llama_net, gradients_with_gqa_and_biases_match_finite_differences) {
    dt_model_spec s = tiny(0, 1, 0);
    fixture f;
    setup(&f, &s, 2);
    gradcheck(&f);
    teardown(&f);
}

Test(llama_net, gradients_tied_with_llama3_rope_match_finite_differences) {
    dt_model_spec s = tiny(1, 0, 8);
    fixture f;
    setup(&f, &s, 2);
    gradcheck(&f);
    teardown(&f);
}

/* An untied model whose lm_head equals embed_tokens computes the tied model's loss,
 * and the tied embedding's gradient is the sum of the untied embedding's and head's. */
Test(llama_net, tied_equals_untied_with_the_head_set_to_the_embedding) {
    dt_model_spec st = tiny(1, 1, 0), su = tiny(0, 1, 0);
    fixture ft, fu;
    setup(&ft, &st, 2);
    setup(&fu, &su, 2);
    cr_assert_eq(fu.lay.n_params, ft.lay.n_params + 16 * C);
    /* the same parameters: the tied table is the untied one less lm_head (last) */
    memcpy(fu.params, ft.params, ft.lay.n_params * sizeof(float));
    int head = dt_model_find(&fu.lay, "lm_head.weight");
    cr_assert_eq(fu.lay.tensors[head].offset, ft.lay.n_params);
    memcpy(fu.params + fu.lay.tensors[head].offset, ft.params, 16 * C * sizeof(float));
    memcpy(fu.tok, ft.tok, sizeof ft.tok);
    memcpy(fu.tgt, ft.tgt, sizeof ft.tgt);
    dt_batch bt = {.tokens = ft.tok, .targets = ft.tgt}, bu = {.tokens = fu.tok, .targets = fu.tgt};
    double lt, lu;
    cr_assert_eq(dt_net_forward(&ft.net, &bt, &lt), DT_STATUS_OK);
    cr_assert_eq(dt_net_forward(&fu.net, &bu, &lu), DT_STATUS_OK);
    cr_assert_eq(lt, lu, "tied %.9g, untied %.9g", lt, lu);
    cr_assert_eq(dt_net_backward(&ft.net, 0.1f), DT_STATUS_OK);
    cr_assert_eq(dt_net_backward(&fu.net, 0.1f), DT_STATUS_OK);
    for (size_t i = C * 16; i < ft.lay.n_params; i++)
        cr_assert_eq(ft.grads[i], fu.grads[i], "the layers' gradients agree (element %zu)", i);
    for (size_t i = 0; i < 16 * C; i++) {
        double sum = (double)fu.grads[i] + fu.grads[fu.lay.tensors[head].offset + i];
        cr_assert(fabs(ft.grads[i] - sum) <= 1e-6 + 1e-5 * fabs(sum), "embedding %zu: tied %g, untied sum %g", i,
                  ft.grads[i], sum);
    }
    teardown(&ft);
    teardown(&fu);
}

/* ---- hooks and training ---------------------------------------------------- */

typedef struct trace {
    int n, unit[64];
    dt_net_phase_t phase[64];
} trace;

static void record(void *ctx, int unit, dt_net_phase_t phase) {
    trace *t = ctx;
    if (t->n < 64) t->unit[t->n] = unit, t->phase[t->n] = phase;
    t->n++;
}

/* Units 0 (embedding), 1..L, L+1 (norm, and the head when untied); a tied head is
 * unit 0 again (as gpt), an untied one closes unit L+1; backward in reverse. */
Test(llama_net, hooks_follow_unit_order_tied_and_untied) {
    for (int tied = 0; tied < 2; tied++) {
        dt_model_spec s = tiny(tied, 0, 0);
        fixture f;
        setup(&f, &s, 1);
        trace tr = {0};
        f.net.hook = record;
        f.net.hook_ctx = &tr;
        dt_batch b = {.tokens = f.tok, .targets = f.tgt};
        double l;
        cr_assert_eq(dt_net_forward(&f.net, &b, &l), DT_STATUS_OK);
        int fwd_tied[] = {0, 0, 1, 1, 2, 2, 3, 3, 0, 0}, fwd_untied[] = {0, 0, 1, 1, 2, 2, 3, 3};
        int bwd_tied[] = {0, 3, 3, 2, 2, 1, 1, 0}, bwd_untied[] = {3, 3, 2, 2, 1, 1, 0, 0};
        const int *fw = tied ? fwd_tied : fwd_untied, *bw = tied ? bwd_tied : bwd_untied;
        int nf = tied ? 10 : 8;
        cr_assert_eq(tr.n, nf, "tied %d: %d forward events", tied, tr.n);
        for (int i = 0; i < nf; i++) {
            cr_assert_eq(tr.unit[i], fw[i], "tied %d: forward event %d", tied, i);
            cr_assert_eq(tr.phase[i], i % 2 ? DT_NET_FWD_POST : DT_NET_FWD_PRE);
        }
        tr.n = 0;
        cr_assert_eq(dt_net_backward(&f.net, 1.0f), DT_STATUS_OK);
        cr_assert_eq(tr.n, 8);
        for (int i = 0; i < 8; i++) cr_assert_eq(tr.unit[i], bw[i], "tied %d: backward event %d", tied, i);
        cr_assert_eq(tr.phase[7], DT_NET_BWD_POST);
        teardown(&f);
    }
}

/* AdamW on one fixed batch: a tiny llama memorises it. */
Test(llama_net, overfits_one_batch) {
    dt_model_spec s = tiny(0, 1, 0);
    fixture f;
    setup(&f, &s, 3);
    dt_model_init_params(&f.lay, 7, f.params);
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
    teardown(&f);
}
