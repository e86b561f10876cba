/*
 * jinja_lex.c - a template's text as tokens, the way jinja2's lexer cuts it with
 * trim_blocks and lstrip_blocks on: data between tags, {{ }} / {% %} with the
 * names, literals and operators inside, {# #} comments and {% raw %} dropped or
 * kept as data, whitespace control (-, +) applied to the neighbouring data.
 *
 * The source is first normalized as jinja2 does: \r\n and \r become \n and one
 * trailing newline is dropped (keep_trailing_newline off).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h" /* defines: dt_xmalloc, dt_xrealloc */
#include "runtime/tokenize/jinja_internal.h"
#include "runtime/tokenize/tok_unicode.h" /* defines: dt_uni_next, dt_uni_put */

#define MAX_BRACKETS 256

typedef struct lexer {
    dt_jinja_t *t;
    const char *s;
    size_t n, pos;
    uint32_t line;
    int line_starting; /* the last match ended with a newline (lstrip_blocks) */
    jj_tok *toks;
    size_t ntoks, cap;
} lexer;

static dt_status_t lex_fail(lexer *L, uint32_t line, const char *fmt, const char *arg) {
    char msg[256];
    snprintf(msg, sizeof msg, fmt, arg);
    return dt_error(DT_STATUS_FORMAT, "%s:%u: %s", L->t->name, line, msg);
}

static jj_tok *push(lexer *L, int type, uint32_t line) {
    if (L->ntoks == L->cap) {
        L->cap = L->cap ? 2 * L->cap : 256;
        L->toks = dt_xrealloc(L->toks, L->cap * sizeof *L->toks);
    }
    jj_tok *k = &L->toks[L->ntoks++];
    memset(k, 0, sizeof *k);
    k->type = (uint8_t)type;
    k->line = line;
    return k;
}

static uint32_t count_nl(const char *p, size_t n) {
    uint32_t c = 0;
    for (size_t i = 0; i < n; i++) c += p[i] == '\n';
    return c;
}

/* Length of the (Python str.isspace) whitespace run at p[0..n). */
static size_t space_run(const char *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        int32_t cp;
        int k = dt_uni_next((const unsigned char *)p + i, n - i, &cp);
        if (!jj_py_isspace(cp)) break;
        i += (size_t)k;
    }
    return i;
}

/* Length of p[0..n) without its trailing whitespace (str.rstrip()). */
static size_t rstrip_len(const char *p, size_t n) {
    while (n > 0) {
        size_t st = n - 1;
        while (st > 0 && ((unsigned char)p[st] & 0xC0) == 0x80 && n - st < 4) st--;
        int32_t cp;
        int k = dt_uni_next((const unsigned char *)p + st, n - st, &cp);
        if ((size_t)k != n - st || !jj_py_isspace(cp)) break;
        n = st;
    }
    return n;
}

/* The data before a tag, with the tag's whitespace control applied. */
static void emit_data(lexer *L, const char *p, size_t n, char sign, int lstrip_ok) {
    uint32_t line = L->line;
    L->line += count_nl(p, n);
    if (sign == '-') {
        n = rstrip_len(p, n);
    } else if (sign != '+' && lstrip_ok) {
        size_t l = n;
        while (l > 0 && p[l - 1] != '\n') l--;
        if ((l > 0 || L->line_starting) && n > l && space_run(p + l, n - l) == n - l) n = l;
    }
    if (n) {
        jj_tok *k = push(L, JT_DATA, line);
        k->p = p;
        k->n = n;
    }
}

/* Skips whitespace after a `-` end marker; counts lines. Returns the last byte skipped (0: none). */
static char skip_ws(lexer *L) {
    size_t k = space_run(L->s + L->pos, L->n - L->pos);
    char last = k ? L->s[L->pos + k - 1] : 0;
    L->line += count_nl(L->s + L->pos, k);
    L->pos += k;
    return last;
}

static int at(const lexer *L, size_t i, const char *lit) {
    size_t k = strlen(lit);
    return i + k <= L->n && memcmp(L->s + i, lit, k) == 0;
}

/* Ends a block, comment or raw tag at L->pos (after its `%}`/`#}`): '+' keeps what
 * follows, '-' strips whitespace, none drops one newline (trim_blocks). */
static void end_tag(lexer *L, char sign) {
    char last = L->s[L->pos - 1];
    if (sign == '-') {
        char c = skip_ws(L);
        if (c) last = c;
    } else if (sign != '+' && L->pos < L->n && L->s[L->pos] == '\n') {
        L->pos++;
        L->line++;
        last = '\n';
    }
    L->line_starting = last == '\n';
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_name0(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* (\d+_)*\d+ at i: its end, or i when none. */
static size_t digits_(const lexer *L, size_t i) {
    size_t j = i;
    if (j >= L->n || !is_digit(L->s[j])) return i;
    while (j < L->n && is_digit(L->s[j])) j++;
    while (j + 1 < L->n && L->s[j] == '_' && is_digit(L->s[j + 1])) {
        j++;
        while (j < L->n && is_digit(L->s[j])) j++;
    }
    return j;
}

/* jinja2's float_re at pos: the end, or 0. */
static size_t float_end(const lexer *L) {
    size_t i = L->pos;
    if (i > 0 && L->s[i - 1] == '.') return 0;
    size_t j = digits_(L, i);
    if (j == i) return 0;
    size_t frac = j;
    if (j < L->n && L->s[j] == '.') {
        size_t k = digits_(L, j + 1);
        if (k > j + 1) frac = k;
    }
    size_t e = frac;
    if (e < L->n && (L->s[e] == 'e' || L->s[e] == 'E')) {
        size_t k = e + 1;
        if (k < L->n && (L->s[k] == '+' || L->s[k] == '-')) k++;
        size_t d = digits_(L, k);
        if (d > k) return d;
    }
    return frac > j ? frac : 0;
}

/* jinja2's integer_re at pos: the end (0: none) and the base. */
static size_t int_end(const lexer *L, int *base) {
    size_t i = L->pos;
    const char *s = L->s;
    *base = 10;
    if (i >= L->n || !is_digit(s[i])) return 0;
    if (s[i] == '0' && i + 1 < L->n && strchr("bBoOxX", s[i + 1]) && s[i + 1]) {
        char b = (char)(s[i + 1] | 0x20);
        *base = b == 'b' ? 2 : b == 'o' ? 8 : 16;
        size_t j = i + 2, end = 0;
        for (;;) {
            size_t k = j;
            if (k < L->n && s[k] == '_') k++;
            if (k >= L->n) break;
            char c = s[k];
            int ok = *base == 2 ? (c == '0' || c == '1') : *base == 8 ? (c >= '0' && c <= '7') : is_hex(c);
            if (!ok) break;
            j = k + 1;
            end = j;
        }
        if (end) return end;
        *base = 10; /* "0" alone, then a name */
    }
    size_t j = i + 1;
    if (s[i] == '0') {
        while (j < L->n && (s[j] == '0' || (s[j] == '_' && j + 1 < L->n && s[j + 1] == '0'))) j++;
        return j;
    }
    while (j < L->n && (is_digit(s[j]) || (s[j] == '_' && j + 1 < L->n && is_digit(s[j + 1])))) j++;
    return j;
}

static dt_status_t lex_number(lexer *L) {
    char buf[128];
    size_t e = float_end(L);
    int isfloat = e != 0, base = 10;
    if (!isfloat) e = int_end(L, &base);
    if (!e) return DT_STATUS_OK; /* not a number */
    if (e - L->pos >= sizeof buf) return lex_fail(L, L->line, "number too long: %s", "...");
    size_t k = 0;
    for (size_t i = L->pos + (base != 10 ? 2 : 0); i < e; i++)
        if (L->s[i] != '_') buf[k++] = L->s[i];
    buf[k] = 0;
    jj_tok *t = push(L, isfloat ? JT_FLOAT : JT_INT, L->line);
    if (isfloat) {
        t->f = strtod(buf, NULL);
    } else {
        errno = 0;
        unsigned long long v = strtoull(buf, NULL, base);
        if (errno == ERANGE || v > (unsigned long long)INT64_MAX)
            return dt_error(DT_STATUS_UNSUPPORTED, "%s:%u: integer literal %s is too large (Python integers are "
                            "unbounded, these are 64-bit)", L->t->name, L->line, buf);
        t->i = (int64_t)v;
    }
    t->p = L->s + L->pos;
    t->n = e - L->pos;
    L->pos = e;
    return DT_STATUS_OK;
}

static void put_cp(char **o, uint32_t cp) { *o += dt_uni_put(cp, *o); }

static int hexval(char c) { return is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10; }

/* A string literal at pos (quote at s[pos]); its decoded value into the pool as
 * Python's unicode-escape decoding reads it. */
static dt_status_t lex_string(lexer *L) {
    const char *s = L->s;
    char q = s[L->pos];
    size_t i = L->pos + 1;
    while (i < L->n && s[i] != q) i += s[i] == '\\' ? 2 : 1;
    if (i >= L->n) return lex_fail(L, L->line, "unexpected char %s (an unterminated string)", q == '"' ? "'\"'" : "\"'\"");
    size_t a = L->pos + 1, b = i;
    /* Decoding never grows the text beyond 4x (a \x escape of one byte can become
     * a backslash plus \U........ of a non-ASCII character: 11 bytes for 2 -> bound 6x). */
    char *out = jj_alloc(&L->t->pool, 6 * (b - a) + 1), *o = out;
    if (!out) return dt_error(DT_STATUS_NOMEM, "%s: template too large", L->t->name);
    uint32_t line = L->line;
    for (size_t j = a; j < b;) {
        char c = s[j];
        if (c != '\\' || j + 1 >= b) {
            *o++ = c;
            j++;
            continue;
        }
        char e = s[j + 1];
        j += 2;
        switch (e) {
        case '\n': break;
        case '\\': *o++ = '\\'; break;
        case '\'': *o++ = '\''; break;
        case '"': *o++ = '"'; break;
        case 'a': *o++ = '\a'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'v': *o++ = '\v'; break;
        case 'x': case 'u': case 'U': {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t v = 0;
            for (int d = 0; d < nd; d++) {
                if (j + (size_t)d >= b || !is_hex(s[j + d]))
                    return lex_fail(L, line, "truncated \\%sXX escape in a string", e == 'x' ? "x" : e == 'u' ? "u" : "U");
                v = v * 16 + (uint32_t)hexval(s[j + d]);
            }
            j += (size_t)nd;
            if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
                return lex_fail(L, line, "%s", "illegal Unicode character in a string escape");
            put_cp(&o, v);
            break;
        }
        case 'N':
            return dt_error(DT_STATUS_UNSUPPORTED, "%s:%u: \\N{...} escapes in strings are not supported",
                            L->t->name, line);
        default:
            if (e >= '0' && e <= '7') {
                uint32_t v = (uint32_t)(e - '0');
                for (int d = 0; d < 2 && j < b && s[j] >= '0' && s[j] <= '7'; d++) v = v * 8 + (uint32_t)(s[j++] - '0');
                put_cp(&o, v);
            } else if ((unsigned char)e >= 0x80) {
                /* backslashreplace then unicode-escape: "\é" reads as the text "\xe9" */
                int32_t cp;
                int k = dt_uni_next((const unsigned char *)s + j - 1, b - (j - 1), &cp);
                if (cp < 0) cp = (unsigned char)e;
                o += sprintf(o, cp < 0x100 ? "\\x%02x" : cp < 0x10000 ? "\\u%04x" : "\\U%08x", (unsigned)cp);
                j += (size_t)k - 1;
            } else {
                *o++ = '\\';
                *o++ = e;
            }
        }
    }
    *o = 0;
    jj_tok *t = push(L, JT_STRING, line);
    t->p = out;
    t->n = (size_t)(o - out);
    L->line += count_nl(s + L->pos, i + 1 - L->pos);
    L->pos = i + 1;
    return DT_STATUS_OK;
}

static const struct {
    const char *s;
    int op;
} OPS[] = {
    {"//", JO_FLOORDIV}, {"**", JO_POW}, {"==", JO_EQ}, {"!=", JO_NE}, {">=", JO_GTEQ}, {"<=", JO_LTEQ},
    {"+", JO_ADD}, {"-", JO_SUB}, {"/", JO_DIV}, {"*", JO_MUL}, {"%", JO_MOD}, {"~", JO_TILDE},
    {"[", JO_LBRACKET}, {"]", JO_RBRACKET}, {"(", JO_LPAREN}, {")", JO_RPAREN}, {"{", JO_LBRACE},
    {"}", JO_RBRACE}, {"=", JO_ASSIGN}, {".", JO_DOT}, {":", JO_COLON}, {"|", JO_PIPE}, {",", JO_COMMA},
    {";", JO_SEMICOLON}, {"<", JO_LT}, {">", JO_GT},
};

/* The inside of a {{ }} or {% %} tag, through its end marker. */
static dt_status_t lex_tag(lexer *L, int block, uint32_t open_line) {
    char stack[MAX_BRACKETS];
    int depth = 0;
    const char *end = block ? "%}" : "}}";
    for (;;) {
        if (L->pos >= L->n)
            return dt_error(DT_STATUS_FORMAT, "%s:%u: unexpected end of template: the %s opened on line %u is not "
                            "closed", L->t->name, L->line, block ? "'{%'" : "'{{'", open_line);
        if (depth == 0) {
            char c = L->s[L->pos];
            char sign = (c == '-' || (block && c == '+')) ? c : 0;
            if (at(L, L->pos + (sign ? 1 : 0), end)) {
                push(L, block ? JT_BLOCK_END : JT_VAR_END, L->line);
                L->pos += 2 + (sign ? 1 : 0);
                if (block)
                    end_tag(L, sign);
                else if (sign == '-')
                    L->line_starting = skip_ws(L) == '\n';
                else
                    L->line_starting = 0;
                return DT_STATUS_OK;
            }
        }
        size_t w = space_run(L->s + L->pos, L->n - L->pos);
        if (w) {
            L->line += count_nl(L->s + L->pos, w);
            L->pos += w;
            continue;
        }
        char c = L->s[L->pos];
        if (is_digit(c)) {
            size_t before = L->ntoks;
            DT_CHECK(lex_number(L));
            if (L->ntoks != before) continue;
        }
        if (is_name0(c)) {
            size_t j = L->pos + 1;
            while (j < L->n && (is_name0(L->s[j]) || is_digit(L->s[j]))) j++;
            jj_tok *t = push(L, JT_NAME, L->line);
            t->p = L->s + L->pos;
            t->n = j - L->pos;
            L->pos = j;
            continue;
        }
        if (c == '\'' || c == '"') {
            DT_CHECK(lex_string(L));
            continue;
        }
        size_t k;
        for (k = 0; k < sizeof OPS / sizeof OPS[0]; k++)
            if (at(L, L->pos, OPS[k].s)) break;
        if (k == sizeof OPS / sizeof OPS[0]) {
            char what[16];
            int32_t cp;
            int len = dt_uni_next((const unsigned char *)L->s + L->pos, L->n - L->pos, &cp);
            snprintf(what, sizeof what, "'%.*s'", len, L->s + L->pos);
            return lex_fail(L, L->line, "unexpected char %s", what);
        }
        int op = OPS[k].op;
        if (op == JO_LPAREN || op == JO_LBRACKET || op == JO_LBRACE) {
            if (depth == MAX_BRACKETS) return lex_fail(L, L->line, "%s", "brackets nested too deeply");
            stack[depth++] = op == JO_LPAREN ? ')' : op == JO_LBRACKET ? ']' : '}';
        } else if (op == JO_RPAREN || op == JO_RBRACKET || op == JO_RBRACE) {
            char want[4] = {OPS[k].s[0], 0};
            if (!depth) return lex_fail(L, L->line, "unexpected '%s'", want);
            if (stack[--depth] != OPS[k].s[0]) {
                char msg[64];
                snprintf(msg, sizeof msg, "unexpected '%s', expected '%c'", want, stack[depth]);
                return lex_fail(L, L->line, "%s", msg);
            }
        }
        jj_tok *t = push(L, JT_OP, L->line);
        t->op = (uint8_t)op;
        t->p = L->s + L->pos;
        t->n = strlen(OPS[k].s);
        L->pos += t->n;
    }
}

/* `{%[-+]?\s*raw\s*(-%}\s*|%})` at pos: its length, or 0. */
static size_t raw_begin(const lexer *L, size_t i, char *end_sign) {
    size_t j = i + 2;
    if (j < L->n && (L->s[j] == '-' || L->s[j] == '+')) j++;
    j += space_run(L->s + j, L->n - j);
    if (!at(L, j, "raw")) return 0;
    j += 3;
    j += space_run(L->s + j, L->n - j);
    *end_sign = 0;
    if (at(L, j, "-%}")) {
        *end_sign = '-';
        return j + 3 - i;
    }
    return at(L, j, "%}") ? j + 2 - i : 0;
}

/* The raw block's text up to {% endraw %}, then its end. */
static dt_status_t lex_raw(lexer *L, uint32_t line) {
    for (size_t p = L->pos; p + 1 < L->n; p++) {
        if (L->s[p] != '{' || L->s[p + 1] != '%') continue;
        size_t j = p + 2;
        char sign = 0;
        if (j < L->n && (L->s[j] == '-' || L->s[j] == '+')) sign = L->s[j++];
        j += space_run(L->s + j, L->n - j);
        if (!at(L, j, "endraw")) continue;
        j += 6;
        j += space_run(L->s + j, L->n - j);
        char esign = 0;
        if (at(L, j, "+%}") || at(L, j, "-%}")) esign = L->s[j++];
        if (!at(L, j, "%}")) continue;
        emit_data(L, L->s + L->pos, p - L->pos, sign, 1);
        L->line += count_nl(L->s + p, j + 2 - p);
        L->pos = j + 2;
        end_tag(L, esign);
        return DT_STATUS_OK;
    }
    return dt_error(DT_STATUS_FORMAT, "%s:%u: missing end of raw directive", L->t->name, line);
}

/* Newlines normalized, one trailing newline dropped, into t->src. */
static void normalize(dt_jinja_t *t, const char *src, size_t len, size_t *n) {
    char *o = dt_xmalloc(len + 1);
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            o[k++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            o[k++] = src[i];
        }
    }
    if (k && o[k - 1] == '\n') k--;
    o[k] = 0;
    t->src = o;
    *n = k;
}

dt_status_t jj_lex(dt_jinja_t *t, const char *src, size_t len, jj_tok **toks, size_t *ntoks) {
    lexer L = {.t = t, .line = 1, .line_starting = 1};
    normalize(t, src, len, &L.n);
    L.s = t->src;
    dt_status_t st = DT_STATUS_OK;
    while (L.pos < L.n) {
        const char *q = NULL;
        for (const char *p = memchr(L.s + L.pos, '{', L.n - L.pos); p; p = memchr(p + 1, '{', L.n - (size_t)(p + 1 - L.s))) {
            if ((size_t)(p + 1 - L.s) >= L.n) break;
            if (p[1] == '%' || p[1] == '{' || p[1] == '#') {
                q = p;
                break;
            }
        }
        if (!q) {
            emit_data(&L, L.s + L.pos, L.n - L.pos, '+', 0);
            break;
        }
        size_t qi = (size_t)(q - L.s);
        char kind = q[1];
        char sign = (qi + 2 < L.n && (q[2] == '-' || q[2] == '+')) ? q[2] : 0;
        char raw_end = 0;
        size_t raw = kind == '%' ? raw_begin(&L, qi, &raw_end) : 0;
        emit_data(&L, L.s + L.pos, qi - L.pos, sign, kind != '{');
        uint32_t line = L.line;
        if (raw) {
            L.pos = qi + raw;
            L.line_starting = 0;
            if (raw_end == '-') L.line_starting = skip_ws(&L) == '\n';
            st = lex_raw(&L, line);
        } else if (kind == '#') {
            size_t p = qi + 2 + (sign ? 1 : 0);
            char esign = 0;
            for (; p + 1 < L.n; p++) {
                if ((L.s[p] == '-' || L.s[p] == '+') && at(&L, p + 1, "#}")) {
                    esign = L.s[p];
                    break;
                }
                if (at(&L, p, "#}")) break;
            }
            if (p + 1 >= L.n) {
                st = dt_error(DT_STATUS_FORMAT, "%s:%u: missing end of comment tag", t->name, line);
                break;
            }
            L.line += count_nl(L.s + qi, p - qi);
            L.pos = p + 2 + (esign ? 1 : 0);
            end_tag(&L, esign);
        } else {
            push(&L, kind == '%' ? JT_BLOCK_BEGIN : JT_VAR_BEGIN, line);
            L.pos = qi + 2 + (sign ? 1 : 0);
            st = lex_tag(&L, kind == '%', line);
        }
        if (st != DT_STATUS_OK) break;
    }
    if (st != DT_STATUS_OK) {
        free(L.toks);
        return st;
    }
    push(&L, JT_EOF, L.line);
    *toks = L.toks;
    *ntoks = L.ntoks;
    return DT_STATUS_OK;
}
