/*
 * test_config_pp.c - the pipeline config section: its keys and defaults, the batch
 * identity over DP = world / (tensor_parallel.size x pipeline.stages), and the checks
 * before workers start: the layout dividing the world, the schedule against the
 * micro-batches (dt_pp_schedule_check's rules, which the config calls), the
 * strategy and the model. Each error names the key.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "runtime/config/config.h"
#include "runtime/layout/pp_sched.h"

static void quiet(void) { dt_log_set_level(DT_LOG_OFF); }
TestSuite(config_pp, .init = quiet);

#define ASSERT_ERR(cfg, text)                                                          \
    cr_assert(strstr(dt_config_errors(cfg), text), "missing error <%s> in:\n%s", text, \
              dt_config_errors(cfg))

static dt_status_t load(const char *model, const char *extra, dt_config_t *cfg) {
    char json[1024];
    snprintf(json, sizeof json, "{\"model\":%s,\"data\":{\"train\":\"x.txt\"}%s%s}", model, extra[0] ? "," : "",
             extra);
    return dt_config_load_string(json, "x.json", NULL, 0, cfg);
}
static const char *gpt = "{\"type\":\"gpt\",\"n_layer\":4,\"n_head\":4,\"n_embd\":64,\"seq_len\":32}";

Test(config_pp, keys_defaults_and_identity) {
    dt_config_t cfg;
    dt_config_init(&cfg);
    cr_assert_eq(cfg.pp.stages, 1);
    cr_assert_eq(cfg.pp.virtual_stages, 1);
    cr_assert_eq(dt_pp_schedule_parse("1f1b"), cfg.pp.schedule);
    cr_assert_eq(cfg.pp.partition, DT_PP_PARTITION_UNIFORM);
    dt_config_free(&cfg);
    cr_assert_eq(load(gpt,
                      "\"pipeline\":{\"stages\":2,\"schedule\":\"gpipe\",\"partition\":\"flops\"},"
                      "\"tensor_parallel\":{\"size\":2},\"train_micro_batch_size_per_gpu\":2,"
                      "\"gradient_accumulation_steps\":3",
                      &cfg),
                 DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    cr_assert_eq(cfg.pp.schedule, DT_PP_GPIPE);
    cr_assert_eq(cfg.pp.partition, DT_PP_PARTITION_FLOPS);
    cr_assert_eq(dt_config_resolve(&cfg, 8), DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    cr_assert_eq(cfg.dp_size, 2);
    cr_assert_eq(cfg.train_batch_size, 2 * 3 * 2);
    cr_assert_neq(dt_config_resolve(&cfg, 6), DT_STATUS_OK);
    ASSERT_ERR(&cfg, "tensor_parallel.size 2 x pipeline.stages 2 = 4: expected a divisor of the world size 6");
    dt_config_free(&cfg);
    /* train_batch_size over DP = 8 / (1 x 4) = 2 */
    cr_assert_eq(load(gpt, "\"pipeline\":{\"stages\":4},\"train_batch_size\":16,\"train_micro_batch_size_per_gpu\":2",
                      &cfg),
                 DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    cr_assert_eq(dt_config_resolve(&cfg, 8), DT_STATUS_OK, "%s", dt_config_errors(&cfg));
    cr_assert_eq(cfg.gradient_accumulation_steps, 4);
    dt_config_free(&cfg);
}

Test(config_pp, errors_name_the_key) {
    dt_config_t cfg;
    cr_assert_neq(load(gpt, "\"pipeline\":{\"stages\":2},\"strategy\":\"hsdp\"", &cfg), DT_STATUS_OK);
    ASSERT_ERR(&cfg, "pipeline.stages 2 with strategy \"hsdp\"");
    dt_config_free(&cfg);
    cr_assert_neq(load("{\"type\":\"mlp\"}", "\"pipeline\":{\"stages\":2}", &cfg), DT_STATUS_OK);
    ASSERT_ERR(&cfg, "model.type \"mlp\" has no pipeline stages");
    dt_config_free(&cfg);
    cr_assert_neq(load(gpt, "\"pipeline\":{\"stages\":0}", &cfg), DT_STATUS_OK);
    ASSERT_ERR(&cfg, "pipeline.stages");
    dt_config_free(&cfg);
    cr_assert_neq(load(gpt, "\"pipeline\":{\"schedule\":\"interleaved\",\"virtual_stages\":2}", &cfg),
                  DT_STATUS_OK);
    ASSERT_ERR(&cfg, "pipeline.virtual_stages 2: expected 1 without a pipeline");
    dt_config_free(&cfg);
    cr_assert_neq(load(gpt, "\"pipeline\":{\"schedule\":\"zb\"}", &cfg), DT_STATUS_OK);
    ASSERT_ERR(&cfg, "pipeline.schedule");
    dt_config_free(&cfg);
}
