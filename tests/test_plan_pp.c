/*
 * test_plan_pp.c - dtrun plan's pipeline arithmetic: each stage's activations equal
 * the arena net.c allocates for that stage's layout (gpt and llama, P 2 and 4, 1f1b,
 * gpipe and interleaved, TP 1 and 2), times the arenas the schedule holds; model
 * states from the stage layouts plus the tied head's copy; the sized models' stages;
 * the bubble against dt_pp_bubble_ideal; the P2P traffic by hand; errors naming the
 * flag; a stage's recomputation policy chosen for the arenas it holds.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"
#include "runtime/model/model.h"
#include "runtime/model/net.h"
#include "runtime/layout/pp_sched.h"
#include "runtime/tools/plan.h"
#include "cli/cmd_plan.h" /* defines: cmd_plan_detail, plan's messages in `dtrun plan`'s flags */

#define assert_near(a, b, tol) \
    cr_assert(fabs((a) - (b)) <= (tol), "%s = %.9g, expected %.9g (±%g)", #a, (double)(a), (double)(b), (double)(tol))

static const dt_model_spec gpt4 = {.ops = &dt_model_gpt, .n_layer = 4, .n_head = 4, .n_embd = 64, .seq_len = 100,
                                   .vocab_size = 256, .vocab_pad_multiple = 64};

/* A llama of hidden 40, 4 layers, 4 query heads, nkv key/value heads, vocab 77 -> 128. */
static dt_model_spec llama4(int tied, int nkv) {
    dt_model_spec s = {.ops = &dt_model_llama, .seq_len = 9, .vocab_size = 77, .vocab_pad_multiple = 64};
    const char *paths[] = {"model.hidden_size", "model.num_hidden_layers", "model.num_attention_heads",
                           "model.num_key_value_heads", "model.intermediate_size", "model.max_position_embeddings",
                           "model.rope_theta", "model.tie_word_embeddings"};
    double v[] = {40, 4, 4, nkv, 52, 16, 10000, tied};
    for (int i = 0; i < 8; i++) dt_model_key_set(&s, dt_model_key_find(s.ops, paths[i]), v[i]);
    return s;
}

/* The plan model of spec at (tp, sp) cut into P ranks of V chunks. */
static void pp_model(const dt_model_spec *s, int tp, int sp, int P, int V, int part, dt_plan_model *m) {
    dt_model_layout l;
    cr_assert_eq(dt_model_layout_init_tp(s, tp, 0, sp, &l), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(dt_plan_model_from_layout(&l, m), DT_STATUS_OK);
    dt_model_layout_free(&l);
    cr_assert_eq(dt_plan_model_set_pp_layout(m, s, tp, sp, P, V, part), DT_STATUS_OK, "%s", dt_error_detail());
}

static void cpu_input(dt_plan_input *in, int accum, int schedule) {
    dt_plan_input_defaults(in);
    in->precision = DT_PLAN_PRECISION_FP32;
    in->comm_bytes = 4;
    in->gpu_attention = 0;
    in->cpu_threads = 3;
    in->mem_bytes = 1e12;
    in->peak_flops = 1e12;
    in->accum = accum;
    in->pp_schedule = schedule;
}

/* Each stage's one-arena bytes are net.c's for that stage's layout, byte for byte,
 * and the row's activations are the schedule's arenas times them. */
Test(plan_pp, activations_per_stage_match_the_arena) {
    dt_device_t *dev;
    cr_assert_eq(dt_device_init(&dev, DT_DEVICE_CPU, 3), DT_STATUS_OK, "%s", dt_error_detail());
    dt_model_spec specs[] = {gpt4, llama4(0, 2), llama4(1, 4)};
    struct { int P, V, sched; } pipes[] = {{2, 1, DT_PP_1F1B}, {4, 1, DT_PP_1F1B}, {2, 1, DT_PP_GPIPE},
                                           {4, 1, DT_PP_GPIPE}, {2, 2, DT_PP_INTERLEAVED}};
    int checked = 0;
    for (size_t i = 0; i < sizeof specs / sizeof *specs; i++)
        for (size_t p = 0; p < sizeof pipes / sizeof *pipes; p++)
            for (int tp = 1; tp <= 2; tp++)
                for (int sp = 0; sp <= (tp > 1); sp++) {
                    int P = pipes[p].P, V = pipes[p].V, B = 2, M = 4;
                    dt_plan_model m;
                    pp_model(&specs[i], tp, sp, P, V, 0, &m);
                    int bounds[16];
                    dt_model_layout g;
                    cr_assert_eq(dt_model_layout_init(&specs[i], &g), DT_STATUS_OK);
                    cr_assert_eq(dt_model_pp_partition(&g, P, V, DT_PP_PARTITION_UNIFORM, bounds), DT_STATUS_OK);
                    dt_model_layout_free(&g);
                    dt_plan_input in;
                    cpu_input(&in, M, pipes[p].sched);
                    in.micro_batch = B;
                    in.model = m;
                    dt_plan_row row, stages[4];
                    cr_assert_eq(dt_plan_row_compute_pp(&in, DT_STRATEGY_DDP, tp * P, &row, stages), DT_STATUS_OK, "%s",
                                 dt_error_detail());
                    double worst = 0;
                    for (int k = 0; k < P; k++) {
                        dt_model_layout l;
                        cr_assert_eq(dt_model_layout_init_stage(&specs[i], tp, 0, sp, P, k, V, bounds, &l),
                                     DT_STATUS_OK, "%s", dt_error_detail());
                        double want = (double)dt_net_arena_bytes(dev, &l, B);
                        dt_plan_model view;
                        dt_plan_stage_view(&m, k, &view);
                        double got = dt_plan_activation_bytes(&view, B, 4, 3, 0);
                        cr_assert_eq(got, want, "spec %zu P %d V %d TP %d sp %d stage %d: plan %.0f, net.c %.0f", i,
                                     P, V, tp, sp, k, got, want);
                        int arenas = dt_pp_arenas(pipes[p].sched, P, V, M, k);
                        cr_assert_eq(stages[k].acts, arenas * want);
                        cr_assert_eq(stages[k].arenas, arenas);
                        /* model states: the stage layout's elements, fp32 DDP 16 bytes each */
                        double copy = l.has_tied_copy ? 2.0 * 4 * m.stages[k].tied_copy : 0;
                        cr_assert_eq(stages[k].params + stages[k].grads + stages[k].optim,
                                     16.0 * (double)l.n_params + copy);
                        worst = fmax(worst, stages[k].total);
                        dt_model_layout_free(&l);
                        checked++;
                    }
                    cr_assert_eq(row.total, worst, "the row shows the worst stage");
                    cr_assert_eq(row.total, stages[row.worst_stage].total);
                    dt_plan_model_free(&m);
                }
    cr_assert_geq(checked, 80, "only %d stages checked", checked);
    dt_device_free(dev);
}

/* 1f1b's first stage holds P arenas, gpipe's m: the first stage is the worst. */
Test(plan_pp, first_stage_holds_the_most_under_1f1b) {
    dt_plan_model m;
    pp_model(&gpt4, 1, 0, 4, 1, 0, &m);
    dt_plan_input in;
    cpu_input(&in, 8, DT_PP_1F1B);
    in.model = m;
    dt_plan_row r, st[4];
    cr_assert_eq(dt_plan_row_compute_pp(&in, DT_STRATEGY_ZERO1, 4, &r, st), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(st[0].arenas, dt_pp_arenas(DT_PP_1F1B, 4, 1, 8, 0));
    cr_assert_leq(st[0].arenas, 5); /* P, plus one received ahead */
    cr_assert_gt(st[0].arenas, st[3].arenas);
    in.pp_schedule = DT_PP_GPIPE;
    cr_assert_eq(dt_plan_row_compute_pp(&in, DT_STRATEGY_ZERO1, 4, &r, st), DT_STATUS_OK);
    cr_assert_geq(st[0].arenas, 8);
    dt_plan_model_free(&m);
}

/* Recomputation's policy is chosen per stage for the arenas it holds: where the
 * schedule's arenas of selective's bytes exceed the memory and full's fit, the stage
 * plans full (its bytes, the arena formula's times the arenas) and the job fits. */
Test(plan_pp, recompute_policy_for_the_stage_arenas) {
    dt_plan_model m;
    pp_model(&gpt4, 1, 0, 2, 1, 0, &m);
    dt_plan_input in;
    cpu_input(&in, 8, DT_PP_1F1B);
    in.micro_batch = 4;
    in.model = m;
    dt_plan_row r, st[2];
    cr_assert_eq(dt_plan_row_compute_pp(&in, DT_STRATEGY_DDP, 2, &r, st), DT_STATUS_OK, "%s", dt_error_detail());
    dt_plan_model view;
    dt_plan_stage_view(&m, 0, &view);
    double sel = dt_plan_activation_bytes(&view, 4, 4, 3, DT_MODEL_RECOMPUTE_SELECTIVE);
    double full = dt_plan_activation_bytes(&view, 4, 4, 3, DT_MODEL_RECOMPUTE_FULL);
    int arenas = st[0].arenas;
    cr_assert_geq(arenas, 2);
    double states = st[0].params + st[0].grads + st[0].optim + st[0].comm_buf;
    cr_assert_lt(states + sel, states + arenas * full, "one arena of selective must fit where full's arenas do");
    cr_assert_gt(arenas * sel, arenas * full);
    /* usable memory: full's arenas and half the gap to selective's */
    in.mem_bytes *= (states + arenas * (full + sel) / 2) / st[0].usable;
    cr_assert_eq(dt_plan_row_compute_pp(&in, DT_STRATEGY_DDP, 2, &r, st), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(st[0].ckpt_policy, DT_MODEL_RECOMPUTE_FULL);
    assert_near(st[0].acts_ckpt, arenas * full, 1e-6);
    cr_assert_eq(r.fit, DT_PLAN_FIT_CKPT, "fit %d: full recomputation fits every stage", r.fit);
    dt_plan_model_free(&m);
}

/* The tied head's copy on the last stage: param + grad in the compute dtype, no
 * optimizer state, counted in the row's params and grads. */
Test(plan_pp, tied_copy_on_the_last_stage) {
    dt_plan_model m;
    pp_model(&gpt4, 2, 0, 2, 1, 0, &m);
    cr_assert_eq(m.stages[0].tied_copy, 0);
    cr_assert_eq(m.stages[1].tied_copy, 128 * 64); /* Vp 256 / TP 2 rows of C 64 */
    dt_plan_input in;
    dt_plan_input_defaults(&in);
    in.model = m;
    in.accum = 2;
    in.pp_schedule = DT_PP_1F1B;
    in.mem_bytes = 80e9;
    in.peak_flops = 1e15;
    dt_plan_row r, st[2];
    cr_assert_eq(dt_plan_row_compute_pp(&in, DT_STRATEGY_FSDP, 8, &r, st), DT_STATUS_OK, "%s", dt_error_detail());
    dt_plan_model v;
    dt_plan_stage_view(&m, 1, &v);
    dt_plan_mem ms = dt_plan_model_states(&v, DT_PLAN_PRECISION_BF16, DT_STRATEGY_FSDP, 2, 2);
    cr_assert_eq(st[1].params, ms.params + 2.0 * 128 * 64);
    cr_assert_eq(st[1].grads, ms.grads + 2.0 * 128 * 64);
    cr_assert_eq(st[1].optim, ms.optim);
    cr_assert_eq(r.dp, 2); /* 8 GPUs = TP 2 x PP 2 x DP 2 */
    dt_plan_model_free(&m);
}

/* A sized model with balanced stages (every parameter in the blocks): the time is
 * (m + P - 1) micro-batch slots, the bubble share is the formula, the P2P traffic
 * is 2 messages of B·T·C per micro-batch per boundary, one per boundary exposed. */
Test(plan_pp, sized_bubble_and_p2p_by_hand) {
    int L = 8, C = 256, T = 512, heads = 4;
    double block = 12.0 * C * C + 13.0 * C;
    for (int sched = DT_PP_GPIPE; sched <= DT_PP_INTERLEAVED; sched++)
        for (int P = 2; P <= 4; P *= 2) {
            int V = sched == DT_PP_INTERLEAVED ? 2 : 1, M = 8;
            dt_plan_model m;
            cr_assert_eq(dt_plan_model_from_sizes(L * block, L, C, heads, T, 64, &m), DT_STATUS_OK);
            cr_assert_eq(dt_plan_model_set_pp(&m, P, V, 0), DT_STATUS_OK, "%s", dt_error_detail());
            double fl = 0;
            for (int k = 0; k < P; k++) {
                cr_assert_eq(m.stages[k].blocks, L / P);
                fl += m.stages[k].flops_per_token;
            }
            assert_near(fl, m.flops_per_token, 1e-6 * fl);
            dt_plan_input in;
            dt_plan_input_defaults(&in);
            in.model = m;
            in.accum = M;
            in.micro_batch = 2;
            in.pp_schedule = sched;
            in.mem_bytes = 80e9;
            in.peak_flops = 1e15;
            dt_plan_row r;
            cr_assert_eq(dt_plan_row_compute(&in, DT_STRATEGY_DDP, P, &r), DT_STATUS_OK, "%s", dt_error_detail());
            double t_mb = m.flops_per_token / P * 2 * T / (1e15 * 0.4); /* one stage, one micro-batch */
            assert_near(r.compute_s, M * t_mb, 1e-9 * M * t_mb);
            double ideal = dt_pp_bubble_ideal(sched, P, V, M);
            cr_assert_eq(r.bubble_ideal, ideal);
            assert_near(r.bubble_s / (r.compute_s + r.bubble_s), ideal, 1e-9);
            double S = 2.0 * T * C * 2, link = S / 450e9 + 10e-6;
            assert_near(r.p2p_exposed_s, (P * V - 1) * link, 1e-12);
            /* the busiest rank's sends: a middle rank 2 per chunk; at P 2 one fewer */
            assert_near(r.p2p_bytes, (double)M * S * (2 * V - (P == 2 ? 1 : 0)), 1e-6);
            cr_assert_eq(r.p2p_inter, 0);
            assert_near(r.step_s, r.compute_s + r.bubble_s + r.exposed_s, 1e-12);
            assert_near(r.efficiency, M * t_mb / r.step_s, 1e-9);
            dt_plan_model_free(&m);
        }
}

/* TP 8 x PP 2 on 2 nodes of 8: the stage boundary crosses nodes (the inter-node
 * link); TP 4 x PP 2 stays in a node. */
Test(plan_pp, p2p_link_crosses_nodes_when_the_pipeline_does) {
    dt_plan_model m;
    cr_assert_eq(dt_plan_model_from_shape(70e9, 80, 8192, 64, 8, 28672, 4096, 128256, &m), DT_STATUS_OK, "%s",
                 dt_error_detail());
    cr_assert_eq(dt_plan_model_set_tp(&m, 8, 1), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(dt_plan_model_set_pp(&m, 2, 1, 0), DT_STATUS_OK);
    dt_plan_input in;
    dt_plan_input_defaults(&in);
    in.model = m;
    in.accum = 16;
    in.pp_schedule = DT_PP_1F1B;
    in.mem_bytes = 80.0 * (1 << 30);
    in.peak_flops = 989e12;
    dt_plan_row r;
    cr_assert_eq(dt_plan_row_compute(&in, DT_STRATEGY_ZERO1, 16, &r), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(r.p2p_inter, 1);
    double S = 4096.0 * 8192 * 2 / 8; /* B·T·C bf16 / TP (sequence parallelism) */
    assert_near(r.p2p_exposed_s, S / 50e9 + 30e-6, 1e-12);
    cr_assert_eq(r.dp, 1);
    dt_plan_model_free(&m);
    cr_assert_eq(dt_plan_model_from_shape(70e9, 80, 8192, 64, 8, 28672, 4096, 128256, &m), DT_STATUS_OK);
    cr_assert_eq(dt_plan_model_set_tp(&m, 4, 1), DT_STATUS_OK);
    cr_assert_eq(dt_plan_model_set_pp(&m, 2, 1, 0), DT_STATUS_OK);
    in.model = m;
    cr_assert_eq(dt_plan_row_compute(&in, DT_STRATEGY_ZERO1, 16, &r), DT_STATUS_OK);
    cr_assert_eq(r.p2p_inter, 0);
    cr_assert_eq(r.dp, 2);
    dt_plan_model_free(&m);
}

/* parameters / flops partitions balance what they say (the sized model's first
 * and last stages carry the embedding and the head). */
Test(plan_pp, sized_partitions_balance) {
    dt_plan_model m;
    /* vocabulary rows as big as 4 blocks: the end stages get fewer blocks */
    int C = 64, L = 16;
    /* 2 heads of 32, 2 key/value heads, intermediate 96: q/k/v 6·32·C, output
     * 2·32·C, SwiGLU 3·C·96, norms 2C */
    double block = 6.0 * 32 * C + 2.0 * 32 * C + 3.0 * C * 96 + 2 * C, V = 4 * block / C;
    cr_assert_eq(dt_plan_model_from_shape(L * block + 2 * V * C, L, C, 2, 2, 96, 32, (int)V, &m), DT_STATUS_OK,
                 "%s", dt_error_detail());
    cr_assert_eq(m.size_block, block);
    cr_assert_eq(dt_plan_model_set_pp(&m, 4, 1, 1), DT_STATUS_OK, "%s", dt_error_detail());
    /* 24 blocks' worth over 4 stages: the embedding and head as 4 blocks each */
    cr_assert_eq(m.stages[0].blocks, 2);
    cr_assert_eq(m.stages[3].blocks, 2);
    int sum = 0;
    double most = 0, least = INFINITY;
    for (int k = 0; k < 4; k++) {
        sum += m.stages[k].blocks;
        most = fmax(most, m.stages[k].n_params);
        least = fmin(least, m.stages[k].n_params);
    }
    cr_assert_eq(sum, L);
    cr_assert_lt(most - least, 2 * m.size_block, "parameters within two blocks: %g .. %g", least, most);
    cr_assert_eq(dt_plan_model_set_pp(&m, 4, 1, 0), DT_STATUS_OK);
    for (int k = 0; k < 4; k++) cr_assert_eq(m.stages[k].blocks, 4);
    dt_plan_model_free(&m);
}

Test(plan_pp, errors_name_the_flag) {
    dt_plan_model m;
    cr_assert_eq(dt_plan_model_from_sizes(1e9, 24, 2048, 16, 2048, 50304, &m), DT_STATUS_OK);
    cr_assert_eq(dt_plan_model_set_pp(&m, 25, 1, 0), DT_STATUS_USAGE);
    cr_assert(strstr(cmd_plan_detail(), "--pp 25") && strstr(cmd_plan_detail(), "24 layers"), "%s",
              dt_error_detail());
    /* a P that does not divide the layers cuts as the trainer does (uniform: the extra
     * blocks to the last stages; pipeline.stages 5 of 24 layers trains) */
    cr_assert_eq(dt_plan_model_set_pp(&m, 5, 1, 0), DT_STATUS_OK, "%s", dt_error_detail());
    int want[] = {4, 5, 5, 5, 5};
    for (int k = 0; k < 5; k++) cr_assert_eq(m.stages[k].blocks, want[k], "stage %d", k);
    cr_assert_eq(dt_plan_model_set_pp(&m, 8, 4, 0), DT_STATUS_USAGE);
    cr_assert(strstr(cmd_plan_detail(), "--virtual-stages 4"), "%s", cmd_plan_detail());
    cr_assert_eq(dt_plan_model_set_pp(&m, 4, 1, 0), DT_STATUS_OK);
    dt_plan_input in;
    dt_plan_input_defaults(&in);
    in.model = m;
    in.accum = 2;
    in.pp_schedule = DT_PP_1F1B;
    in.mem_bytes = 80e9;
    in.peak_flops = 1e15;
    dt_plan_row r;
    cr_assert_eq(dt_plan_row_compute(&in, DT_STRATEGY_DDP, 8, &r), DT_STATUS_USAGE);
    cr_assert(strstr(cmd_plan_detail(), "--accum 2") && strstr(cmd_plan_detail(), "1f1b"), "%s", cmd_plan_detail());
    in.accum = 4;
    cr_assert_eq(dt_plan_row_compute(&in, DT_STRATEGY_DDP, 6, &r), DT_STATUS_USAGE);
    cr_assert(strstr(cmd_plan_detail(), "--pp 4"), "%s", cmd_plan_detail());
    dt_plan_model_free(&m);

    dt_model_spec mlp = {.ops = &dt_model_mlp, .in_dim = 5, .hidden_dim = 7, .n_hidden_layers = 2, .n_classes = 3};
    dt_model_layout l;
    cr_assert_eq(dt_model_layout_init(&mlp, &l), DT_STATUS_OK);
    cr_assert_eq(dt_plan_model_from_layout(&l, &m), DT_STATUS_OK);
    dt_model_layout_free(&l);
    cr_assert_eq(dt_plan_model_set_pp_layout(&m, &mlp, 1, 0, 2, 1, 0), DT_STATUS_USAGE);
    cr_assert(strstr(cmd_plan_detail(), "--pp 2") && strstr(cmd_plan_detail(), "no pipeline stages"), "%s",
              dt_error_detail());
    dt_plan_model_free(&m);
}
