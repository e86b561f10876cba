/*
 * strategy.c - the strategy table (strategy.h): one row per data-parallel strategy.
 */
#include "runtime/layout/strategy.h"

#include <stddef.h>
#include <string.h>
#include <strings.h>

#define ALL_STATES (DT_STRATEGY_SHARDS_OPTIM | DT_STRATEGY_SHARDS_GRADS | DT_STRATEGY_SHARDS_PARAMS)
#define WITH_TP_PP ((1u << DT_LAYOUT_TP) | (1u << DT_LAYOUT_CP) | (1u << DT_LAYOUT_PP))

/* the config's spellings, each written once: the rows and dt_strategy_names point at them */
static const char ddp[] = "ddp", zero1[] = "zero1", zero2[] = "zero2", fsdp[] = "fsdp", hsdp[] = "hsdp";

static const dt_strategy_info rows[DT_STRATEGY_COUNT] = {
    /* name, label, aliases, stage, shards, over, composes */
    [DT_STRATEGY_DDP] = {ddp, ddp, "", 0, 0, DT_STRATEGY_OVER_NONE, WITH_TP_PP},
    [DT_STRATEGY_ZERO1] = {zero1, zero1, "", 1, DT_STRATEGY_SHARDS_OPTIM, DT_STRATEGY_OVER_DP, WITH_TP_PP},
    [DT_STRATEGY_ZERO2] = {zero2, zero2, "", 2, DT_STRATEGY_SHARDS_OPTIM | DT_STRATEGY_SHARDS_GRADS,
                           DT_STRATEGY_OVER_DP, WITH_TP_PP},
    [DT_STRATEGY_FSDP] = {fsdp, fsdp, "zero3", 3, ALL_STATES, DT_STRATEGY_OVER_DP, WITH_TP_PP},
    [DT_STRATEGY_HSDP] = {hsdp, "hybrid", "", 3, ALL_STATES, DT_STRATEGY_OVER_NODE, 0},
};

const char *const dt_strategy_names[DT_STRATEGY_COUNT + 1] = {ddp, zero1, zero2, fsdp, hsdp, NULL};

const dt_strategy_info *dt_strategy_get(dt_strategy_t s) {
    return (unsigned)s < DT_STRATEGY_COUNT ? &rows[s] : NULL;
}

const char *dt_strategy_name(dt_strategy_t s) { return (unsigned)s < DT_STRATEGY_COUNT ? rows[s].name : "?"; }

const char *dt_strategy_label(dt_strategy_t s) {
    return (unsigned)s < DT_STRATEGY_COUNT ? rows[s].label : "unknown";
}

/* Whether name is one of the space-separated words of list. */
static int in_list(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        size_t w = strcspn(p, " ");
        if (w == n && !strncasecmp(p, name, n)) return 1;
        p += w;
        p += strspn(p, " ");
    }
    return 0;
}

int dt_strategy_parse(const char *name) {
    if (!name) return -1;
    for (int i = 0; i < DT_STRATEGY_COUNT; i++)
        if (!strcasecmp(name, rows[i].label)) return i;
    for (int i = 0; i < DT_STRATEGY_COUNT; i++)
        if (!strcasecmp(name, rows[i].name) || in_list(rows[i].aliases, name)) return i;
    return -1;
}

int dt_strategy_stage(dt_strategy_t s) { return (unsigned)s < DT_STRATEGY_COUNT ? rows[s].zero_stage : 3; }

dt_strategy_t dt_strategy_of_stage(int64_t stage) {
    if (stage < 0) stage = 0;
    if (stage > 3) stage = 3;
    for (int i = 0; i < DT_STRATEGY_COUNT; i++)
        if (rows[i].zero_stage == stage) return (dt_strategy_t)i;
    return DT_STRATEGY_FSDP;
}

int dt_strategy_shards(dt_strategy_t s, unsigned what) {
    return (unsigned)s < DT_STRATEGY_COUNT && (rows[s].shards & what) == what && what;
}

int dt_strategy_composes(dt_strategy_t s, dt_layout_dim_t dim) {
    return (unsigned)s < DT_STRATEGY_COUNT && (rows[s].composes >> dim & 1u);
}
