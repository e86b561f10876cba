/*
 * jinja_internal.h - what the pieces of the Jinja renderer share: tokens
 * (jinja_lex.c), the syntax tree (jinja_parse.c expressions, jinja_stmt.c tags,
 * jinja_scope.c jinja2's static scoping), Python-like values and their arena
 * (jinja_value.c, printed by jinja_print.c), the evaluator (jinja_eval.c
 * expressions, jinja_exec.c statements and limits), filters (jinja_filter.c),
 * tests (jinja_test.c), methods and globals (jinja_method.c), str operations
 * (jinja_str.c). Not a contract.
 *
 * Supported (everything else jinja2 has is DT_STATUS_UNSUPPORTED naming it):
 *   tags        if/elif/else, for (else, `if` filter, unpacking, loop.*), break,
 *               continue, set (names, tuples, ns.attr, set blocks), macro, call,
 *               filter blocks, with, raw, generation, print
 *   filters     abs attr capitalize center count d default dictsort e escape first
 *               float forceescape format indent int items join last length list
 *               lower map max min reject rejectattr replace reverse round safe
 *               select selectattr sort string sum title tojson trim unique upper
 *               wordcount
 *   tests       every test of jinja2 but sameas on numbers and strings
 *   globals     range namespace dict raise_exception strftime_now
 *   methods     str: strip lstrip rstrip split rsplit splitlines startswith
 *               endswith upper lower title capitalize replace find rfind index
 *               rindex count join format isdigit isalpha isalnum isspace islower
 *               isupper center ljust rjust zfill; dict: get items keys values copy;
 *               list/tuple: index count; loop: cycle
 * Case mapping is Python's (full mappings, final sigma; tables generated from the
 * running Python by scripts/gen_case_tables.py); only islower()/isupper() of a
 * non-ASCII cased letter is DT_STATUS_UNSUPPORTED.
 */
#ifndef DT_RUNTIME_TOKENIZE_JINJA_INTERNAL_H
#define DT_RUNTIME_TOKENIZE_JINJA_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/tokenize/jinja.h"

/* ---- arena: every node of a template, every value of a render ---- */

typedef struct jj_chunk jj_chunk;
typedef struct jj_arena {
    jj_chunk *head;
    size_t total;  /* bytes taken from malloc */
    size_t limit;  /* 0: none */
} jj_arena;

/* 16-byte aligned, zeroed; NULL once limit would be passed. */
void *jj_alloc(jj_arena *a, size_t n);
void jj_arena_free(jj_arena *a);

/* ---- tokens ---- */

typedef enum jj_tok_type {
    JT_DATA, JT_VAR_BEGIN, JT_VAR_END, JT_BLOCK_BEGIN, JT_BLOCK_END,
    JT_NAME, JT_STRING, JT_INT, JT_FLOAT, JT_OP, JT_EOF
} jj_tok_type;

typedef enum jj_op {
    JO_NONE, JO_ADD, JO_SUB, JO_MUL, JO_DIV, JO_FLOORDIV, JO_MOD, JO_POW, JO_TILDE,
    JO_LBRACKET, JO_RBRACKET, JO_LPAREN, JO_RPAREN, JO_LBRACE, JO_RBRACE, JO_ASSIGN,
    JO_DOT, JO_COLON, JO_PIPE, JO_COMMA, JO_SEMICOLON,
    JO_EQ, JO_NE, JO_LT, JO_LTEQ, JO_GT, JO_GTEQ, JO_IN, JO_NOTIN
} jj_op;

typedef struct jj_tok {
    uint8_t type, op;
    uint32_t line;
    const char *p; /* DATA: text; NAME: name; STRING: the decoded value */
    size_t n;
    int64_t i;     /* INT */
    double f;      /* FLOAT */
} jj_tok;

/* ---- values ---- */

typedef enum jv_kind {
    JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT,
    JV_NS, JV_LOOP, JV_MACRO, JV_FUNC, JV_METHOD
} jv_kind;
/* JV_LIST sub-kinds: how Python would print it and what it allows. */
enum { JL_LIST, JL_TUPLE, JL_GEN, JL_ITEMS, JL_KEYS, JL_VALUES, JL_RANGE };
/* JV_STR sub-kinds: Markup ("| safe") escapes what it is added to. */
enum { JS_PLAIN, JS_MARKUP };
/* JV_UNDEF: why (for the message when it is used); u.s the name or message. */
enum { JU_NAME, JU_ATTR, JU_ITEM, JU_UNSAFE, JU_MSG };

typedef struct jj_list jj_list;
typedef struct jj_dict jj_dict;
typedef struct jj_loop jj_loop;
typedef struct jj_macro jj_macro;
typedef struct jj_method jj_method;

typedef struct jv {
    uint8_t kind, sub, aux; /* aux: JV_UNDEF's object kind (JU_ATTR, JU_ITEM, JU_UNSAFE) */
    union {
        int64_t i; /* BOOL, INT, FUNC (global id) */
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        jj_list *l;
        jj_dict *d; /* DICT, NS */
        jj_loop *loop;
        jj_macro *m;
        jj_method *meth;
    } u;
} jv;

struct jj_list {
    jv *v;
    size_t n, cap;
    int consumed; /* JL_GEN: iterated once already (a Python generator is then empty) */
    int64_t start, stop, step; /* JL_RANGE: what it prints as */
};
struct jj_dict {
    jv *k, *v;
    size_t n, cap;
};
struct jj_loop {
    jv *items;
    size_t n, i;
};
struct jj_method {
    jv self;
    int id;
    const char *name; /* for messages (and the methods that exist but are not implemented) */
    size_t n;
};

/* ---- syntax tree ---- */

typedef enum jj_ntype {
    /* expressions */
    JN_CONST, JN_NAME, JN_LIST, JN_TUPLE, JN_DICT, JN_GETATTR, JN_GETITEM, JN_SLICE, JN_CALL,
    JN_FILTER, JN_TEST, JN_BINOP, JN_CONCAT, JN_CMP, JN_AND, JN_OR, JN_NOT, JN_NEG, JN_POS,
    JN_COND, JN_KWARG, JN_NSREF,
    /* statements */
    JN_TEXT, JN_PRINT, JN_IF, JN_FOR, JN_SET, JN_SETBLOCK, JN_MACRO, JN_CALLBLOCK,
    JN_FILTERBLOCK, JN_WITH, JN_BREAK, JN_CONTINUE, JN_GENERATION
} jj_ntype;

typedef struct jj_node jj_node;
typedef struct jj_nlist {
    jj_node **v;
    uint32_t n;
} jj_nlist;

/* Macro flags: what the body reads beyond its parameters. */
enum { JJ_USES_VARARGS = 1, JJ_USES_KWARGS = 2, JJ_USES_CALLER = 4 };

struct jj_node {
    uint8_t type, op, flag;
    uint32_t line;
    jj_node *a, *b, *c;
    jj_nlist l1, l2, l3;
    const char *s, *s2; /* names, text */
    size_t sn, s2n;
    int id;             /* FILTER/TEST: jj_filter_id/jj_test_id (-1: unknown, fails when run) */
    uint8_t *ops;       /* CMP: one jj_op per operand of l1 */
    jv val;             /* CONST */
    jj_nlist miss, miss2; /* names a scope starts as undefined (jinja_scope.c): FOR body, else */
};
/*
 * Fields by type:
 *   CONST val; NAME s; LIST/TUPLE l1; DICT l1 keys, l2 values; GETATTR a, s;
 *   GETITEM a, b (b may be a SLICE: a, b, c, each may be NULL); CALL a, l1 args,
 *   l2 KWARG (s, a); FILTER/TEST a (NULL: the filter block's text), s, id, l1, l2;
 *   BINOP op a b; CONCAT l1; CMP a, l1, ops; AND/OR a b; NOT/NEG/POS a;
 *   COND a (test) b (then) c (else, may be NULL); NSREF s (name) s2 (attribute);
 *   TEXT s; PRINT a; IF a, l1 body, l2 else; FOR a target, b iterable, c filter,
 *   l1 body, l2 else; SET a target, b value; SETBLOCK a target, c filters, l1 body;
 *   MACRO s, l1 parameters (NAME), l3 defaults (NULL where none), l2 body, flag;
 *   CALLBLOCK a (CALL), l1, l3, l2 as MACRO's; FILTERBLOCK c filters, l1 body;
 *   WITH l1 targets, l3 values, l2 body; GENERATION l1 body.
 *   Scopes (FOR body and else, MACRO, CALLBLOCK, WITH, SETBLOCK, FILTERBLOCK,
 *   GENERATION) list in miss (FOR's else: miss2) the names they start undefined.
 */

struct dt_jinja {
    char *name;
    char *src;       /* the source, newlines normalized */
    jj_arena pool;   /* nodes and literal strings */
    jj_nlist body;
    jj_nlist miss;   /* names the template's own scope starts as undefined */
    int has_generation;
};

/* ---- rendering ---- */

typedef struct jj_var {
    const char *name;
    size_t n;
    jv v;
} jj_var;
typedef struct jj_frame jj_frame;
struct jj_frame {
    jj_frame *parent;
    jj_var *vars;
    size_t n, cap;
};
struct jj_macro {
    const jj_node *def; /* MACRO or CALLBLOCK */
    jj_frame *closure;
    jv caller;          /* the call block a macro was called from (JV_UNDEF: none) */
};

typedef struct jj_buf {
    char *p;
    size_t n, cap;
} jj_buf;

typedef struct jj_render {
    const dt_jinja_t *t;
    jj_arena arena;
    jj_buf *out;     /* where text goes now: the result or a capture */
    jj_buf root;
    int capture;     /* > 0 while text goes to a capture (macro, set block, ...) */
    dt_jinja_span *spans;
    size_t nspans, capspans;
    dt_jinja_limits lim;
    uint64_t steps;
    int depth;       /* macro calls */
    int nest;        /* evaluations and blocks (C stack) */
    int ctl;         /* JJ_CTL_* after break / continue */
    const void *repr_stack[1024]; /* containers being printed (Python's repr of a cycle: {...}) */
    int repr_depth;
    jv filter_input; /* what a filter node with no input filters */
    int has_filter_input;
} jj_render;
enum { JJ_CTL_NONE, JJ_CTL_BREAK, JJ_CTL_CONTINUE };

/* jinja_lex.c: the whole template as tokens (in t->pool; the source normalized
 * into t->src first). */
dt_status_t jj_lex(dt_jinja_t *t, const char *src, size_t len, jj_tok **toks, size_t *ntoks);

/* jinja_scope.c: fills the miss lists of the scopes (after parsing). */
dt_status_t jj_scope_analyze(dt_jinja_t *t);

/* jinja_value.c */
jv jv_undef_name(const char *name, size_t n);
jv jv_str(const char *p, size_t n);
jv jv_int(int64_t i);
jv jv_bool(int b);
jv jv_float(double f);
jv jv_none(void);
static inline jv jv_cstr(const char *s) { size_t n = 0; while (s[n]) n++; return jv_str(s, n); }
dt_status_t jj_oom(jj_render *r);
dt_status_t jj_fail(jj_render *r, uint32_t line, dt_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A string copied into the render's arena. */
dt_status_t jj_strdup(jj_render *r, const char *p, size_t n, jv *out);
jj_list *jj_list_new(jj_render *r, size_t cap);
dt_status_t jj_list_push(jj_render *r, jj_list *l, jv v);
jj_dict *jj_dict_new(jj_render *r, size_t cap);
/* Sets key (replacing its value in place when present). */
dt_status_t jj_dict_set(jj_render *r, jj_dict *d, jv k, jv v);
/* The value of key, or NULL. */
jv *jj_dict_get(const jj_dict *d, jv k);
jv *jj_dict_getn(const jj_dict *d, const char *key, size_t n);
dt_status_t jj_from_json(jj_render *r, const cJSON *j, jv *out);

void jj_buf_init(jj_buf *b);
dt_status_t jj_buf_put(jj_render *r, jj_buf *b, const char *p, size_t n);
/* Python str(v) / repr(v) appended to b. */
dt_status_t jj_str_into(jj_render *r, jj_buf *b, jv v, uint32_t line);
dt_status_t jj_repr_into(jj_render *r, jj_buf *b, jv v, uint32_t line);
/* str(v) as a value (v itself when it is a string). */
dt_status_t jj_to_str(jj_render *r, jv v, uint32_t line, jv *out);
/* The text a buffer holds, copied into the arena. */
dt_status_t jj_buf_take(jj_render *r, jj_buf *b, jv *out);
/* json.dumps(v, ensure_ascii, indent (NULL: none), separators (NULL: default), sort_keys). */
dt_status_t jj_json_into(jj_render *r, jj_buf *b, jv v, int ensure_ascii, const char *indent, size_t indent_n,
                         const char *item_sep, const char *key_sep, int sort_keys, int level, uint32_t line);

int jj_truthy(jv v);
int jj_eq(jv a, jv b);
/* Python's a < b: -1, 0, 1 in *cmp; an error when the types do not order. */
dt_status_t jj_cmp(jj_render *r, jv a, jv b, uint32_t line, int *cmp);
const char *jj_type_name(jv v); /* Python's type(v).__name__ */
/* len(v): an error for what has no len. */
dt_status_t jj_len(jj_render *r, jv v, uint32_t line, int64_t *n);
/* The items iterating v gives (a generator is consumed). */
dt_status_t jj_iter(jj_render *r, jv v, uint32_t line, jv **items, size_t *n);
/* environment.getattr / getitem of the sandbox. */
dt_status_t jj_getattr(jj_render *r, jv obj, const char *name, size_t n, uint32_t line, jv *out);
dt_status_t jj_getitem(jj_render *r, jv obj, jv key, uint32_t line, jv *out);
/* Fails with jinja2's UndefinedError message when v is undefined (for operations
 * that do not accept it). */
dt_status_t jj_undef_fail(jj_render *r, jv v, uint32_t line);
void jj_float_repr(double f, char *buf, size_t len);

/* Unicode helpers over UTF-8. */
int jj_py_isspace(int32_t cp);
/* Bytes of the character at p (n > 0; an invalid byte is one); the start of the
 * character before i (i > a) within p[a..). */
size_t jj_utf8_next(const char *p, size_t n);
size_t jj_utf8_prev(const char *p, size_t a, size_t i);
size_t jj_utf8_count(const char *p, size_t n);
/* Byte offset of code point index i (clamped to n). */
size_t jj_utf8_offset(const char *p, size_t n, size_t i);

#define JJ_MAX_NEST 1500 /* nested evaluations and blocks: ~1 MB of C stack at most */

/* jinja_eval.c */
jj_frame *jj_frame_new(jj_render *r, jj_frame *parent);
/* A name's value in f or the scopes around it; NULL when none has it. */
jv *jj_frame_find(jj_frame *f, const char *name, size_t n);
dt_status_t jj_frame_set(jj_render *r, jj_frame *f, const char *name, size_t n, jv v);
typedef struct jj_callargs {
    jv *args;
    size_t nargs;
    const char **kwn;
    size_t *kwl;
    jv *kwv;
    size_t nkw;
} jj_callargs;
/* x's arguments (l1) and keyword arguments (l2), with room for extra_kw more keywords. */
dt_status_t jj_eval_args(jj_render *r, jj_frame *f, const jj_node *x, int extra_kw, jj_callargs *a);
dt_status_t jj_eval(jj_render *r, jj_frame *f, const jj_node *n, jv *out);
/* Calls a macro, function or method with evaluated arguments. */
dt_status_t jj_call(jj_render *r, jv fn, const jv *args, size_t nargs, const char *const *kwn, const size_t *kwl,
                    const jv *kwv, size_t nkw, uint32_t line, jv *out);
dt_status_t jj_step(jj_render *r, uint32_t line);

/* jinja_exec.c */
/* Binds the names a scope starts undefined (jinja_scope.c). */
dt_status_t jj_bind_missing(jj_render *r, jj_frame *f, const jj_nlist *miss);

/* jinja_filter.c, jinja_test.c: ids of the names jinja2 knows (-1: jinja2 has none so named;
 * -2: jinja2 has it, this renderer does not). */
int jj_filter_id(const char *name, size_t n);
int jj_test_id(const char *name, size_t n);
dt_status_t jj_filter(jj_render *r, int id, jv in, const jv *args, size_t nargs, const char *const *kwn,
                      const size_t *kwl, const jv *kwv, size_t nkw, uint32_t line, jv *out);
dt_status_t jj_test(jj_render *r, int id, jv in, const jv *args, size_t nargs, uint32_t line, int *out);
/* A test by its name as a string (select("equalto", x)). */
dt_status_t jj_test_named(jj_render *r, jv name, jv in, const jv *args, size_t nargs, uint32_t line, int *out);

/* jinja_method.c */
/* Binds Python-style arguments to the parameters names[0..np): out[i] and have[i]
 * (1 when given); an error for too many arguments or an unknown keyword. */
dt_status_t jj_bind(jj_render *r, const char *fname, const char *const *names, int np, const jv *args, size_t nargs,
                    const char *const *kwn, const size_t *kwl, const jv *kwv, size_t nkw, uint32_t line, jv *out,
                    int *have);
/* The method `name` of a string, list, dict or loop as a value: 1; 0 when it has
 * none; -1 out of memory. */
int jj_method_lookup(jj_render *r, jv self, const char *name, size_t n, jv *out);
dt_status_t jj_method_call(jj_render *r, const jj_method *m, const jv *args, size_t nargs, const char *const *kwn,
                           const size_t *kwl, const jv *kwv, size_t nkw, uint32_t line, jv *out);
/* Global functions: ids for JV_FUNC. */
enum { JJ_FN_RANGE, JJ_FN_NAMESPACE, JJ_FN_DICT, JJ_FN_RAISE, JJ_FN_STRFTIME, JJ_FN_LIPSUM, JJ_FN_CYCLER,
       JJ_FN_JOINER, JJ_FN_COUNT_ };
int jj_global_lookup(const char *name, size_t n, jv *out);
dt_status_t jj_global_call(jj_render *r, int id, const jv *args, size_t nargs, const char *const *kwn,
                           const size_t *kwl, const jv *kwv, size_t nkw, uint32_t line, jv *out);

/* jinja_unicode_tables.c (scripts/gen_case_tables.py): Python's case mappings as
 * runs (first..last every stride maps to cp + delta) and full mappings to several
 * characters; the Cased and Case_Ignorable properties; what isprintable() rejects. */
typedef struct jj_case_run {
    uint32_t first, last;
    int32_t stride, delta;
} jj_case_run;
typedef struct jj_case_full {
    uint32_t cp;
    const char *s; /* UTF-8 */
} jj_case_full;
extern const jj_case_run jj_uni_upper[], jj_uni_lower[], jj_uni_title[];
extern const size_t jj_uni_upper_n, jj_uni_lower_n, jj_uni_title_n;
extern const jj_case_full jj_uni_upper_full[], jj_uni_lower_full[], jj_uni_title_full[];
extern const size_t jj_uni_upper_full_n, jj_uni_lower_full_n, jj_uni_title_full_n;
extern const uint32_t jj_uni_cased[][2], jj_uni_case_ignorable[][2], jj_uni_unprintable[][2];
extern const size_t jj_uni_cased_n, jj_uni_case_ignorable_n, jj_uni_unprintable_n;
/* cp in one of n sorted ranges. */
int jj_uni_in(const uint32_t (*ranges)[2], size_t n, uint32_t cp);

/* jinja_str.c: Python's str operations. */
dt_status_t jj_need_str(jj_render *r, jv v, const char *what, uint32_t line);
dt_status_t jj_need_int(jj_render *r, jv v, const char *what, uint32_t line);
/* 1 for a cased letter outside ASCII (islower/isupper refuse them). */
int jj_case_unknown(int32_t cp);
dt_status_t jj_str_split(jj_render *r, jv s, jv sep, int64_t maxsplit, int from_right, uint32_t line, jv *out);
/* how: 0 center, 1 ljust, 2 rjust */
dt_status_t jj_str_pad(jj_render *r, jv s, jv width, jv fill, int how, uint32_t line, jv *out);
dt_status_t jj_str_format(jj_render *r, jv s, const jv *args, size_t nargs, const jj_dict *kw, uint32_t line,
                          jv *out);
dt_status_t jj_str_strip(jj_render *r, jv s, const jv *chars, int left, int right, uint32_t line, jv *out);
dt_status_t jj_str_replace(jj_render *r, jv s, jv old, jv new_, int64_t count, uint32_t line, jv *out);
/* Case mapping: 0 lower, 1 upper, 2 capitalize, 3 title (jinja's filter), 4 title (str.title). */
dt_status_t jj_str_case(jj_render *r, jv s, int how, uint32_t line, jv *out);
dt_status_t jj_str_splitlines(jj_render *r, const char *p, size_t n, int keepends, jj_list **out);
/* printf-style formatting: "%s" % args. */
dt_status_t jj_str_percent(jj_render *r, jv fmt, jv args, uint32_t line, jv *out);
/* HTML escaping (markupsafe.escape; jinja_print.c). */
dt_status_t jj_escape(jj_render *r, jv v, uint32_t line, jv *out);

#endif /* DT_RUNTIME_TOKENIZE_JINJA_INTERNAL_H */
