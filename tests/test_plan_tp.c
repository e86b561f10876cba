/*
 * test_plan_tp.c - dtrun plan's tensor-parallel arithmetic: model states equal to
 * a TP layout's n_params x bytes / strategy (and that count by hand), the sized
 * models' TP cut, activations with and without sequence parallelism by hand, the
 * TP collectives' times and counts, DP over world / TP, the errors naming --tp and
 * the TP reason of the recommendation.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "runtime/model/model.h"
#include "runtime/tools/plan.h"
#include "cli/cmd_plan.h" /* defines: cmd_plan_detail, plan's messages in `dtrun plan`'s flags */

#define assert_near(a, b, tol) \
    cr_assert(fabs((a) - (b)) <= (tol), "%s = %.9g, expected %.9g (±%g)", #a, (double)(a), (double)(b), (double)(tol))

/* gpt: 2 layers, C 16, 2 heads, seq 8, vocab 64 (no padding) */
static const dt_model_spec small_gpt = {.ops = &dt_model_gpt, .n_layer = 2, .n_head = 2, .n_embd = 16,
                                        .seq_len = 8, .vocab_size = 64, .vocab_pad_multiple = 64};

static void tp_model(const dt_model_spec *s, int tp, int sp, dt_model_layout *l, dt_plan_model *m) {
    cr_assert_eq(dt_model_layout_init_tp(s, tp, 0, sp, l), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(dt_plan_model_from_layout(l, m), DT_STATUS_OK);
}

static double states(const dt_plan_row *r) { return r->params + r->grads + r->optim; }

/* A llama of hidden 40, 3 layers, 4 query heads, 2 key/value heads, intermediate
 * 52, seq 8, vocab 77 padded to 128, untied. */
static dt_model_spec small_llama(void) {
    dt_model_spec s = {.ops = &dt_model_llama, .seq_len = 8, .vocab_size = 77, .vocab_pad_multiple = 64};
    const char *paths[] = {"model.hidden_size", "model.num_hidden_layers", "model.num_attention_heads",
                           "model.num_key_value_heads", "model.intermediate_size",
                           "model.max_position_embeddings", "model.tie_word_embeddings", "model.rope_theta"};
    double v[] = {40, 3, 4, 2, 52, 16, 0, 10000};
    for (int i = 0; i < 8; i++) dt_model_key_set(&s, dt_model_key_find(s.ops, paths[i]), v[i]);
    return s;
}

Test(plan_tp, model_states_are_the_tp_layouts_count) {
    dt_model_layout l;
    dt_plan_model m;
    tp_model(&small_gpt, 2, 0, &l, &m);
    /* rank 0's piece by hand (C 16): wte 32 of 64 rows 512 + wpe whole 128; per layer
     * ln1, ln2 64, c_attn (3C x C + 3C) / 2 = 408, attn c_proj C x C / 2 + bias C = 144,
     * c_fc (4C x C + 4C) / 2 = 544, mlp c_proj 4C x C / 2 + C = 528 -> 1688; ln_f 32 */
    cr_assert_eq((long long)l.n_params, 640 + 2 * 1688 + 32);
    cr_assert_eq((long long)m.n_params, (long long)l.n_params);
    cr_assert_eq((long long)m.n_params_global, (long long)l.global->n_params);
    cr_assert_eq(m.tp_size, 2);
    /* replicated: wpe 128, per layer 4C + 2C biases = 96, ln_f 32 */
    cr_assert_eq((long long)m.n_replicated, 128 + 2 * 96 + 32);
    /* FLOPs per token are the whole model's */
    cr_assert_eq(m.flops_per_token, dt_model_flops_per_token(l.global));

    dt_plan_input in;
    dt_plan_input_defaults(&in);
    in.model = m;
    in.mem_bytes = 80e9;
    in.peak_flops = 1e15;
    double np = (double)l.n_params;
    /* 8 GPUs at TP 2: DP 4; bf16 16 bytes per parameter of the piece, by strategy */
    dt_plan_row r;
    cr_assert_eq(dt_plan_row_compute(&in, DT_STRATEGY_DDP, 8, &r), DT_STATUS_OK);
    cr_assert_eq(r.tp, 2);
    cr_assert_eq(r.dp, 4);
    cr_assert_eq(states(&r), 16 * np);
    cr_assert_eq(dt_plan_row_compute(&in, DT_STRATEGY_ZERO1, 8, &r), DT_STATUS_OK);
    cr_assert_eq(states(&r), 4 * np + 12 * ceil(np / 4));
    cr_assert_eq(dt_plan_row_compute(&in, DT_STRATEGY_ZERO2, 8, &r), DT_STATUS_OK);
    cr_assert_eq(states(&r), 2 * np + 14 * ceil(np / 4));
    cr_assert_eq(dt_plan_row_compute(&in, DT_STRATEGY_FSDP, 8, &r), DT_STATUS_OK);
    double shard = 0; /* each local unit padded to the DP size */
    for (int u = 0; u < l.n_units; u++) shard += ceil((double)l.units[u].numel / 4);
    cr_assert_eq(states(&r), 16 * shard);
    cr_assert_eq(r.shard, 4);
    dt_plan_model_free(&m);
    dt_model_layout_free(&l);

    /* llama with GQA, untied, at TP 2 with sequence parallelism: the same rule */
    dt_model_spec ls = small_llama();
    tp_model(&ls, 2, 1, &l, &m);
    cr_assert_eq(m.sequence_parallel, 1);
    in.model = m;
    cr_assert_eq(dt_plan_row_compute(&in, DT_STRATEGY_ZERO2, 4, &r), DT_STATUS_OK);
    np = (double)l.n_params;
    cr_assert_eq(states(&r), 2 * np + 14 * ceil(np / 2));
    cr_assert_lt(np, (double)l.global->n_params);
    dt_plan_model_free(&m);
    dt_model_layout_free(&l);
}

Test(plan_tp, sized_models_cut_the_matrices_and_vocabulary) {
    dt_plan_model m;
    cr_assert_eq(dt_plan_model_from_sizes(7e9, 32, 4096, 32, 2048, 50304, &m), DT_STATUS_OK);
    double C = 4096, block = 12 * C * C + 13 * C, rest = 7e9 - 32 * block;
    cr_assert_eq(dt_plan_model_set_tp(&m, 4, 0), DT_STATUS_OK);
    double want = 32 * ((12 * C * C + 7 * C) / 4 + 6 * C) + 50304 * C / 4 + (rest - 50304 * C);
    assert_near(m.n_params, want, 1e-3);
    assert_near(m.n_replicated, 32 * 6 * C + rest - 50304 * C, 1e-3);
    cr_assert_eq(m.n_params_global, 7e9);
    cr_assert_eq(dt_plan_model_set_tp(&m, 3, 0), DT_STATUS_USAGE);
    cr_assert(strstr(cmd_plan_detail(), "--tp 3"), "%s", cmd_plan_detail());
    dt_plan_model_free(&m);
}

Test(plan_tp, activations_by_hand) {
    dt_model_layout l;
    dt_plan_model m;
    /* B 2, T 8 (BT 16), C 16, fp32, CPU attention with 1 thread; at TP 2 a rank has
     * 1 head of 8, qkv 24, MLP 32 and 32 vocabulary rows wide.
     * without sequence parallelism (rows 16):
     *   layer: 6 x BTC 6144, atty 512, 4 LayerNorm stats 256, qkv 1536, fch +
     *          fch_gelu 4096, attention 4*2*1*8*8 = 512                    -> 13056
     *   once:  tokens + targets + positions 192, encoded + lnf 2048, lnf stats 128, losses 64,
     *          logits 16*32*4 = 2048, dres 1024, dtmp 16*max(16, 8)*4 = 1024,
     *          dqkv 1536, dfch x2 4096, attention scratch 256, the loss's max,
     *          sum and target logit 3*16*4 = 192                           -> 12608 */
    tp_model(&small_gpt, 2, 0, &l, &m);
    cr_assert_eq(dt_plan_activation_bytes(&m, 2, 4, 1, 0), 2 * 13056 + 12608);
    dt_plan_model_free(&m);
    dt_model_layout_free(&l);
    /* with sequence parallelism the slots outside the TP regions have 8 rows:
     *   layer: 6 x 512, atty 512, stats 4 x slot(32) = 256, qkv 1536, 4096, 512 -> 9984
     *   once:  192, encoded + lnf 1024, lnf stats 128, losses 64, logits 2048,
     *          dres 512, dtmp 1024, dqkv 1536, dfch x2 4096, scratch 256, the
     *          gathered norm output, the partial sums (the gathered gradient in
     *          the backward) 2 x 16*16*4 = 2048, the reduced rows 8*16*4 = 512, a
     *          layer's partial norm gradients 4*16*4 = 256, the loss's stats 192
     *                                                                      -> 13888
     * full recomputation: two layer outputs of 512, one layer's set less them (the
     * scratch), the once-part */
    tp_model(&small_gpt, 2, 1, &l, &m);
    cr_assert_eq(dt_plan_activation_bytes(&m, 2, 4, 1, 0), 2 * 9984 + 13888);
    cr_assert_eq(dt_plan_activation_bytes(&m, 2, 4, 1, DT_MODEL_RECOMPUTE_FULL), 2 * 512 + (9984 - 512) + 13888);
    dt_plan_model_free(&m);
    dt_model_layout_free(&l);
    /* TP 1 is today's formula (test_plan.c holds it to the arena) */
    tp_model(&small_gpt, 1, 1, &l, &m);
    cr_assert_eq(m.sequence_parallel, 0);
    cr_assert_eq(dt_plan_activation_bytes(&m, 2, 4, 1, 0), 2 * 19712 + 20096);
    dt_plan_model_free(&m);
    dt_model_layout_free(&l);
}

static dt_plan_input input_7b_tp(int tp, int sp) {
    dt_plan_input in;
    dt_plan_input_defaults(&in);
    cr_assert_eq(dt_plan_model_from_sizes(7e9, 32, 4096, 32, 2048, 50304, &in.model), DT_STATUS_OK);
    cr_assert_eq(dt_plan_model_set_tp(&in.model, tp, sp), DT_STATUS_OK);
    in.mem_bytes = 80.0 * 1073741824.0;
    in.peak_flops = 989e12;
    in.intra.alpha_us = in.inter.alpha_us = 0;
    return in;
}

Test(plan_tp, collectives_by_hand) {
    /* TP 4, B 1, T 2048, C 4096, bf16 on NVLink 4 (450 GB/s, no latency): S = B·T·C·2;
     * forward 2 all-reduces per layer + the embedding's, backward 2 + the head's, each
     * 2·3/4·S / 450e9; the loss's all-reduces of 4·B·T (max) and 8·B·T bytes (sums) */
    dt_plan_input in = input_7b_tp(4, 0);
    double S = 2048.0 * 4096 * 2, ar = 2.0 * 3 / 4 * S / 450e9, loss = 2.0 * 3 / 4 * 2048 * 12 / 450e9;
    dt_plan_tp_comm t = dt_plan_tp_comm_time(&in.model, 1, 2, &in.intra);
    assert_near(t.fwd_s, 65 * ar + loss, 1e-12);
    assert_near(t.bwd_s, 65 * ar, 1e-12);
    cr_assert_eq(t.fwd_coll, 67);
    cr_assert_eq(t.bwd_coll, 65);
    /* one step of 3 micro-batches on 8 GPUs (DP 2): all of it exposed, compute / 4 */
    in.accum = 3;
    dt_plan_row r;
    cr_assert_eq(dt_plan_row_compute(&in, DT_STRATEGY_DDP, 8, &r), DT_STATUS_OK);
    assert_near(r.tp_comm_s, 3 * (65 * ar + loss + 65 * ar), 1e-12);
    double fpt = 6 * 7e9 + 12.0 * 32 * 4096 * 2048;
    cr_assert_eq(r.fit, DT_PLAN_FIT_YES);
    assert_near(r.compute_s, fpt * 3 * 2048 / 4 / (989e12 * 0.4), 1e-12);
    double psi = in.model.n_params, buckets = ceil(psi / 6553600);
    double dp_ar = 2.0 * 1 / 2 * psi * 2 / 450e9; /* gradients of the piece over DP 2 */
    assert_near(r.comm_s - r.tp_comm_s, dp_ar, 1e-9);
    assert_near(r.exposed_s, fmax(dp_ar - r.compute_s / 3 * 2 / 3, 2.0 / 2 * 6553600 * 2 / 450e9) + r.tp_comm_s,
                1e-9);
    assert_near(r.step_s, r.compute_s + r.exposed_s, 1e-12);
    cr_assert_eq(r.n_collectives, buckets + 3 * (67 + 65));
    assert_near(r.tokens_per_s, 2 * 3 * 2048 / r.step_s, 1e-6); /* DP 2 groups' tokens */
    dt_plan_model_free(&in.model);

    /* sequence parallelism, as the models issue it: forward per layer 2 all-gathers +
     * 2 reduce-scatters (each 3/4·S / 450e9, half an all-reduce), + the embedding's
     * reduce-scatter and the final norm's gather; backward per layer 4 gathers + 2
     * reduce-scatters + the all-reduce of its norms' gradients (2 LayerNorms of w|b: 4C
     * bf16), + the head's reduce-scatter, the final norm's all-reduce (2C) and the
     * embedding's gather */
    in = input_7b_tp(4, 1);
    t = dt_plan_tp_comm_time(&in.model, 1, 2, &in.intra);
    double half = ar / 2, ng = 2.0 * 3 / 4 * 4 * 4096 * 2 / 450e9;
    assert_near(t.fwd_s, 32 * 4 * half + 2 * half + loss, 1e-12);
    assert_near(t.bwd_s, 32 * (6 * half + ng) + 2 * half + ng / 2, 1e-12);
    cr_assert_eq(t.fwd_coll, 4 * 32 + 4);
    cr_assert_eq(t.bwd_coll, 7 * 32 + 3);
    dt_plan_model_free(&in.model);

    /* TP 1: nothing */
    in = input_7b_tp(1, 0);
    t = dt_plan_tp_comm_time(&in.model, 1, 2, &in.intra);
    cr_assert_eq(t.fwd_s + t.bwd_s + t.fwd_coll, 0);
    dt_plan_model_free(&in.model);
}

Test(plan_tp, bad_sizes_name_tp) {
    dt_plan_input in = input_7b_tp(4, 0);
    dt_plan_row r;
    cr_assert_eq(dt_plan_row_compute(&in, DT_STRATEGY_DDP, 2, &r), DT_STATUS_USAGE);
    cr_assert(strstr(cmd_plan_detail(), "--tp 4"), "%s", cmd_plan_detail());
    in.gpus_per_node = 6; /* a TP group may not span nodes */
    cr_assert_eq(dt_plan_row_compute(&in, DT_STRATEGY_DDP, 12, &r), DT_STATUS_USAGE);
    cr_assert(strstr(cmd_plan_detail(), "--tp 4") && strstr(cmd_plan_detail(), "per node"), "%s",
              dt_error_detail());
    dt_plan_model_free(&in.model);
}

/* rows of strategy s at TP 1 and 2 on n GPUs */
static void two_rows(dt_strategy_t s, int n, double mem, dt_plan_row rows[2]) {
    for (int k = 0; k < 2; k++) {
        dt_plan_input in = input_7b_tp(k + 1, 0);
        in.mem_bytes = mem;
        cr_assert_eq(dt_plan_row_compute(&in, s, n, &rows[k]), DT_STATUS_OK);
        dt_plan_model_free(&in.model);
    }
}

Test(plan_tp, recommendation_says_why_the_tp_size) {
    dt_plan_input in = input_7b_tp(1, 0);
    dt_plan_row rows[2];
    dt_plan_choice ch;
    /* DDP on 2 GPUs: 112 GB of states at TP 1, about 59 at TP 2 (80 GiB GPUs) */
    two_rows(DT_STRATEGY_DDP, 2, 80.0 * 1073741824.0, rows);
    cr_assert_eq(rows[0].fit, DT_PLAN_FIT_NO);
    cr_assert_neq(rows[1].fit, DT_PLAN_FIT_NO);
    dt_plan_recommend(&in, rows, 2, &ch);
    cr_assert_eq(ch.cheapest, 1);
    cr_assert(strstr(ch.tp_reason, "fits only with TP>=2"), "%s", ch.tp_reason);
    cr_assert(strstr(ch.cheapest_reason, "at TP 2 x DP 1"), "%s", ch.cheapest_reason);
    /* FSDP on 4 GPUs fits at both: TP 1 wins, its communication overlaps compute */
    two_rows(DT_STRATEGY_FSDP, 4, 80.0 * 1073741824.0, rows);
    cr_assert_eq(rows[0].fit, DT_PLAN_FIT_YES);
    cr_assert_eq(rows[1].fit, DT_PLAN_FIT_YES);
    dt_plan_recommend(&in, rows, 2, &ch);
    cr_assert_eq(ch.cheapest, 0);
    cr_assert(strstr(ch.tp_reason, "TP 1 preferred") && strstr(ch.tp_reason, "critical path"), "%s",
              ch.tp_reason);
    /* only TP 1 rows: no TP reason */
    dt_plan_recommend(&in, rows, 1, &ch);
    cr_assert_str_eq(ch.tp_reason, "");
    dt_plan_model_free(&in.model);
}
