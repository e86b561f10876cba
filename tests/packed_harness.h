/*
 * packed_harness.h - what the packed-sequence net tests share (tests/test_packed.c
 * on the CPU, tests/gpu/test_packed_cuda.c on the CUDA device): tiny gpt and llama
 * specs, one row packing three documents of different lengths (net.h:
 * dt_batch.positions) and the same documents one per row with the rest of each row
 * untrained (targets -1), and runs of a whole net or of a two-chunk stage layout on
 * any device, giving each document token's loss and the parameter gradients in the
 * whole model's layout (host fp32).
 *
 * Packed equals alone: a document's tokens see only their document in both, at the
 * same positions, and the untrained rest of an alone row adds no gradient (its
 * losses and their gradients are 0, and causal attention keeps it out of the
 * documents' rows). The gradients are the sum over the documents either way.
 */
#ifndef DT_TESTS_PACKED_HARNESS_H
#define DT_TESTS_PACKED_HARNESS_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "kernels/kernels.h"
#include "runtime/model/model.h"
#include "runtime/model/net.h"

enum { PK_T = 16, PK_V = 50, PK_DOCS = 3, PK_LAYERS = 3 };
static const int pk_len[PK_DOCS] = {5, 7, 4}; /* fills PK_T */

static inline void pk_set(dt_model_spec *s, const char *path, double v) {
    const dt_model_key *k = dt_model_key_find(s->ops, path);
    cr_assert_not_null(k, "no key %s", path);
    dt_model_key_set(s, k, v);
}

/* gpt: 3 layers, 2 heads of 8 (wpe: 16 positions, tied head); llama: hidden 16, 3
 * layers, 4 query heads and 2 key/value heads of 4, intermediate 24, llama3 RoPE
 * scaling, untied head. Vocabulary 50 padded to 64. */
static inline dt_model_spec pk_spec(int llama) {
    dt_model_spec s = {.ops = llama ? &dt_model_llama : &dt_model_gpt, .seq_len = PK_T, .vocab_size = PK_V,
                       .vocab_pad_multiple = 64};
    if (!llama) {
        s.n_layer = PK_LAYERS, s.n_head = 2, s.n_embd = 16;
        return s;
    }
    pk_set(&s, "model.hidden_size", 16);
    pk_set(&s, "model.num_hidden_layers", PK_LAYERS);
    pk_set(&s, "model.num_attention_heads", 4);
    pk_set(&s, "model.num_key_value_heads", 2);
    pk_set(&s, "model.intermediate_size", 24);
    pk_set(&s, "model.max_position_embeddings", 64);
    pk_set(&s, "model.rope_theta", 10000);
    pk_set(&s, "model.rope_scaling.factor", 8);
    pk_set(&s, "model.rope_scaling.low_freq_factor", 1);
    pk_set(&s, "model.rope_scaling.high_freq_factor", 4);
    pk_set(&s, "model.rope_scaling.original_max_position_embeddings", 8);
    pk_set(&s, "model.rms_norm_eps", 1e-6);
    return s;
}

/* The batch: packed, 1 row of the three documents with their positions; alone, 3
 * rows, document d at the start of row d, then other tokens with targets -1. */
typedef struct pk_batch {
    int B;
    int32_t tok[PK_DOCS * PK_T], tgt[PK_DOCS * PK_T], pos[PK_T];
    dt_batch b;
} pk_batch;

static inline void pk_batch_init(pk_batch *p, int packed) {
    dt_rng r;
    dt_rng_seed(&r, 17, 0);
    memset(p, 0, sizeof *p);
    p->B = packed ? 1 : PK_DOCS;
    for (int i = 0; i < PK_DOCS * PK_T; i++) /* the alone rows' untrained rest */
        p->tok[i] = (int32_t)dt_rng_below(&r, PK_V), p->tgt[i] = -1;
    for (int d = 0, start = 0; d < PK_DOCS; start += pk_len[d], d++)
        for (int i = 0; i < pk_len[d]; i++) {
            int at = packed ? start + i : d * PK_T + i;
            p->tok[at] = (int32_t)dt_rng_below(&r, PK_V);
            p->tgt[at] = (int32_t)dt_rng_below(&r, PK_V);
            if (packed) p->pos[at] = i;
        }
    p->b = (dt_batch){.tokens = p->tok, .targets = p->tgt, .positions = packed ? p->pos : NULL};
}

/* Row index (b * T + t) of document d's token i. */
static inline int pk_row(int packed, int d, int i) {
    int start = 0;
    for (int k = 0; k < d; k++) start += pk_len[k];
    return packed ? start + i : d * PK_T + i;
}

typedef struct pk_run {
    float losses[PK_T]; /* each document token's, documents in order */
    float *grads;       /* the whole model's layout */
    size_t n;
} pk_run;

static inline void pk_losses(pk_run *r, const dt_net_t *net, int packed) {
    for (int d = 0, k = 0; d < PK_DOCS; d++)
        for (int i = 0; i < pk_len[d]; i++) r->losses[k++] = net->h_losses[pk_row(packed, d, i)];
}

/* n elements of the device's dtype, zeroed, or holding host when given. */
static inline void *pk_dev_buf(dt_device_t *dev, const float *host, size_t n) {
    void *p = NULL;
    cr_assert_eq(dev->ops->alloc(dev, DT_MEM_OTHER, n * dt_dtype_size(dev->ops->dtype), &p), DT_STATUS_OK, "%s",
                 dt_error_detail());
    if (host) cr_assert_eq(dev->ops->upload_f32(dev, p, host, n), DT_STATUS_OK, "%s", dt_error_detail());
    return p;
}

static inline void pk_download(dt_device_t *dev, float *host, const void *p, size_t n) {
    cr_assert_eq(dev->ops->download_f32(dev, host, p, n), DT_STATUS_OK, "%s", dt_error_detail());
}

/* A forward and backward (dscale 1: the gradient of the sum of the token losses) of
 * the whole model on dev under a recomputation policy. */
static inline pk_run pk_run_whole(dt_device_t *dev, const dt_model_spec *s, dt_model_recompute_t policy,
                                  int packed) {
    dt_model_layout lay;
    cr_assert_eq(dt_model_layout_init(s, &lay), DT_STATUS_OK, "%s", dt_error_detail());
    dt_model_layout_set_recompute(&lay, policy, 1);
    pk_batch bt;
    pk_batch_init(&bt, packed);
    pk_run r = {.n = lay.n_params, .grads = calloc(lay.n_params, sizeof(float))};
    dt_model_init_params(&lay, 5, r.grads); /* host staging for the parameters */
    void *params = pk_dev_buf(dev, r.grads, lay.n_params), *grads = pk_dev_buf(dev, NULL, lay.n_params);
    dt_net_t net;
    cr_assert_eq(dt_net_init(&net, dev, &lay, bt.B), DT_STATUS_OK, "%s", dt_error_detail());
    dt_net_bind(&net, params, grads);
    double loss;
    cr_assert_eq(dt_net_forward(&net, &bt.b, &loss), DT_STATUS_OK, "%s", dt_error_detail());
    pk_losses(&r, &net, packed);
    cr_assert_eq(dt_net_backward(&net, 1.0f), DT_STATUS_OK, "%s", dt_error_detail());
    pk_download(dev, r.grads, grads, lay.n_params);
    dt_net_free(&net);
    dev->ops->free(dev, params), dev->ops->free(dev, grads);
    dt_model_layout_free(&lay);
    return r;
}

/* The same on two pipeline stages' layouts (blocks 0 | 1-2) in one process: stage
 * 0's forward, its output into stage 1's input, stage 1's forward (the loss) and
 * backward, its input gradient back, stage 0's backward. Both stages get the whole
 * batch (stage 1 reads no tokens, but the positions). The gradients are gathered
 * into the whole model's layout, gpt's tied head copy added to the embedding's. */
static inline pk_run pk_run_chunks(dt_device_t *dev, const dt_model_spec *s, dt_model_recompute_t policy,
                                   int packed) {
    dt_model_layout whole, lay[2];
    cr_assert_eq(dt_model_layout_init(s, &whole), DT_STATUS_OK, "%s", dt_error_detail());
    int bounds[3] = {0, 1, PK_LAYERS};
    pk_batch bt;
    pk_batch_init(&bt, packed);
    dt_net_t net[2];
    void *params[2], *grads[2], *head_dw = NULL;
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(dt_model_layout_init_stage(s, 1, 0, 0, 2, k, 1, bounds, &lay[k]), DT_STATUS_OK, "%s",
                     dt_error_detail());
        dt_model_layout_set_recompute(&lay[k], policy, 1);
        float *h = malloc(lay[k].n_params * sizeof *h);
        dt_model_init_params(&lay[k], 5, h);
        params[k] = pk_dev_buf(dev, h, lay[k].n_params);
        grads[k] = pk_dev_buf(dev, NULL, lay[k].n_params);
        free(h);
        cr_assert_eq(dt_net_init(&net[k], dev, &lay[k], bt.B), DT_STATUS_OK, "%s", dt_error_detail());
        dt_net_bind(&net[k], params[k], grads[k]);
    }
    size_t emb = whole.tensors[0].numel;
    if (lay[1].has_tied_copy) { /* the embedding leads stage 0's buffer */
        net[1].head_w = params[0];
        net[1].head_dw = head_dw = pk_dev_buf(dev, NULL, emb);
    }
    size_t bytes = dt_net_stage_elems(&net[0]) * dt_dtype_size(dev->ops->dtype);
    pk_run r = {.n = whole.n_params, .grads = calloc(whole.n_params, sizeof(float))};
    double loss;
    cr_assert_eq(dt_net_forward(&net[0], &bt.b, &loss), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(dev->ops->copy(dev, dt_net_stage_buf(&net[1], DT_NET_STAGE_IN),
                                dt_net_stage_buf(&net[0], DT_NET_STAGE_OUT), bytes, DT_COPY_DEVICE_TO_DEVICE),
                 DT_STATUS_OK);
    dt_batch b1 = {.targets = bt.b.targets, .positions = bt.b.positions};
    cr_assert_eq(dt_net_forward(&net[1], &b1, &loss), DT_STATUS_OK, "%s", dt_error_detail());
    pk_losses(&r, &net[1], packed);
    cr_assert_eq(dt_net_backward(&net[1], 1.0f), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(dev->ops->copy(dev, dt_net_stage_buf(&net[0], DT_NET_STAGE_DOUT),
                                dt_net_stage_buf(&net[1], DT_NET_STAGE_DIN), bytes, DT_COPY_DEVICE_TO_DEVICE),
                 DT_STATUS_OK);
    cr_assert_eq(dt_net_backward(&net[0], 0), DT_STATUS_OK, "%s", dt_error_detail());
    for (int k = 0; k < 2; k++) {
        float *h = malloc(lay[k].n_params * sizeof *h);
        pk_download(dev, h, grads[k], lay[k].n_params);
        for (int i = 0; i < lay[k].n_tensors; i++) {
            const dt_tensor_info *t = &lay[k].tensors[i];
            memcpy(r.grads + t->goffset, h + t->offset, t->numel * sizeof *h);
        }
        free(h);
    }
    if (head_dw) {
        float *h = malloc(emb * sizeof *h);
        pk_download(dev, h, head_dw, emb);
        for (size_t i = 0; i < emb; i++) r.grads[whole.tensors[0].offset + i] += h[i];
        free(h);
        dev->ops->free(dev, head_dw);
    }
    for (int k = 0; k < 2; k++) {
        dt_net_free(&net[k]);
        dev->ops->free(dev, params[k]), dev->ops->free(dev, grads[k]);
        dt_model_layout_free(&lay[k]);
    }
    dt_model_layout_free(&whole);
    return r;
}

/* Losses and gradients within tol (absolute); a few gradients must be nonzero. */
static inline void pk_expect_close(const pk_run *got, const pk_run *want, double tol, const char *what) {
    cr_assert_eq(got->n, want->n);
    for (int k = 0; k < PK_T; k++)
        cr_assert(fabs((double)got->losses[k] - want->losses[k]) <= tol, "%s: loss of document token %d: %.9g vs %.9g",
                  what, k, got->losses[k], want->losses[k]);
    double worst = 0, big = 0;
    size_t at = 0;
    for (size_t i = 0; i < got->n; i++) {
        double e = fabs((double)got->grads[i] - want->grads[i]);
        if (e > worst) worst = e, at = i;
        big = fmax(big, fabs(want->grads[i]));
    }
    cr_assert_gt(big, 1e-3, "%s: the gradients are all but zero", what);
    cr_assert(worst <= tol, "%s: gradient %zu: %.9g vs %.9g (max |diff| %.3g; max |grad| %.3g)", what, at,
              got->grads[at], want->grads[at], worst, big);
    cr_log_info("%s: max |diff| %.3g of max |grad| %.3g", what, worst, big);
}

static inline void pk_free(pk_run *r) {
    free(r->grads);
    r->grads = NULL;
}

#endif /* DT_TESTS_PACKED_HARNESS_H */
