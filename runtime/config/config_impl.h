/*
 * config_impl.h - the config key table, private to runtime/config: config_keys.c
 * holds the rows (and assembles them with the models' rows once), looks paths up,
 * suggests the key a typo meant, dumps the resolved config and lists the keys;
 * config.c parses values against the rows and applies the rules across keys. The
 * errors and warnings all of them find go to the collector (config_errors.h).
 */
#ifndef DT_RUNTIME_CONFIG_CONFIG_IMPL_H
#define DT_RUNTIME_CONFIG_CONFIG_IMPL_H

#include <stdbool.h>
#include <stddef.h>

#include "runtime/config/config.h"

typedef enum key_type { KT_BOOL, KT_INT, KT_FLOAT, KT_STRING, KT_ENUM, KT_FLOAT2 } key_type_t;

enum key_flags {
    KF_DS = 1 << 0,       /* DeepSpeed's key (same name and meaning) */
    KF_MIN_EXCL = 1 << 1, /* value > min rather than >= min */
    KF_MAX_EXCL = 1 << 2, /* value < max rather than <= max */
    KF_DERIVED = 1 << 3,  /* default "auto": derived from other keys */
    KF_PATH = 1 << 4,     /* string naming a file or folder: non-empty, no "auto" */
    KF_INT32 = 1 << 5,    /* KT_INT whose field is an int, not int64_t; KT_BOOL whose
                             field is an int (0/1), not a bool (the model's keys) */
    KF_SOURCES = 1 << 6,  /* KT_STRING that may also be a list of {"path", "weight"}
                             (data.train: cfg->data.sources) */
    KF_LIST = 1 << 7,     /* KT_STRING that may also be a list of strings, kept joined
                             by commas (lora.target_modules) */
};

typedef struct config_key {
    const char *path;
    key_type_t type;
    size_t offset;
    double min, max;
    unsigned flags;
    const char *const *names; /* KT_ENUM: allowed names, index = value */
    const char *def;          /* default as JSON text; "\"auto\"" with KF_DERIVED */
    const char *help;
} config_key_t;

#define OFF(field) offsetof(dt_config_t, field)
#define BIG 9007199254740991.0 /* 2^53 - 1: the largest exact integer in a double */
#define I32 2147483647.0

/* The assembled table: head rows, model.type, each model's rows, tail rows. Ready
 * after dt_config_keys_init_() (once, thread-safe). */
extern config_key_t dt_config_keys_[DT_CONFIG_MAX_KEYS];
extern int dt_config_n_keys_;
#define KEYS dt_config_keys_
#define N_KEYS dt_config_n_keys_
void dt_config_keys_init_(void);

/* Row of path, or -1. */
int dt_config_key_find_(const char *path);
/* path is a section: a proper prefix (at a dot) of some key. */
bool dt_config_is_section_(const char *path);
/* The key path stands for when it is another name of it (DeepSpeed's
 * tensor_parallel.autotp_size: tensor_parallel.size), else NULL. */
const char *dt_config_alias_(const char *path);
/* The other name of key (a static string), or NULL. */
const char *dt_config_key_alias_(const char *key);
/* path is (under) a DeepSpeed key dtrun accepts and ignores. */
bool dt_config_is_ignored_(const char *path);
/* The known key or section closest to path, if close enough to be a typo. */
bool dt_config_suggest_(const char *path, char *out, size_t out_size);
/* What row k accepts, for messages: "an integer >= 1", "one of ...". */
void dt_config_expected_(const config_key_t *k, char *out, size_t size);

/* model.pretrained: the model from DIR/config.json (config_pretrained.c); run by
 * finish() before the model's own checks. */
void dt_config_apply_pretrained_(dt_config_t *cfg, const char *src);
/* activation_checkpointing.*: the policy a DeepSpeed section implies, every from
 * number_checkpoints, warnings for the keys without effect, a model without blocks
 * (config_recompute.c); run by finish() once the model is known. */
void dt_config_recompute_finish_(dt_config_t *cfg, const char *src);

static inline void *field(dt_config_t *cfg, const config_key_t *k) { return (char *)cfg + k->offset; }
static inline const void *cfield(const dt_config_t *cfg, const config_key_t *k) {
    return (const char *)cfg + k->offset;
}

#endif /* DT_RUNTIME_CONFIG_CONFIG_IMPL_H */
