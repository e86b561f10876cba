/*
 * jinja.h - the Jinja subset that Hugging Face chat templates use, rendered in C
 * exactly as transformers renders them: jinja2's ImmutableSandboxedEnvironment with
 * trim_blocks and lstrip_blocks, the loopcontrols extension, transformers'
 * {% generation %} block, its tojson, raise_exception and strftime_now.
 *
 * Values follow Python's: None/True/False, lists and dicts printed as Python's
 * repr, undefined names that print as "" and are false, loop variables, string
 * and dict methods. The statements, filters, tests and methods it knows are
 * listed in runtime/tokenize/jinja_internal.h; a construct jinja2 has and this
 * does not is DT_STATUS_UNSUPPORTED naming it and its line: at parse time for
 * tags, filters and tests, at render time for what only the values decide (a
 * method of a string, say). Never a render that differs from jinja2's.
 *
 * Errors: a syntax error is DT_STATUS_FORMAT ("NAME:LINE: ..."); a failure while
 * rendering (an undefined value used, a type error, raise_exception(msg)) is
 * DT_STATUS_INVALID with jinja2's message; a limit passed is DT_STATUS_LIMIT.
 *
 * Threads: a dt_jinja_t is read-only after parsing; renders may run at once.
 */
#ifndef DT_RUNTIME_TOKENIZE_JINJA_H
#define DT_RUNTIME_TOKENIZE_JINJA_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct dt_jinja dt_jinja_t;

/* Byte range [start, end) of the output. */
typedef struct dt_jinja_span {
    size_t start, end;
} dt_jinja_span;

/* Bounds of one render, against hostile templates; 0 takes the default. */
typedef struct dt_jinja_limits {
    size_t max_output;   /* bytes of text produced, captures included (64 MiB) */
    size_t max_memory;   /* bytes of values built while rendering (256 MiB) */
    uint64_t max_steps;  /* loop iterations and macro calls together (10 million) */
    int max_depth;       /* nested macro calls (64) */
} dt_jinja_limits;

/* What one render produced; release with dt_jinja_result_free. */
typedef struct dt_jinja_result {
    char *text;            /* malloc'ed, NUL-terminated */
    size_t len;
    dt_jinja_span *spans;  /* what each {% generation %} block wrote, in order */
    size_t nspans;
} dt_jinja_result;

/* Parses src[0..len) (UTF-8). name: how errors call the template ("a/b.json"). */
dt_status_t dt_jinja_parse(const char *src, size_t len, const char *name, dt_jinja_t **out);
void dt_jinja_free(dt_jinja_t *t);
/* 1 when the template holds a {% generation %} block. */
int dt_jinja_has_generation(const dt_jinja_t *t);

/* Renders with the top-level variables of vars (a cJSON object, may be NULL);
 * numbers without a fraction are Python ints, others floats. limits may be NULL.
 * On failure res is empty. */
dt_status_t dt_jinja_render(const dt_jinja_t *t, const cJSON *vars, const dt_jinja_limits *limits,
                            dt_jinja_result *res);
void dt_jinja_result_free(dt_jinja_result *res);

#endif /* DT_RUNTIME_TOKENIZE_JINJA_H */
