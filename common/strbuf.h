/*
 * strbuf.h - a growing text buffer for files built in memory and written at once
 * (the timeline's rank files, trace.json, its SVG): printf-style appends and JSON
 * strings. Allocation failure aborts, as dt_xrealloc does.
 */
#ifndef DT_COMMON_STRBUF_H
#define DT_COMMON_STRBUF_H

#include <stddef.h>

typedef struct dt_strbuf {
    char *p; /* NUL-terminated once anything was appended */
    size_t len, cap;
} dt_strbuf;

/* Appends fmt's expansion. */
void dt_strbuf_printf(dt_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s as a JSON string: quotes included, '"' and '\\' escaped, control
 * characters and DEL as \u00XX. */
void dt_strbuf_json_str(dt_strbuf *b, const char *s);

#endif /* DT_COMMON_STRBUF_H */
