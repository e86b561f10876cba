/*
 * config_errors.h - the config's error collector, private to runtime/config: every
 * error and warning a load, an override, a resolve or a check finds is appended to
 * the config (dt_config_t's errors and warnings, one line each), so a user sees them
 * all at once (dt_config_errors). The errors a load found stay; a later
 * dt_config_set or dt_config_resolve forgets only its own earlier ones (rewind).
 * Knows nothing of the key table: every other file of runtime/config reports here,
 * and this file calls none of them.
 */
#ifndef DT_RUNTIME_CONFIG_CONFIG_ERRORS_H
#define DT_RUNTIME_CONFIG_CONFIG_ERRORS_H

#include <stdarg.h>
#include <stddef.h>

#include "runtime/config/config.h"

/* A growing string (the joined lists of a source's notes; the errors and warnings
 * are kept in dt_config_t's own fields). Zeroed: empty. free(t.s) when done. */
typedef struct dt_config_text {
    char *s;
    size_t len, cap;
} dt_config_text;

/* Appends the formatted text to t. */
__attribute__((format(printf, 2, 3))) void dt_config_text_append_(dt_config_text *t, const char *fmt, ...);

/* Empty error and warning lists on a zeroed cfg (dt_config_init). */
void dt_config_errors_init_(dt_config_t *cfg);
/* Frees both lists. */
void dt_config_errors_free_(dt_config_t *cfg);

/* Appends "src: msg" to cfg's errors. */
void dt_config_add_error_(dt_config_t *cfg, const char *src, const char *msg);
/* The same, formatted (vprintf-style: a file's own printf-style wrapper passes its
 * arguments on). */
void dt_config_add_verror_(dt_config_t *cfg, const char *src, const char *fmt, va_list ap);
/* Appends msg to cfg's warnings. */
void dt_config_add_warning_(dt_config_t *cfg, const char *msg);
/* The same, formatted (vprintf-style). */
void dt_config_add_vwarning_(dt_config_t *cfg, const char *fmt, va_list ap);

/* Appends the error of a text that is not valid JSON, named name: the line and
 * column where cJSON stopped (end, from cJSON_ParseWithOpts; NULL: the end) and the
 * text there, or that the file is empty or ended early. */
void dt_config_json_error_(dt_config_t *cfg, const char *name, const char *json, const char *end);

/* Forgets the errors found after the load (those of an earlier dt_config_set or
 * dt_config_resolve). */
void dt_config_errors_rewind_(dt_config_t *cfg);
/* The errors found so far count as the load's: a later rewind keeps them. */
void dt_config_errors_keep_(dt_config_t *cfg);
/* Sets the thread's error detail to "N config errors:" and the list. */
void dt_config_error_detail_(const dt_config_t *cfg);
/* DT_STATUS_CONFIG with the detail set when cfg has errors, else DT_STATUS_OK. */
dt_status_t dt_config_errors_status_(const dt_config_t *cfg);

#endif /* DT_RUNTIME_CONFIG_CONFIG_ERRORS_H */
