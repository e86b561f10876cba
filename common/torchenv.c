/*
 * torchenv.c - reads and checks torchrun's worker environment (see torchenv.h).
 */
#include "common/torchenv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char *env_get(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* *out keeps its default when name is unset; a set value must be an integer in [lo, hi]. */
static dt_status_t env_int(const char *name, int lo, int hi, int *out) {
    const char *v = env_get(name);
    if (!v) return DT_STATUS_OK;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || x < lo || x > hi)
        return dt_error(DT_STATUS_CONFIG, "environment variable %s=\"%s\": expected an integer in [%d, %d]", name,
                        v, lo, hi);
    *out = (int)x;
    return DT_STATUS_OK;
}

dt_status_t dt_torchenv_read(dt_torchenv_t *env) {
    memset(env, 0, sizeof *env);
    env->world_size = 1;
    env->launched = env_get("RANK") != NULL;
    DT_CHECK(env_int("WORLD_SIZE", 1, 1 << 20, &env->world_size));
    DT_CHECK(env_int("RANK", 0, env->world_size - 1, &env->rank));
    env->local_world_size = env->world_size;
    DT_CHECK(env_int("LOCAL_WORLD_SIZE", 1, env->world_size, &env->local_world_size));
    env->local_rank = env->rank % env->local_world_size;
    DT_CHECK(env_int("LOCAL_RANK", 0, env->local_world_size - 1, &env->local_rank));
    DT_CHECK(env_int("GROUP_RANK", 0, env->world_size - 1, &env->group_rank));
    env->master_addr = env_get("MASTER_ADDR");
    DT_CHECK(env_int("MASTER_PORT", 1, 65535, &env->master_port));
    DT_CHECK(env_int("TORCHELASTIC_RESTART_COUNT", 0, 1 << 30, &env->restart_count));
    env->run_id = env_get("TORCHELASTIC_RUN_ID");
    if (!env->run_id) env->run_id = "none";
    return DT_STATUS_OK;
}

dt_status_t dt_torchenv_require_store(const dt_torchenv_t *env) {
    const char *missing = !env->master_addr                 ? "MASTER_ADDR"
                          : env->master_port == 0           ? "MASTER_PORT"
                          : !env_get("WORLD_SIZE")          ? "WORLD_SIZE"
                          : !env->launched                  ? "RANK"
                                                            : NULL;
    if (missing) return dt_error(DT_STATUS_CONFIG, "environment variable %s is not set", missing);
    return DT_STATUS_OK;
}
