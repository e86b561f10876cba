/*
 * test_model_stages.c - pipeline stages of the model layer (runtime/model/stage.c,
 * net.c, gpt.c, llama.c): the partitions against hand-computed bounds and the
 * model's own totals; stage layouts against the whole model's table (every global
 * element held by exactly one stage, names and offsets agreeing, init giving the
 * whole model's values); and the key one, CHAIN == WHOLE: the stages of gpt and
 * llama (tied and untied) run chunk by chunk, boundary buffers copied from one to the
 * next, two micro-batches in flight in two arenas, give the whole model's losses and
 * gradients bitwise (the tied embedding's gradient, split between the first stage
 * and the last stage's head copy, within 1e-6).
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

static void set(dt_model_spec *s, const char *path, double v) {
    const dt_model_key *k = dt_model_key_find(s->ops, path);
    cr_assert_not_null(k, "no key %s", path);
    dt_model_key_set(s, k, v);
}

/* gpt: L blocks, width 16, 2 heads, seq 8, vocab V padded to 16. */
static dt_model_spec gpt_spec(int L, int V) {
    return (dt_model_spec){.ops = &dt_model_gpt, .n_layer = L, .n_head = 2, .n_embd = 16, .seq_len = 8,
                           .vocab_size = V, .vocab_pad_multiple = 16};
}

/* llama: L layers, hidden 16, 4 query heads, 2 key/value heads, intermediate 24. */
static dt_model_spec llama_spec(int L, int tied) {
    dt_model_spec s = {.ops = &dt_model_llama, .seq_len = 8, .vocab_size = 37, .vocab_pad_multiple = 16};
    set(&s, "model.hidden_size", 16);
    set(&s, "model.num_hidden_layers", L);
    set(&s, "model.num_attention_heads", 4);
    set(&s, "model.num_key_value_heads", 2);
    set(&s, "model.intermediate_size", 24);
    set(&s, "model.max_position_embeddings", 64);
    set(&s, "model.rope_theta", 10000);
    set(&s, "model.rms_norm_eps", 1e-6);
    set(&s, "model.tie_word_embeddings", tied);
    return s;
}

static void layout(const dt_model_spec *s, dt_model_layout *l) {
    cr_assert_eq(dt_model_layout_init(s, l), DT_STATUS_OK, "%s", dt_error_detail());
}

/* ---- partition ------------------------------------------------------------- */

static void assert_bounds(const int *b, const int *want, int n) {
    for (int k = 0; k <= n; k++) cr_assert_eq(b[k], want[k], "bounds[%d] = %d, expected %d", k, b[k], want[k]);
}

Test(stages, uniform_gives_extra_blocks_to_the_last_chunks) {
    dt_model_layout g;
    dt_model_spec s = gpt_spec(7, 50);
    layout(&s, &g);
    int b[16];
    cr_assert_eq(dt_model_pp_partition(&g, 2, 1, DT_PP_PARTITION_UNIFORM, b), DT_STATUS_OK);
    assert_bounds(b, (int[]){0, 3, 7}, 2);
    cr_assert_eq(dt_model_pp_partition(&g, 3, 1, DT_PP_PARTITION_UNIFORM, b), DT_STATUS_OK);
    assert_bounds(b, (int[]){0, 2, 4, 7}, 3);
    cr_assert_eq(dt_model_pp_partition(&g, 2, 2, DT_PP_PARTITION_UNIFORM, b), DT_STATUS_OK);
    assert_bounds(b, (int[]){0, 1, 3, 5, 7}, 4);
    cr_assert_eq(dt_model_pp_partition(&g, 7, 1, DT_PP_PARTITION_UNIFORM, b), DT_STATUS_OK);
    assert_bounds(b, (int[]){0, 1, 2, 3, 4, 5, 6, 7}, 7);
    dt_model_layout_free(&g);
}

/* gpt, 4 blocks, C 16, T 8, vocabulary 1024: the embedding unit holds 16512
 * parameters, a block 3280, the final LayerNorm 32; per token a block costs
 * 6*3280 + 12*C*T = 21216 FLOPs and the head + final norm 6*(16384 + 32) = 98496. */
Test(stages, parameters_and_flops_balance_the_largest_chunk) {
    dt_model_layout g;
    dt_model_spec s = gpt_spec(4, 1024);
    layout(&s, &g);
    cr_assert_eq(g.units[0].numel, 16512);
    cr_assert_eq(g.units[1].numel, 3280);
    int b[8];
    /* parameters: the embedding's chunk takes one block (19792 vs 9872) */
    cr_assert_eq(dt_model_pp_partition(&g, 2, 1, DT_PP_PARTITION_PARAMETERS, b), DT_STATUS_OK);
    assert_bounds(b, (int[]){0, 1, 4}, 2);
    /* three chunks: the first one block (19792 is the least largest); of the cuts
     * reaching it, the later chunks get the most blocks */
    cr_assert_eq(dt_model_pp_partition(&g, 3, 1, DT_PP_PARTITION_PARAMETERS, b), DT_STATUS_OK);
    assert_bounds(b, (int[]){0, 1, 2, 4}, 3);
    /* FLOPs: the head's chunk takes one block (119712; 3 blocks first: 63648) */
    cr_assert_eq(dt_model_pp_partition(&g, 2, 1, DT_PP_PARTITION_FLOPS, b), DT_STATUS_OK);
    assert_bounds(b, (int[]){0, 3, 4}, 2);
    double p, f;
    dt_model_pp_chunk_cost(&g, b, 0, &p, &f);
    cr_assert_float_eq(p, 16512 + 3 * 3280, 0.5);
    cr_assert_float_eq(f, 3 * 21216, 0.5);
    dt_model_pp_chunk_cost(&g, b, 1, &p, &f);
    cr_assert_float_eq(p, 3280 + 32, 0.5);
    cr_assert_float_eq(f, 21216 + 98496, 0.5);
    dt_model_layout_free(&g);
}

/* Every partition of every kind covers each block once, and the chunks' costs sum to
 * the model's parameters and FLOPs per token. */
static void check_sums(const dt_model_spec *s) {
    dt_model_layout g;
    layout(s, &g);
    int L = g.n_units - 2, b[DT_MODEL_MAX_CHUNKS + 1];
    for (int kind = 0; kind < 3; kind++)
        for (int P = 1; P <= L; P++)
            for (int V = 1; V <= 2 && P * V <= L; V++) {
                cr_assert_eq(dt_model_pp_partition(&g, P, V, (dt_pp_partition_t)kind, b), DT_STATUS_OK, "%s",
                             dt_error_detail());
                int n = P * V;
                cr_assert_eq(b[0], 0);
                cr_assert_eq(b[n], L);
                double ps = 0, fs = 0;
                for (int k = 0; k < n; k++) {
                    cr_assert_gt(b[k + 1], b[k], "%s P %d V %d: chunk %d empty", dt_pp_partition_name(kind), P, V, k);
                    double p, f;
                    dt_model_pp_chunk_cost(&g, b, k, &p, &f);
                    ps += p, fs += f;
                }
                cr_assert_float_eq(ps, (double)g.n_params, 0.5, "%s P %d V %d", dt_pp_partition_name(kind), P, V);
                double want = dt_model_flops_per_token(&g);
                cr_assert(fabs(fs - want) <= 1e-9 * want, "flops %g vs %g", fs, want);
            }
    dt_model_layout_free(&g);
}

Test(stages, chunk_costs_sum_to_the_model) {
    dt_model_spec s = gpt_spec(6, 50);
    check_sums(&s);
    s = llama_spec(5, 0);
    check_sums(&s);
    s = llama_spec(5, 1);
    check_sums(&s);
}

Test(stages, partition_errors_name_the_keys) {
    dt_model_layout g;
    dt_model_spec s = gpt_spec(4, 50);
    layout(&s, &g);
    int b[16];
    cr_assert_eq(dt_model_pp_partition(&g, 3, 2, DT_PP_PARTITION_UNIFORM, b), DT_STATUS_CONFIG);
    const char *m = dt_error_detail();
    cr_assert(strstr(m, "pipeline.stages") && strstr(m, "pipeline.virtual_stages") && strstr(m, "4 layers"), "%s", m);
    cr_assert_eq(dt_model_pp_partition(&g, 5, 1, DT_PP_PARTITION_FLOPS, b), DT_STATUS_CONFIG);
    dt_model_layout_free(&g);
    dt_model_spec mlp = {.ops = &dt_model_mlp, .in_dim = 4, .hidden_dim = 8, .n_hidden_layers = 3, .n_classes = 3};
    layout(&mlp, &g);
    cr_assert_eq(dt_model_pp_partition(&g, 2, 1, DT_PP_PARTITION_UNIFORM, b), DT_STATUS_CONFIG);
    cr_assert(strstr(dt_error_detail(), "mlp"), "%s", dt_error_detail());
    dt_model_layout_free(&g);
    dt_pp_partition_t k;
    cr_assert_eq(dt_pp_partition_parse("flops", &k), 0);
    cr_assert_eq(k, DT_PP_PARTITION_FLOPS);
    cr_assert_eq(dt_pp_partition_parse("layers", &k), -1);
    /* a stage of bad bounds */
    s = gpt_spec(4, 50);
    dt_model_layout st;
    cr_assert_eq(dt_model_layout_init_stage(&s, 1, 0, 0, 2, 0, 1, (int[]){0, 0, 4}, &st), DT_STATUS_INVALID);
    cr_assert_eq(dt_model_layout_init_stage(&s, 1, 0, 0, 2, 2, 1, (int[]){0, 2, 4}, &st), DT_STATUS_INVALID);
    cr_assert_eq(dt_model_layout_init_stage(&s, 1, 0, 0, 2, 0, 1, (int[]){0, 2, 5}, &st), DT_STATUS_INVALID);
}

/* ---- stage layouts ---------------------------------------------------------- */

typedef struct cover {
    int *count;           /* per global element: stages (TP ranks counted once for replicated) holding it */
    const float *gvals;   /* the whole model's init */
    const float *lvals;   /* the stage's init */
    int tp_rank, bad;
} cover;

static void cover_piece(void *ctx, size_t local, size_t global, size_t n, int replicated) {
    cover *c = ctx;
    for (size_t i = 0; i < n; i++) {
        if (!replicated || c->tp_rank == 0) c->count[global + i]++;
        if (memcmp(&c->lvals[local + i], &c->gvals[global + i], sizeof(float))) c->bad++;
    }
}

static void check_stages(const dt_model_spec *s, int P, int V, int TP) {
    dt_model_layout g;
    layout(s, &g);
    int L = g.n_units - 2, b[DT_MODEL_MAX_CHUNKS + 1];
    cr_assert_eq(dt_model_pp_partition(&g, P, V, DT_PP_PARTITION_UNIFORM, b), DT_STATUS_OK);
    float *gvals = malloc(g.n_params * sizeof(float));
    dt_model_init_params(&g, 11, gvals);
    int *count = calloc(g.n_params, sizeof(int));
    for (int tr = 0; tr < TP; tr++)
        for (int pr = 0; pr < P; pr++) {
            dt_model_layout st;
            cr_assert_eq(dt_model_layout_init_stage(s, TP, tr, 0, P, pr, V, b, &st), DT_STATUS_OK, "%s",
                         dt_error_detail());
            cr_assert_not_null(st.global);
            cr_assert_eq(st.global->n_params, g.n_params);
            cr_assert_eq(st.n_chunks, V);
            for (int j = 0; j < V; j++) {
                int k = pr + j * P;
                cr_assert_eq(st.chunks[j].l0, b[k]);
                cr_assert_eq(st.chunks[j].l1, b[k + 1]);
                cr_assert_eq(st.chunks[j].first, k == 0);
                cr_assert_eq(st.chunks[j].last, k == P * V - 1);
            }
            cr_assert_eq(dt_model_local_unit(&st, 0) >= 0, pr == 0);
            cr_assert_eq(dt_model_local_unit(&st, L + 1) >= 0, pr == P - 1);
            cr_assert_eq(st.tied_head, 0);
            cr_assert_eq(st.has_tied_copy, g.tied_head && pr == P - 1);
            /* names, shapes and offsets against the whole model's table */
            size_t off = 0;
            for (int u = 0; u < st.n_units; u++) {
                const dt_unit_info *su = &st.units[u];
                const dt_unit_info *gu = &g.units[su->gunit];
                cr_assert_eq(su->n_tensors, gu->n_tensors);
                cr_assert_eq(su->offset, off);
                if (u > 0) cr_assert_gt(su->gunit, st.units[u - 1].gunit);
                for (int i = 0; i < su->n_tensors; i++) {
                    const dt_tensor_info *t = &st.tensors[su->tensor0 + i], *gt = &g.tensors[gu->tensor0 + i];
                    cr_assert_str_eq(t->name, gt->name);
                    cr_assert_eq(t->goffset, gt->offset, "%s", t->name);
                    cr_assert_eq(t->unit, u);
                    cr_assert_eq(t->offset, off);
                    for (int d = 0; d < t->ndim; d++) cr_assert_eq(t->gshape[d], gt->shape[d]);
                    off += t->numel;
                }
                cr_assert_eq(su->numel, off - su->offset);
            }
            cr_assert_eq(st.n_params, off);
            /* the stage's init (dt_model_init_params, and a range of it) is the whole
             * model's at the positions tp_segments names */
            float *lvals = malloc((st.n_params ? st.n_params : 1) * sizeof(float));
            dt_model_init_params(&st, 11, lvals);
            cover c = {.count = count, .gvals = gvals, .lvals = lvals, .tp_rank = tr};
            dt_model_tp_segments(&st, 0, st.n_params, cover_piece, &c);
            cr_assert_eq(c.bad, 0, "P %d V %d TP %d rank (%d, %d): %d values differ", P, V, TP, tr, pr, c.bad);
            size_t a = st.n_params / 3, n = st.n_params / 2;
            float *part = malloc(n * sizeof(float));
            dt_model_init_range(&st, 11, a, n, part);
            cr_assert_eq(memcmp(part, lvals + a, n * sizeof(float)), 0, "init_range of a stage");
            free(part);
            free(lvals);
            dt_model_layout_free(&st);
        }
    for (size_t i = 0; i < g.n_params; i++)
        cr_assert_eq(count[i], 1, "P %d V %d TP %d: global element %zu held %d times", P, V, TP, i, count[i]);
    free(count);
    free(gvals);
    dt_model_layout_free(&g);
}

Test(stages, stage_layouts_partition_the_model) {
    dt_model_spec specs[] = {gpt_spec(8, 50), llama_spec(8, 0), llama_spec(8, 1)};
    for (int m = 0; m < 3; m++)
        for (int TP = 1; TP <= 2; TP++) {
            check_stages(&specs[m], 2, 1, TP);
            check_stages(&specs[m], 4, 1, TP);
            check_stages(&specs[m], 2, 2, TP);
            check_stages(&specs[m], 3, 2, TP);
        }
}

Test(stages, whole_layouts_are_one_chunk) {
    dt_model_spec s = llama_spec(3, 0);
    dt_model_layout g, st;
    layout(&s, &g);
    cr_assert_eq(g.n_chunks, 1);
    cr_assert_eq(g.chunks[0].l0, 0);
    cr_assert_eq(g.chunks[0].l1, 3);
    cr_assert(g.chunks[0].first && g.chunks[0].last);
    for (int u = 0; u < g.n_units; u++) cr_assert_eq(g.units[u].gunit, u);
    cr_assert_eq(g.units[4].tensor0 + g.units[4].n_tensors, g.n_tensors);
    /* pp 1 is the TP layout */
    cr_assert_eq(dt_model_layout_init_stage(&s, 1, 0, 0, 1, 0, 1, (int[]){0, 3}, &st), DT_STATUS_OK);
    cr_assert_eq(st.n_params, g.n_params);
    cr_assert_null(st.global);
    dt_model_layout_free(&st);
    dt_model_layout_free(&g);
}

/* ---- CHAIN == WHOLE ------------------------------------------------------------ */

enum { B = 2, MB = 2 }; /* sequences per micro-batch, micro-batches in flight */

typedef struct stage_net {
    dt_model_layout lay;
    dt_net_t net;
    float *params, *grads;
    float *head_w, *head_dw; /* the tied head's copy (has_tied_copy) */
} stage_net;

/* The whole model's and P stages' losses and gradients for the same two
 * micro-batches; the stages run the chunks in pipeline order (chunk k on rank k % P,
 * its chunk k / P), forward mb0, forward mb1, backward mb0, backward mb1, each
 * (micro-batch, chunk) in its own arena. */
static void chain_equals_whole(const dt_model_spec *s, int P, int V) {
    dt_device_t *dev;
    cr_assert_eq(dt_device_init(&dev, DT_DEVICE_CPU, 1), DT_STATUS_OK, "%s", dt_error_detail());
    dt_model_layout g;
    layout(s, &g);
    int T = g.seq_len, n = P * V, bounds[DT_MODEL_MAX_CHUNKS + 1];
    cr_assert_eq(dt_model_pp_partition(&g, P, V, DT_PP_PARTITION_UNIFORM, bounds), DT_STATUS_OK);
    int32_t tok[MB][B * 8], tgt[MB][B * 8];
    dt_rng rng;
    dt_rng_seed(&rng, 5, 0);
    for (int m = 0; m < MB; m++)
        for (int i = 0; i < B * T; i++) {
            tok[m][i] = (int32_t)dt_rng_below(&rng, (uint64_t)s->vocab_size);
            tgt[m][i] = (int32_t)dt_rng_below(&rng, (uint64_t)s->vocab_size);
        }
    float dscale = 1.0f / (float)(MB * B * T);

    /* the whole model */
    dt_net_t whole;
    float *wp = calloc(g.n_params, sizeof(float)), *wg = calloc(g.n_params, sizeof(float));
    dt_model_init_params(&g, 3, wp);
    cr_assert_eq(dt_net_init(&whole, dev, &g, B), DT_STATUS_OK, "%s", dt_error_detail());
    dt_net_bind(&whole, wp, wg);
    double wloss[MB];
    for (int m = 0; m < MB; m++) {
        dt_batch b = {.tokens = tok[m], .targets = tgt[m]};
        cr_assert_eq(dt_net_forward(&whole, &b, &wloss[m]), DT_STATUS_OK, "%s", dt_error_detail());
        cr_assert_eq(dt_net_backward(&whole, dscale), DT_STATUS_OK);
    }

    /* the stages */
    stage_net *sn = calloc((size_t)P, sizeof *sn);
    const dt_tensor_info *emb = &g.tensors[0];
    for (int r = 0; r < P; r++) {
        stage_net *x = &sn[r];
        cr_assert_eq(dt_model_layout_init_stage(s, 1, 0, 0, P, r, V, bounds, &x->lay), DT_STATUS_OK, "%s",
                     dt_error_detail());
        x->params = calloc(x->lay.n_params, sizeof(float));
        x->grads = calloc(x->lay.n_params, sizeof(float));
        dt_model_init_params(&x->lay, 3, x->params);
        cr_assert_eq(dt_net_init(&x->net, dev, &x->lay, B), DT_STATUS_OK, "%s", dt_error_detail());
        cr_assert_eq(dt_net_arenas(&x->net, MB * V), DT_STATUS_OK); /* one per (micro-batch, chunk) */
        dt_net_bind(&x->net, x->params, x->grads);
        if (x->lay.has_tied_copy) {
            x->head_w = malloc(emb->numel * sizeof(float));
            x->head_dw = calloc(emb->numel, sizeof(float));
            memcpy(x->head_w, wp + emb->offset, emb->numel * sizeof(float));
            x->net.head_w = x->head_w;
            x->net.head_dw = x->head_dw;
        }
        cr_assert_eq(dt_net_stage_elems(&x->net), (size_t)B * T * 16);
        if (r < P - 1) /* no head, no logits: less than the whole model's arena */
            cr_assert_lt(x->net.arena_bytes, whole.arena_bytes);
    }
    size_t es = sizeof(float), bytes = dt_net_stage_elems(&sn[0].net) * es;
    double sloss[MB];
    for (int m = 0; m < MB; m++) /* forwards */
        for (int k = 0; k < n; k++) {
            stage_net *x = &sn[k % P];
            cr_assert_eq(dt_net_use(&x->net, m * V + k / P), DT_STATUS_OK);
            x->net.chunk = k / P;
            if (k > 0) {
                stage_net *prev = &sn[(k - 1) % P];
                cr_assert_eq(dt_net_use(&prev->net, m * V + (k - 1) / P), DT_STATUS_OK);
                prev->net.chunk = (k - 1) / P;
                memcpy(dt_net_stage_buf(&x->net, DT_NET_STAGE_IN), dt_net_stage_buf(&prev->net, DT_NET_STAGE_OUT),
                       bytes);
            }
            dt_batch b = {.tokens = k == 0 ? tok[m] : NULL, .targets = k == n - 1 ? tgt[m] : NULL};
            double loss;
            cr_assert_eq(dt_net_forward(&x->net, &b, &loss), DT_STATUS_OK, "%s", dt_error_detail());
            if (k == n - 1) sloss[m] = loss;
            else cr_assert(isnan(loss));
        }
    for (int m = 0; m < MB; m++) /* backwards */
        for (int k = n - 1; k >= 0; k--) {
            stage_net *x = &sn[k % P];
            cr_assert_eq(dt_net_use(&x->net, m * V + k / P), DT_STATUS_OK);
            x->net.chunk = k / P;
            if (k < n - 1) {
                stage_net *next = &sn[(k + 1) % P];
                cr_assert_eq(dt_net_use(&next->net, m * V + (k + 1) / P), DT_STATUS_OK);
                next->net.chunk = (k + 1) / P;
                memcpy(dt_net_stage_buf(&x->net, DT_NET_STAGE_DOUT), dt_net_stage_buf(&next->net, DT_NET_STAGE_DIN),
                       bytes);
            }
            cr_assert_eq(dt_net_backward(&x->net, dscale), DT_STATUS_OK, "mb %d chunk %d: %s", m, k, dt_error_detail());
        }

    for (int m = 0; m < MB; m++)
        cr_assert(memcmp(&sloss[m], &wloss[m], sizeof(double)) == 0, "P %d V %d mb %d: loss %.17g vs whole %.17g", P,
                  V, m, sloss[m], wloss[m]);
    for (int r = 0; r < P; r++) {
        const stage_net *x = &sn[r];
        for (int i = 0; i < x->lay.n_tensors; i++) {
            const dt_tensor_info *t = &x->lay.tensors[i];
            const float *got = x->grads + t->offset, *want = wg + t->goffset;
            if (t->goffset == emb->offset && g.tied_head) { /* whole = first stage's + the head copy's */
                const stage_net *last = &sn[P - 1];
                double d2 = 0, w2 = 0;
                for (size_t j = 0; j < t->numel; j++) {
                    double sum = (double)got[j] + (double)last->head_dw[j];
                    d2 += (sum - want[j]) * (sum - want[j]);
                    w2 += (double)want[j] * want[j];
                }
                cr_assert_gt(w2, 0);
                cr_assert(sqrt(d2) <= 1e-6 * sqrt(w2), "P %d V %d: tied embedding gradient off by %g relative", P,
                          V, sqrt(d2 / w2));
                continue;
            }
            size_t bad = 0;
            for (size_t j = 0; j < t->numel; j++) bad += memcmp(&got[j], &want[j], sizeof(float)) != 0;
            cr_assert_eq(bad, 0, "P %d V %d rank %d: %zu of %zu gradients of %s differ (%g vs %g)", P, V, r, bad,
                         t->numel, t->name, got[0], want[0]);
        }
    }
    for (int r = 0; r < P; r++) {
        dt_net_free(&sn[r].net);
        dt_model_layout_free(&sn[r].lay);
        free(sn[r].params), free(sn[r].grads), free(sn[r].head_w), free(sn[r].head_dw);
    }
    free(sn);
    dt_net_free(&whole);
    free(wp), free(wg);
    dt_model_layout_free(&g);
    dt_device_free(dev);
}

Test(stages, gpt_chain_equals_whole) {
    dt_model_spec s = gpt_spec(4, 50);
    chain_equals_whole(&s, 2, 1);
    chain_equals_whole(&s, 3, 1);
    chain_equals_whole(&s, 4, 1);
    chain_equals_whole(&s, 2, 2);
}

Test(stages, llama_untied_chain_equals_whole) {
    dt_model_spec s = llama_spec(4, 0);
    chain_equals_whole(&s, 2, 1);
    chain_equals_whole(&s, 3, 1);
    chain_equals_whole(&s, 4, 1);
    chain_equals_whole(&s, 2, 2);
}

Test(stages, llama_tied_chain_equals_whole) {
    dt_model_spec s = llama_spec(4, 1);
    chain_equals_whole(&s, 2, 1);
    chain_equals_whole(&s, 3, 1);
    chain_equals_whole(&s, 4, 1);
    chain_equals_whole(&s, 2, 2);
}

/* Misuse is an error naming what is wrong. */
Test(stages, net_misuse_is_an_error) {
    dt_device_t *dev;
    cr_assert_eq(dt_device_init(&dev, DT_DEVICE_CPU, 1), DT_STATUS_OK);
    dt_model_spec s = gpt_spec(4, 50);
    dt_model_layout st;
    cr_assert_eq(dt_model_layout_init_stage(&s, 1, 0, 0, 2, 1, 2, (int[]){0, 1, 2, 3, 4}, &st), DT_STATUS_OK);
    dt_net_t net;
    cr_assert_eq(dt_net_init(&net, dev, &st, 1), DT_STATUS_OK, "%s", dt_error_detail());
    float *p = calloc(st.n_params, sizeof(float)), *gr = calloc(st.n_params, sizeof(float));
    dt_net_bind(&net, p, gr);
    cr_assert_eq(dt_net_use(&net, 1), DT_STATUS_INVALID);
    cr_assert(strstr(dt_error_detail(), "arena 1"), "%s", dt_error_detail());
    int32_t tok[8] = {0}, tgt[8] = {0};
    dt_batch b = {.tokens = tok, .targets = tgt};
    double loss;
    net.chunk = 1; /* chunk 3 of 4: the last, whose tied head has no weight yet */
    cr_assert_eq(dt_net_forward(&net, &b, &loss), DT_STATUS_INVALID);
    cr_assert(strstr(dt_error_detail(), "head_w"), "%s", dt_error_detail());
    net.chunk = 2;
    cr_assert_eq(dt_net_forward(&net, &b, &loss), DT_STATUS_INVALID);
    net.chunk = 0;
    cr_assert_eq(dt_net_forward(&net, &b, &loss), DT_STATUS_OK, "%s", dt_error_detail());
    net.chunk = 1;
    cr_assert_eq(dt_net_backward(&net, 1), DT_STATUS_INVALID);
    cr_assert(strstr(dt_error_detail(), "chunk 0"), "%s", dt_error_detail());
    float out[64];
    cr_assert_eq(dt_net_logits(&net, tok, 0, 0, out), DT_STATUS_UNSUPPORTED);
    dt_net_free(&net);
    free(p), free(gr);
    dt_model_layout_free(&st);
    dt_device_free(dev);
}
