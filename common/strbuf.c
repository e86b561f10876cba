/*
 * strbuf.c - a growing text buffer (strbuf.h).
 */
#include "common/strbuf.h"

#include <stdarg.h>
#include <stdio.h>

#include "common/mem.h"

void dt_strbuf_printf(dt_strbuf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->len : NULL, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (k >= 0 && (size_t)k < b->cap - b->len) {
            b->len += (size_t)k;
            return;
        }
        b->cap = b->cap * 2 + (k > 0 ? (size_t)k : 0) + 256;
        b->p = dt_xrealloc(b->p, b->cap);
    }
}

void dt_strbuf_json_str(dt_strbuf *b, const char *s) {
    dt_strbuf_printf(b, "\"");
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') dt_strbuf_printf(b, "\\%c", *c);
        else if (*c < 0x20 || *c == 0x7f) dt_strbuf_printf(b, "\\u%04x", *c);
        else dt_strbuf_printf(b, "%c", *c);
    }
    dt_strbuf_printf(b, "\"");
}
