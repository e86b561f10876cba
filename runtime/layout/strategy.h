/*
 * strategy.h - the data-parallel strategies and what each one is: its name and
 * aliases, its ZeRO stage, which model states it shards over which group, and
 * which other parallel dimensions it runs with. One table (strategy.c) that the
 * config (names, stage, the rules across keys), the data-parallel engine
 * (runtime/parallel/dp.c: which buffers are sharded), plan and the memory check
 * (runtime/tools: what each rank holds and talks) read.
 *
 *   strategy  stage  shards                       over
 *   ddp       0      nothing (every rank all)     -
 *   zero1     1      optimizer states             the DP group
 *   zero2     2      + gradients                  the DP group
 *   fsdp      3      + parameters                 the DP group
 *   hsdp      3      + parameters                 a node's ranks of the DP group
 *                                                 (replicated across nodes)
 *
 * hsdp's shard group is a node's ranks, where a TP group lives and which pipeline
 * stages cut across: it runs with neither.
 */
#ifndef DT_RUNTIME_LAYOUT_STRATEGY_H
#define DT_RUNTIME_LAYOUT_STRATEGY_H

#include "runtime/layout/layout.h" /* defines: dt_layout_dim_t */

/* The config's names, in the numeric order of dt_strategy_t. */
typedef enum dt_strategy {
    DT_STRATEGY_DDP,
    DT_STRATEGY_ZERO1,
    DT_STRATEGY_ZERO2,
    DT_STRATEGY_FSDP,
    DT_STRATEGY_HSDP,
    DT_STRATEGY_COUNT
} dt_strategy_t;

/* What a strategy shards (bits of dt_strategy_info.shards). */
enum {
    DT_STRATEGY_SHARDS_OPTIM = 1 << 0,  /* fp32 masters and Adam moments */
    DT_STRATEGY_SHARDS_GRADS = 1 << 1,  /* gradients (reduce-scattered) */
    DT_STRATEGY_SHARDS_PARAMS = 1 << 2, /* parameters (gathered per unit) */
};

/* The group a sharding strategy shards over. */
typedef enum dt_strategy_group {
    DT_STRATEGY_OVER_NONE, /* nothing sharded */
    DT_STRATEGY_OVER_DP,   /* the whole DP group */
    DT_STRATEGY_OVER_NODE, /* a node's ranks of the DP group, replicated across nodes */
} dt_strategy_group_t;

typedef struct dt_strategy_info {
    const char *name;    /* the config's: "ddp", "zero1", "zero2", "fsdp", "hsdp" */
    const char *label;   /* plan's tables: the name, "hybrid" for hsdp */
    const char *aliases; /* other names plan's --strategy takes (besides name and label), space-separated */
    int zero_stage;      /* DeepSpeed's zero_optimization.stage */
    unsigned shards;     /* DT_STRATEGY_SHARDS_* */
    dt_strategy_group_t over;
    unsigned composes; /* 1 << dt_layout_dim_t of each model dimension it runs with (TP, PP) */
} dt_strategy_info;

/* The row of s; NULL when s is out of range. */
const dt_strategy_info *dt_strategy_get(dt_strategy_t s);
/* The config's names, NULL-terminated, in dt_strategy_t order. */
extern const char *const dt_strategy_names[DT_STRATEGY_COUNT + 1];
/* s's config name; "?" when out of range. */
const char *dt_strategy_name(dt_strategy_t s);
/* s's name in plan's tables ("hybrid" for hsdp); "unknown" when out of range. */
const char *dt_strategy_label(dt_strategy_t s);
/* A strategy by its name, label or alias, any case; -1 when unknown. */
int dt_strategy_parse(const char *name);
/* s's ZeRO stage (out of range: 3, as the stage of the last rows). */
int dt_strategy_stage(dt_strategy_t s);
/* The first strategy (table order) of a ZeRO stage (clamped to 0-3). */
dt_strategy_t dt_strategy_of_stage(int64_t stage);
/* Whether s shards the states of what (DT_STRATEGY_SHARDS_*). */
int dt_strategy_shards(dt_strategy_t s, unsigned what);
/* Whether s runs with dim cut in more than one part. */
int dt_strategy_composes(dt_strategy_t s, dt_layout_dim_t dim);

#endif /* DT_RUNTIME_LAYOUT_STRATEGY_H */
