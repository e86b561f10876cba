/*
 * test_layout.c - the parallel layout (runtime/layout/layout.h) and the strategy table
 * (runtime/layout/strategy.h): every rank's coordinates are TP innermost, then PP,
 * then DP; a group's index is the colour tp.c splits by; a world the sizes do not
 * divide is DT_STATUS_CONFIG with the config's message; the table's facts are the
 * strategies' (stage, what is sharded over which group, names).
 */
#include <criterion/criterion.h>
#include <string.h>

#include "runtime/layout/layout.h"
#include "runtime/layout/strategy.h"

Test(layout, coordinates_and_groups) {
    for (int T = 1; T <= 4; T++)
        for (int P = 1; P <= 3; P++)
            for (int D = 1; D <= 3; D++) {
                int world = T * P * D;
                dt_layout_dims dims = dt_layout_dims_tp_pp(T, P);
                for (int r = 0; r < world; r++) {
                    dt_layout l;
                    cr_assert_eq(dt_layout_of(&dims, world, r, &l), DT_STATUS_OK);
                    cr_assert_eq(dt_layout_tp_size(&l), T);
                    cr_assert_eq(dt_layout_pp_size(&l), P);
                    cr_assert_eq(dt_layout_dp_size(&l), D);
                    cr_assert_eq(dt_layout_replica_size(&l), T * P);
                    int tr = r % T, pr = (r / T) % P, dr = r / (T * P);
                    cr_assert_eq(dt_layout_tp_rank(&l), tr);
                    cr_assert_eq(dt_layout_pp_rank(&l), pr);
                    cr_assert_eq(dt_layout_dp_rank(&l), dr);
                    cr_assert_eq((dr * P + pr) * T + tr, r);
                    cr_assert_eq(l.stride[DT_LAYOUT_PP], T);
                    /* the colours dt_tp_split has always used */
                    cr_assert_eq(dt_layout_group_index(&l, DT_LAYOUT_TP), dr * P + pr);
                    cr_assert_eq(dt_layout_group_index(&l, DT_LAYOUT_PP), dr * T + tr);
                    cr_assert_eq(dt_layout_group_index(&l, DT_LAYOUT_DP), pr * T + tr);
                }
            }
}

Test(layout, a_world_the_sizes_do_not_divide) {
    dt_layout l;
    dt_layout_dims d = dt_layout_dims_tp_pp(2, 1);
    cr_assert_eq(dt_layout_of(&d, 3, 0, &l), DT_STATUS_CONFIG);
    cr_assert_str_eq(dt_error_detail(), "tensor_parallel.size 2: expected a divisor of the world size 3 (world = "
                                        "tensor_parallel.size x data-parallel ranks), found 3 % 2 = 1");
    cr_assert_eq(dt_layout_dp_size(&l), 0);
    d = dt_layout_dims_tp_pp(2, 4);
    cr_assert_eq(dt_layout_of(&d, 6, 0, &l), DT_STATUS_CONFIG);
    cr_assert_str_eq(dt_error_detail(), "tensor_parallel.size 2 x pipeline.stages 4 = 8: expected a divisor of the "
                                        "world size 6 (world = tensor_parallel.size x pipeline.stages x "
                                        "data-parallel ranks)");
    d = dt_layout_dims_tp_pp(1, 3);
    cr_assert_eq(dt_layout_of(&d, 4, 0, &l), DT_STATUS_CONFIG);
    cr_assert(strstr(dt_error_detail(), "tensor_parallel.size 1 x pipeline.stages 3 = 3:"));
    cr_assert_eq(dt_layout_of(&d, 0, 0, &l), DT_STATUS_CONFIG);
    cr_assert_str_eq(dt_error_detail(), "world size: expected an integer >= 1, found 0");
    d = dt_layout_dims_tp_pp(0, -1); /* < 1 counts as 1 */
    cr_assert_eq(dt_layout_of(&d, 5, 4, &l), DT_STATUS_OK);
    cr_assert_eq(dt_layout_dp_size(&l), 5);
    cr_assert_eq(dt_layout_dp_rank(&l), 4);
}

Test(strategy, the_table) {
    static const struct {
        dt_strategy_t s;
        const char *name, *label;
        int stage, optim, grads, params;
    } want[] = {
        {DT_STRATEGY_DDP, "ddp", "ddp", 0, 0, 0, 0},       {DT_STRATEGY_ZERO1, "zero1", "zero1", 1, 1, 0, 0},
        {DT_STRATEGY_ZERO2, "zero2", "zero2", 2, 1, 1, 0}, {DT_STRATEGY_FSDP, "fsdp", "fsdp", 3, 1, 1, 1},
        {DT_STRATEGY_HSDP, "hsdp", "hybrid", 3, 1, 1, 1},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        dt_strategy_t s = want[i].s;
        cr_assert_str_eq(dt_strategy_name(s), want[i].name);
        cr_assert_str_eq(dt_strategy_names[s], want[i].name);
        cr_assert_str_eq(dt_strategy_label(s), want[i].label);
        cr_assert_eq(dt_strategy_stage(s), want[i].stage);
        cr_assert_eq(dt_strategy_shards(s, DT_STRATEGY_SHARDS_OPTIM), want[i].optim);
        cr_assert_eq(dt_strategy_shards(s, DT_STRATEGY_SHARDS_GRADS), want[i].grads);
        cr_assert_eq(dt_strategy_shards(s, DT_STRATEGY_SHARDS_PARAMS), want[i].params);
        cr_assert_eq(dt_strategy_parse(want[i].name), (int)s);
        cr_assert_eq(dt_strategy_parse(want[i].label), (int)s);
        int hsdp = s == DT_STRATEGY_HSDP;
        cr_assert_eq(dt_strategy_composes(s, DT_LAYOUT_TP), !hsdp);
        cr_assert_eq(dt_strategy_composes(s, DT_LAYOUT_PP), !hsdp);
        cr_assert_eq(dt_strategy_get(s)->over,
                     hsdp ? DT_STRATEGY_OVER_NODE : s == DT_STRATEGY_DDP ? DT_STRATEGY_OVER_NONE : DT_STRATEGY_OVER_DP);
    }
    cr_assert_null(dt_strategy_names[DT_STRATEGY_COUNT]);
    cr_assert_eq(dt_strategy_parse("ZERO3"), DT_STRATEGY_FSDP);
    cr_assert_eq(dt_strategy_parse("Hybrid"), DT_STRATEGY_HSDP);
    cr_assert_eq(dt_strategy_parse("zero"), -1);
    cr_assert_eq(dt_strategy_parse(""), -1);
    cr_assert_str_eq(dt_strategy_name(DT_STRATEGY_COUNT), "?");
    cr_assert_str_eq(dt_strategy_label(DT_STRATEGY_COUNT), "unknown");
    for (int st = 0; st <= 3; st++) cr_assert_eq(dt_strategy_stage(dt_strategy_of_stage(st)), st);
    cr_assert_eq(dt_strategy_of_stage(3), DT_STRATEGY_FSDP);
    cr_assert_eq(dt_strategy_of_stage(9), DT_STRATEGY_FSDP);
    cr_assert_eq(dt_strategy_of_stage(-1), DT_STRATEGY_DDP);
}
