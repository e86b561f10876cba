/*
 * mlp.c - the MLP classifier: in_dim -> hidden_dim (x n_hidden_layers, ReLU) ->
 * n_classes with a softmax cross-entropy loss, and the synthetic task it trains
 * on. Its config keys, tensor table, initialisation, FLOPs, activation arena,
 * forward and backward. Fills dt_model_mlp (model.h). One unit per layer.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>

#include "common/rng.h" /* defines: dt_rng, dt_rng_normal */
#include "runtime/model/model.h"
#include "runtime/model/net_impl.h"

/* ---- config ---------------------------------------------------------------- */

#define SPEC(f) offsetof(dt_model_spec, f)

static const dt_model_key mlp_keys[] = {
    {"model.in_dim", SPEC(in_dim), 1, 1048576, "32", "mlp: input features", DT_MODEL_KEY_INT},
    {"model.hidden_dim", SPEC(hidden_dim), 1, 1048576, "64", "mlp: hidden width", DT_MODEL_KEY_INT},
    {"model.n_hidden_layers", SPEC(n_hidden_layers), 1, 1024, "2", "mlp: hidden layers", DT_MODEL_KEY_INT},
    {"model.n_classes", SPEC(n_classes), 2, 1048576, "10", "mlp: output classes", DT_MODEL_KEY_INT},
};

/* ---- layout ---------------------------------------------------------------- */

static dt_status_t check_positive(const char *name, int v) {
    if (v <= 0) return dt_error(DT_STATUS_CONFIG, "model.%s: expected an integer > 0, found %d", name, v);
    return DT_STATUS_OK;
}

static dt_status_t mlp_validate(const dt_model_spec *s) {
    DT_CHECK(check_positive("in_dim", s->in_dim));
    DT_CHECK(check_positive("hidden_dim", s->hidden_dim));
    DT_CHECK(check_positive("n_classes", s->n_classes));
    if (s->n_hidden_layers < 0)
        return dt_error(DT_STATUS_CONFIG, "model.n_hidden_layers: expected >= 0, found %d", s->n_hidden_layers);
    return DT_STATUS_OK;
}

static int n_layers(const dt_model_layout *l) { return l->spec.n_hidden_layers + 1; }

/* Layer i: weight (out, in), bias (out). */
static void mlp_build(dt_model_layout *l) {
    const dt_model_spec *s = &l->spec;
    l->seq_len = 1;
    l->in_features = s->in_dim;
    int64_t in = s->in_dim;
    for (int i = 0; i <= s->n_hidden_layers; i++) {
        int64_t out = i == s->n_hidden_layers ? s->n_classes : s->hidden_dim;
        dt_model_add_tensor(l, i, 1, DT_MODEL_INIT_NORMAL, 2, (const int64_t[]){out, in}, "layers.%d.weight", i);
        dt_model_add_tensor(l, i, 0, DT_MODEL_INIT_ZERO, 1, (const int64_t[]){out}, "layers.%d.bias", i);
        in = out;
    }
}

/* Weights normal(0, 1/sqrt(fan_in)), biases 0. */
static void mlp_init_range(const dt_model_layout *l, uint64_t seed, size_t offset, size_t count, float *dst) {
    for (int i = 0; i < l->n_tensors; i++) {
        const dt_tensor_info *t = &l->tensors[i];
        dt_model_init_tensor_range(l, i, seed, offset, count, dst, 1.0 / sqrt((double)t->shape[t->ndim - 1]), 0.02);
    }
}

static void mlp_init_params(const dt_model_layout *l, uint64_t seed, float *params) {
    mlp_init_range(l, seed, 0, l->n_params, params);
}

static double mlp_flops_per_token(const dt_model_layout *l) { return 6.0 * (double)l->n_params; }

static void mlp_describe(const dt_model_layout *l, const char *note, char *buf, size_t len) {
    (void)note;
    const dt_model_spec *s = &l->spec;
    snprintf(buf, len, "mlp %d -> %d x %d -> %d, %zu parameters", s->in_dim, s->hidden_dim, s->n_hidden_layers,
             s->n_classes, l->n_params);
}

static int mlp_export_shape(const dt_model_layout *l, int i, int64_t shape[2], int *ndim) {
    const dt_tensor_info *t = &l->tensors[i];
    *ndim = t->ndim;
    for (int d = 0; d < t->ndim && d < 2; d++) shape[d] = t->shape[d];
    return 0;
}

/* ---- the synthetic task ---------------------------------------------------- */

/* x ~ N(0, 1) of in_dim features, label = argmax of a fixed random linear teacher.
 * Sample `id` depends only on (seed, id), so any split over ranks sees the same
 * samples. */
static void mlp_sample(const dt_model_spec *s, uint64_t seed, uint64_t id, float *x, int32_t *y) {
    int in = s->in_dim, k = s->n_classes;
    dt_rng rng;
    dt_rng_seed(&rng, seed, 0x73616d70ull + id);
    for (int i = 0; i < in; i++) x[i] = (float)dt_rng_normal(&rng);
    dt_rng teacher;
    dt_rng_seed(&teacher, seed, 0x7465616368ull);
    double best = -INFINITY;
    for (int c = 0; c < k; c++) {
        double sum = 0;
        for (int i = 0; i < in; i++) sum += dt_rng_normal(&teacher) * x[i];
        if (sum > best) best = sum, *y = c;
    }
}

static void mlp_synthetic_batch(const dt_model_layout *l, uint64_t seed, uint64_t first, int n, float *x,
                                int32_t *y) {
    for (int b = 0; b < n; b++)
        mlp_sample(&l->spec, seed, first + (uint64_t)b, x + (size_t)b * (size_t)l->in_features, &y[b]);
}

/* ---- activation arena ------------------------------------------------------ */

/* G_DRES: the gradient at the current layer's output; G_DTMP: at its input. */
enum {
    G_TARGETS = DT_NET_SLOT_TARGETS, G_FEATURES = DT_NET_SLOT_FEATURES, G_LOSSES = DT_NET_SLOT_LOSSES,
    G_DRES = DT_NET_SLOT_FIRST, G_DTMP, G_COUNT
};
/* Per layer: the pre-activation and the post-ReLU output. */
enum { L_PRE, L_OUT, L_COUNT };
#define LSLOT(l, s) (G_COUNT + (l) * L_COUNT + (s))

static int mlp_arena_slots(const dt_model_layout *l) { return G_COUNT + n_layers(l) * L_COUNT; }

static void mlp_arena_sizes(const dt_device_t *dev, const dt_model_layout *lay, int B, size_t *sizes) {
    size_t es = dt_dtype_size(dev->ops->dtype);
    const dt_model_spec *s = &lay->spec;
    size_t maxd = (size_t)s->in_dim;
    if ((size_t)s->hidden_dim > maxd) maxd = (size_t)s->hidden_dim;
    if ((size_t)s->n_classes > maxd) maxd = (size_t)s->n_classes;
    sizes[G_TARGETS] = (size_t)B * sizeof(int);
    sizes[G_FEATURES] = (size_t)B * (size_t)s->in_dim * es;
    sizes[G_LOSSES] = (size_t)B * sizeof(float);
    sizes[G_DRES] = sizes[G_DTMP] = (size_t)B * maxd * es;
    int nl = n_layers(lay);
    for (int l = 0; l < nl; l++) {
        size_t out = l == nl - 1 ? (size_t)s->n_classes : (size_t)s->hidden_dim;
        sizes[LSLOT(l, L_PRE)] = sizes[LSLOT(l, L_OUT)] = (size_t)B * out * es;
    }
}

/* ---- forward and backward -------------------------------------------------- */

#define P(t) dt_net_param(net, (t))
#define G(t) dt_net_grad(net, (t))
#define A(slot) dt_net_slot(net, (slot))

static void mlp_forward(dt_net_t *net, int with_loss) {
    const dt_ops_t *o = net->dev->ops;
    dt_device_t *d = net->dev;
    const dt_model_spec *s = &net->layout->spec;
    int B = net->B, nl = n_layers(net->layout), in = s->in_dim;
    const void *x = net->d_features;
    for (int l = 0; l < nl; l++) {
        int out = l == nl - 1 ? s->n_classes : s->hidden_dim;
        dt_net_hook(net, l, DT_NET_FWD_PRE);
        o->matmul_forward(d, A(LSLOT(l, L_PRE)), x, P(2 * l), P(2 * l + 1), B, in, out);
        if (l < nl - 1) o->relu_forward(d, A(LSLOT(l, L_OUT)), A(LSLOT(l, L_PRE)), (size_t)B * out);
        dt_net_hook(net, l, DT_NET_FWD_POST);
        x = A(LSLOT(l, L_OUT));
        in = out;
    }
    if (with_loss)
        o->softmax_xent_forward(d, (float *)A(G_LOSSES), A(LSLOT(nl - 1, L_PRE)), net->d_targets, B,
                                s->n_classes, s->n_classes);
}

static void mlp_backward(dt_net_t *net, float dscale) {
    const dt_ops_t *o = net->dev->ops;
    dt_device_t *d = net->dev;
    const dt_model_spec *s = &net->layout->spec;
    int B = net->B, nl = n_layers(net->layout);
    o->softmax_xent_backward(d, A(G_DRES), NULL, A(LSLOT(nl - 1, L_PRE)), net->d_targets, dscale, B,
                             s->n_classes, s->n_classes);
    for (int l = nl - 1; l >= 0; l--) {
        int out = l == nl - 1 ? s->n_classes : s->hidden_dim;
        int in = l == 0 ? s->in_dim : s->hidden_dim;
        const void *x = l == 0 ? net->d_features : A(LSLOT(l - 1, L_OUT));
        dt_net_hook(net, l, DT_NET_BWD_PRE);
        if (l > 0) dt_net_zero(net, G_DTMP, (size_t)B * in);
        o->matmul_backward(d, l > 0 ? A(G_DTMP) : NULL, G(2 * l), G(2 * l + 1), A(G_DRES), x, P(2 * l), B, in,
                           out);
        if (l > 0) {
            dt_net_zero(net, G_DRES, (size_t)B * in);
            o->relu_backward(d, A(G_DRES), A(LSLOT(l - 1, L_PRE)), A(G_DTMP), (size_t)B * in);
        }
        dt_net_hook(net, l, DT_NET_BWD_POST);
    }
}

const dt_model_ops dt_model_mlp = {
    .name = "mlp",
    .help = "synthetic data",
    .data = DT_MODEL_DATA_FEATURES,
    .keys = mlp_keys,
    .n_keys = (int)(sizeof mlp_keys / sizeof mlp_keys[0]),
    .config_check = NULL,
    .validate = mlp_validate,
    .build = mlp_build,
    .init_params = mlp_init_params,
    .init_range = mlp_init_range,
    .unpadded_params = NULL,
    .flops_per_token = mlp_flops_per_token,
    .describe = mlp_describe,
    .arena_slots = mlp_arena_slots,
    .arena_sizes = mlp_arena_sizes,
    .net_check = NULL,
    .forward = mlp_forward,
    .backward = mlp_backward,
    .logits_slot = -1,
    .export_shape = mlp_export_shape,
    .synthetic_batch = mlp_synthetic_batch,
};
