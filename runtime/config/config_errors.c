/*
 * config_errors.c - the config's error collector (config_errors.h): errors and
 * warnings appended to the config as growing text, one line each, the error of a
 * file that is not JSON (line, column and the text there), and the detail and
 * status a failed load, override or resolve hands back.
 */
#include "runtime/config/config_errors.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h" /* defines: dt_xrealloc, dt_xstrdup */

static void text_vappend(char **s, size_t *len, size_t *cap, const char *fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) return;
    if (*len + (size_t)n + 1 > *cap) {
        size_t nc = *cap ? *cap : 256;
        while (nc < *len + (size_t)n + 1) nc *= 2;
        *s = dt_xrealloc(*s, nc);
        *cap = nc;
    }
    vsnprintf(*s + *len, *cap - *len, fmt, ap);
    *len += (size_t)n;
}

void dt_config_text_append_(dt_config_text *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    text_vappend(&t->s, &t->len, &t->cap, fmt, ap);
    va_end(ap);
}

void dt_config_errors_init_(dt_config_t *cfg) {
    cfg->errors = dt_xstrdup("");
    cfg->errors_cap = 1;
    cfg->warnings = dt_xstrdup("");
    cfg->warnings_cap = 1;
}

void dt_config_errors_free_(dt_config_t *cfg) {
    free(cfg->errors);
    free(cfg->warnings);
    cfg->errors = cfg->warnings = NULL;
    cfg->errors_len = cfg->errors_cap = cfg->warnings_len = cfg->warnings_cap = 0;
}

/* "src: " + message + "\n" on the error list. */
void dt_config_add_verror_(dt_config_t *cfg, const char *src, const char *fmt, va_list ap) {
    dt_config_text line = {0};
    text_vappend(&line.s, &line.len, &line.cap, fmt, ap);
    dt_config_text b = {cfg->errors, cfg->errors_len, cfg->errors_cap};
    dt_config_text_append_(&b, "%s: %s\n", src, line.s ? line.s : "");
    cfg->errors = b.s;
    cfg->errors_len = b.len;
    cfg->errors_cap = b.cap;
    cfg->n_errors++;
    free(line.s);
}

__attribute__((format(printf, 3, 4))) static void add_errorf(dt_config_t *cfg, const char *src, const char *fmt,
                                                              ...) {
    va_list ap;
    va_start(ap, fmt);
    dt_config_add_verror_(cfg, src, fmt, ap);
    va_end(ap);
}

void dt_config_add_error_(dt_config_t *cfg, const char *src, const char *msg) { add_errorf(cfg, src, "%s", msg); }

/* message + "\n" on the warning list. */
void dt_config_add_vwarning_(dt_config_t *cfg, const char *fmt, va_list ap) {
    text_vappend(&cfg->warnings, &cfg->warnings_len, &cfg->warnings_cap, fmt, ap);
    dt_config_text b = {cfg->warnings, cfg->warnings_len, cfg->warnings_cap};
    dt_config_text_append_(&b, "\n");
    cfg->warnings = b.s;
    cfg->warnings_len = b.len;
    cfg->warnings_cap = b.cap;
}

__attribute__((format(printf, 2, 3))) static void add_warningf(dt_config_t *cfg, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    dt_config_add_vwarning_(cfg, fmt, ap);
    va_end(ap);
}

void dt_config_add_warning_(dt_config_t *cfg, const char *msg) { add_warningf(cfg, "%s", msg); }

void dt_config_json_error_(dt_config_t *cfg, const char *name, const char *json, const char *end) {
    const char *blank = " \t\r\n";
    size_t len = strlen(json);
    if (strspn(json, blank) == len) {
        add_errorf(cfg, name, "expected a JSON object, found an empty file");
        return;
    }
    const char *stop = end && end >= json && end <= json + len ? end : json + len;
    bool at_end = stop[strspn(stop, blank)] == '\0';
    /* cJSON may stop on blanks after the offending token: step back to it */
    while (stop > json && (*stop == '\0' || strchr(blank, *stop))) stop--;
    int line = 1, col = 1;
    for (const char *p = json; p < stop; p++) {
        if (*p == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    char near[32];
    size_t k = 0;
    if (at_end) { /* the text ran out: show what came last */
        const char *from = stop;
        while (from > json && from[-1] != '\n' && stop - from < 23) from--;
        for (const char *p = from; p <= stop && k < sizeof near - 1; p++) near[k++] = *p;
        near[k] = '\0';
        add_errorf(cfg, name,
                   "line %d, column %d: expected valid JSON, found the end of the file after \"%s\"",
                   line, col, near);
        return;
    }
    for (const char *p = stop; *p && *p != '\n' && k < 24; p++) near[k++] = *p;
    near[k] = '\0';
    add_errorf(cfg, name, "line %d, column %d: expected valid JSON, found \"%s\"", line, col, near);
}

void dt_config_errors_rewind_(dt_config_t *cfg) {
    cfg->errors_len = cfg->load_errors_len;
    cfg->n_errors = cfg->load_n_errors;
    if (cfg->errors) cfg->errors[cfg->errors_len] = '\0';
}

void dt_config_errors_keep_(dt_config_t *cfg) {
    cfg->load_errors_len = cfg->errors_len;
    cfg->load_n_errors = cfg->n_errors;
}

void dt_config_error_detail_(const dt_config_t *cfg) {
    dt_error(DT_STATUS_CONFIG, "%d config error%s:\n%s", cfg->n_errors, cfg->n_errors == 1 ? "" : "s",
             cfg->errors);
}

dt_status_t dt_config_errors_status_(const dt_config_t *cfg) {
    if (!cfg->n_errors) return DT_STATUS_OK;
    dt_config_error_detail_(cfg);
    return DT_STATUS_CONFIG;
}
