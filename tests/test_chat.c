/*
 * test_chat.c - chat templates against transformers: every conversation of every
 * tests/fixtures/chat/<model>/expected.jsonl renders byte for byte as
 * apply_chat_template rendered it (or is rejected where the template raised),
 * every Jinja feature case of jinja_cases.jsonl renders as jinja2 did (both
 * written by scripts/compat/chat_templates.py and jinja_cases.py); loading
 * (folders, .jinja files, named templates, AddedToken objects), the template
 * variables transformers passes, {% generation %} spans, and the errors: syntax
 * and unsupported constructs naming what and where, raise_exception, and the
 * limits that stop hostile templates.
 */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/fs_safe.h"
#include "runtime/tokenize/chat.h"
#include "runtime/tokenize/jinja.h"

#define FIX "tests/fixtures/chat/"

/* Each line of a JSON Lines file, parsed; NULL-terminated. */
static cJSON **read_jsonl(const char *path, size_t *n) {
    char *text;
    cr_assert_eq(dt_fs_read_file(path, 1 << 26, &text, NULL), DT_STATUS_OK, "%s", dt_error_detail());
    size_t cap = 64;
    cJSON **rows = calloc(cap, sizeof *rows);
    *n = 0;
    char *save;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (*n + 1 == cap) rows = realloc(rows, (cap *= 2) * sizeof *rows);
        rows[*n] = cJSON_Parse(line);
        cr_assert_not_null(rows[*n], "%s: line %zu is not JSON", path, *n + 1);
        rows[++*n] = NULL;
    }
    free(text);
    return rows;
}

static void free_rows(cJSON **rows, size_t n) {
    for (size_t i = 0; i < n; i++) cJSON_Delete(rows[i]);
    free(rows);
}

/* The conversations of a model's expected.jsonl against dt_chat_render. */
static void check_fixture(const char *name) {
    char path[256];
    snprintf(path, sizeof path, FIX "%s", name);
    dt_chat_t *c;
    cr_assert_eq(dt_chat_load(path, &c), DT_STATUS_OK, "%s", dt_error_detail());
    snprintf(path, sizeof path, FIX "%s/expected.jsonl", name);
    size_t n, rendered = 0, rejected = 0;
    cJSON **rows = read_jsonl(path, &n);
    for (size_t i = 0; i < n; i++) {
        const cJSON *row = rows[i];
        const cJSON *extra = cJSON_GetObjectItem(row, "extra");
        char *out = NULL;
        size_t len;
        dt_status_t st = dt_chat_render(c, cJSON_GetObjectItem(row, "messages"),
                                        cJSON_IsTrue(cJSON_GetObjectItem(row, "add_generation_prompt")), extra, &out, &len);
        if (cJSON_IsTrue(cJSON_GetObjectItem(row, "error"))) {
            cr_expect_eq(st, DT_STATUS_INVALID, "%s case %zu: transformers raised (%s), dtrun returned %s", name, i,
                         cJSON_GetObjectItem(row, "reason")->valuestring, dt_status_name(st));
            rejected++;
        } else {
            const char *want = cJSON_GetObjectItem(row, "text")->valuestring;
            cr_assert_eq(st, DT_STATUS_OK, "%s case %zu: %s", name, i, dt_error_detail());
            cr_expect(len == strlen(want) && memcmp(out, want, len) == 0, "%s case %zu differs:\nwant %s\ngot  %s",
                      name, i, want, out);
            rendered++;
        }
        free(out);
    }
    cr_expect_geq(rendered, 50, "%s: %zu renders", name, rendered);
    (void)rejected;
    free_rows(rows, n);
    dt_chat_free(c);
}

Test(chat, fixture_llama3_1) { check_fixture("llama3.1"); }
Test(chat, fixture_qwen2_5) { check_fixture("qwen2.5"); }
Test(chat, fixture_mistral_v0_3) { check_fixture("mistral-v0.3"); }
Test(chat, fixture_gemma3) { check_fixture("gemma3"); }
Test(chat, fixture_gemma2) { check_fixture("gemma2"); }
Test(chat, fixture_phi3) { check_fixture("phi3"); }
Test(chat, fixture_chatml) { check_fixture("chatml"); }

/* Every feature case as jinja2 rendered it: the same text, a failure where
 * jinja2 failed, DT_STATUS_UNSUPPORTED where listed. */
Test(chat, jinja_cases) {
    size_t n;
    cJSON **rows = read_jsonl(FIX "jinja_cases.jsonl", &n);
    cr_assert_gt(n, 200);
    for (size_t i = 0; i < n; i++) {
        const char *tpl = cJSON_GetObjectItem(rows[i], "template")->valuestring;
        dt_jinja_t *t = NULL;
        dt_jinja_result res = {0};
        dt_status_t st = dt_jinja_parse(tpl, strlen(tpl), "case", &t);
        if (st == DT_STATUS_OK) st = dt_jinja_render(t, cJSON_GetObjectItem(rows[i], "vars"), NULL, &res);
        const cJSON *text = cJSON_GetObjectItem(rows[i], "text");
        if (cJSON_IsTrue(cJSON_GetObjectItem(rows[i], "unsupported")))
            cr_expect_eq(st, DT_STATUS_UNSUPPORTED, "%s: want UNSUPPORTED, got %s", tpl, dt_status_name(st));
        else if (cJSON_GetObjectItem(rows[i], "error"))
            cr_expect_neq(st, DT_STATUS_OK, "%s: jinja2 raised %s, dtrun rendered %s", tpl,
                          cJSON_GetObjectItem(rows[i], "error")->valuestring, res.text);
        else if (st != DT_STATUS_OK)
            cr_expect_fail("%s: %s %s", tpl, dt_status_name(st), dt_error_detail());
        else
            cr_expect(res.len == strlen(text->valuestring) && memcmp(res.text, text->valuestring, res.len) == 0,
                      "%s:\nwant %s\ngot  %s", tpl, text->valuestring, res.text);
        dt_jinja_result_free(&res);
        dt_jinja_free(t);
    }
    free_rows(rows, n);
}

/* ---- errors a template can hold ---- */

static dt_status_t parse_err(const char *src) {
    dt_jinja_t *t = NULL;
    dt_status_t st = dt_jinja_parse(src, strlen(src), "tpl", &t);
    dt_jinja_free(t);
    return st;
}

#define EXPECT_ERR(src, status, ...)                                                                        \
    do {                                                                                                    \
        dt_status_t st_ = parse_err(src);                                                                   \
        cr_expect_eq(st_, status, "%s: %s (%s)", src, dt_status_name(st_), dt_error_detail());              \
        const char *want_[] = {__VA_ARGS__, NULL};                                                          \
        for (const char **w_ = want_; *w_; w_++)                                                            \
            cr_expect(strstr(dt_error_detail(), *w_), "%s: '%s' not in: %s", src, *w_, dt_error_detail()); \
    } while (0)

Test(chat, unsupported_constructs_name_what_and_where) {
    EXPECT_ERR("a\nb\n{% include 'x.jinja' %}", DT_STATUS_UNSUPPORTED, "tpl:3:", "include");
    EXPECT_ERR("{% extends 'base' %}", DT_STATUS_UNSUPPORTED, "tpl:1:", "extends");
    EXPECT_ERR("{% block b %}{% endblock %}", DT_STATUS_UNSUPPORTED, "block");
    EXPECT_ERR("\n\n\n{{ x | wordwrap(10) }}", DT_STATUS_UNSUPPORTED, "tpl:4:", "'wordwrap'");
    EXPECT_ERR("{% if x %}\n{{ xs | groupby('a') }}{% endif %}", DT_STATUS_UNSUPPORTED, "tpl:2:", "'groupby'");
    EXPECT_ERR("{% for x in y recursive %}{% endfor %}", DT_STATUS_UNSUPPORTED, "recursive");
    EXPECT_ERR("{{ f(*a) }}", DT_STATUS_UNSUPPORTED, "*args");
    EXPECT_ERR("{{ '\\N{DASH}' }}", DT_STATUS_UNSUPPORTED, "\\N");
    EXPECT_ERR("{{ 99999999999999999999 }}", DT_STATUS_UNSUPPORTED, "too large");
}

Test(chat, syntax_errors_name_the_line) {
    EXPECT_ERR("ok\n{{ x ", DT_STATUS_FORMAT, "tpl:2:", "not closed");
    EXPECT_ERR("{% if x %}\nno end", DT_STATUS_FORMAT, "'if' of line 1 is not closed", "'endif'");
    EXPECT_ERR("{% for x in y %}a{% else %}", DT_STATUS_FORMAT, "'endfor'");
    EXPECT_ERR("\n{# unclosed", DT_STATUS_FORMAT, "tpl:2:", "comment");
    EXPECT_ERR("{% raw %}abc", DT_STATUS_FORMAT, "raw");
    EXPECT_ERR("{{ 'unterminated }}", DT_STATUS_FORMAT, "unterminated string");
    EXPECT_ERR("{{ (1, 2 }}", DT_STATUS_FORMAT, "unexpected '}'");
    EXPECT_ERR("{% endfor %}", DT_STATUS_FORMAT, "unknown tag 'endfor'");
    EXPECT_ERR("{% do x %}", DT_STATUS_FORMAT, "unknown tag 'do'");
    EXPECT_ERR("\n\n{% break %}", DT_STATUS_FORMAT, "tpl:3:", "outside of a for loop");
    EXPECT_ERR("{{ x | nosuchfilter }}", DT_STATUS_FORMAT, "No filter named 'nosuchfilter'");
    EXPECT_ERR("{% set 1 = 2 %}", DT_STATUS_FORMAT, "can't assign");
    EXPECT_ERR("{{ 1 + }}", DT_STATUS_FORMAT, "unexpected");
    /* jinja2 too accepts an unknown filter inside an if until it runs */
    cr_expect_eq(parse_err("{% if false %}{{ x | nosuchfilter }}{% endif %}"), DT_STATUS_OK);
}

/* ---- hostile templates: errors, never a crash or a hang ---- */

static dt_status_t render_with(const char *src, const dt_jinja_limits *lim, char **text) {
    dt_jinja_t *t;
    dt_status_t st = dt_jinja_parse(src, strlen(src), "tpl", &t);
    if (st != DT_STATUS_OK) return st;
    dt_jinja_result res;
    st = dt_jinja_render(t, NULL, lim, &res);
    if (st == DT_STATUS_OK && text)
        *text = res.text;
    else
        dt_jinja_result_free(&res);
    dt_jinja_free(t);
    return st;
}

Test(chat, hostile_templates_stop_with_errors) {
    /* recursion, through the body and through a default argument */
    cr_expect_eq(render_with("{% macro r() %}{{ r() }}{% endmacro %}{{ r() }}", NULL, NULL), DT_STATUS_LIMIT);
    cr_expect(strstr(dt_error_detail(), "macros nested more than 64"), "%s", dt_error_detail());
    cr_expect_eq(render_with("{% macro m(p=m()) %}{% endmacro %}{{ m() }}", NULL, NULL), DT_STATUS_LIMIT);
    /* output: the default 64 MiB, and a smaller bound */
    cr_expect_eq(render_with("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", NULL, NULL), DT_STATUS_LIMIT);
    cr_expect(strstr(dt_error_detail(), "64 MiB"), "%s", dt_error_detail());
    dt_jinja_limits small = {.max_output = 1 << 20, .max_steps = 100000, .max_memory = 16 << 20};
    cr_expect_eq(render_with("{% for i in range(2000) %}{{ 'y' * 1000 }}{% endfor %}", &small, NULL), DT_STATUS_LIMIT);
    /* loops: iterations count across nested loops */
    cr_expect_eq(render_with("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", &small,
                             NULL), DT_STATUS_LIMIT);
    cr_expect(strstr(dt_error_detail(), "100000 loop iterations"), "%s", dt_error_detail());
    /* memory: a string doubling in a namespace */
    cr_expect_eq(render_with("{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}"
                             "{% endfor %}", &small, NULL), DT_STATUS_LIMIT);
    cr_expect_eq(render_with("{{ 'x' * 10 ** 15 }}", NULL, NULL), DT_STATUS_LIMIT);
    cr_expect_eq(render_with("{{ '' * 10 ** 16 }}{{ () * 10 ** 16 }}", NULL, NULL), DT_STATUS_OK); /* at once */
    cr_expect_eq(render_with("{{ 2 ** 64 }}", NULL, NULL), DT_STATUS_UNSUPPORTED); /* Python ints are unbounded */
    /* jinja2's sandbox refuses big ranges too */
    cr_expect_eq(render_with("{{ range(10 ** 9) | length }}", NULL, NULL), DT_STATUS_INVALID);
    cr_expect(strstr(dt_error_detail(), "MAX_RANGE"), "%s", dt_error_detail());
    char *text = NULL;
    /* nesting: the parser and the evaluator bound the C stack */
    char deep[4000] = "{{ ";
    for (int i = 0; i < 300; i++) strcat(deep, "-");
    strcat(deep, "1 }}");
    cr_expect_eq(render_with(deep, NULL, NULL), DT_STATUS_LIMIT);
    char nested[8000] = "";
    for (int i = 0; i < 300; i++) strcat(nested, "{% if true %}");
    for (int i = 0; i < 300; i++) strcat(nested, "{% endif %}");
    cr_expect_eq(render_with(nested, NULL, NULL), DT_STATUS_LIMIT);
    char brackets[1000] = "{{ ";
    for (int i = 0; i < 600; i++) strcat(brackets, "(");
    cr_expect_eq(render_with(brackets, NULL, NULL), DT_STATUS_FORMAT);
    /* invalid UTF-8 (a .jinja file can hold any bytes): each bad byte is one character */
    cr_assert_eq(render_with("{% set s = '\x87\x87" "a\xc3\xa9\xff' %}{{ s | list | length }} {{ s | length }} "
                             "{{ s[::-1] | length }} {{ s[1:3] | length }} {{ s.strip('\x87') | length }} "
                             "{{ s.rfind('a') }} {{ s | upper | length }} {{ [s] | length }}", NULL, &text),
                 DT_STATUS_OK, "%s", dt_error_detail());
    cr_expect_str_eq(text, "5 5 5 2 3 2 5 1");
    free(text);
    /* a namespace holding itself prints as Python prints a cycle */
    cr_assert_eq(render_with("{% set ns = namespace(a=1) %}{% set ns.me = ns %}{{ ns }}", NULL, &text), DT_STATUS_OK);
    cr_expect_str_eq(text, "<Namespace {'a': 1, 'me': <Namespace {...}>}>");
    free(text);
}

/* ---- loading ---- */

static char dir[256];

static void make_dir(void) {
    snprintf(dir, sizeof dir, "/tmp/dtrun_test_chat_%d", (int)getpid());
    cr_assert_eq(dt_fs_mkdir_p(dir), DT_STATUS_OK);
}

static void put(const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
}

static char *render1(const dt_chat_t *c, const char *messages, int agp, const char *extra) {
    cJSON *m = cJSON_Parse(messages), *e = extra ? cJSON_Parse(extra) : NULL;
    char *out = NULL;
    size_t len;
    dt_status_t st = dt_chat_render(c, m, agp, e, &out, &len);
    cr_assert_eq(st, DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(strlen(out), len);
    cJSON_Delete(m);
    cJSON_Delete(e);
    return out;
}

#define USER "[{\"role\": \"user\", \"content\": \"hi\"}]"

Test(chat, load_folder_file_jinja_and_tokens) {
    make_dir();
    char path[512];
    /* AddedToken objects, extra *_token keys, booleans ending in _token ignored */
    put("tokenizer_config.json",
        "{\"bos_token\": {\"__type\": \"AddedToken\", \"content\": \"<s>\", \"lstrip\": false},"
        " \"eos_token\": \"</s>\", \"image_token\": \"<img>\", \"add_bos_token\": true, \"pad_token\": null,"
        " \"chat_template\": \"{{ bos_token }}|{{ eos_token }}|{{ image_token }}|{{ pad_token is defined }}|"
        "{{ add_bos_token is defined }}|{{ unk_token }}|{{ messages[0].content }}\"}");
    put("special_tokens_map.json", "{\"eos_token\": \"<other>\", \"unk_token\": {\"content\": \"<unk>\"}}");
    dt_chat_t *c;
    cr_assert_eq(dt_chat_load(dir, &c), DT_STATUS_OK, "%s", dt_error_detail());
    char *out = render1(c, USER, 0, NULL);
    cr_expect_str_eq(out, "<s>|</s>|<img>|False|False|<unk>|hi");
    free(out);
    cr_expect_str_eq(dt_chat_token(c, "unk_token"), "<unk>");
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    cr_expect_str_eq(dt_chat_source(c), path);
    dt_chat_free(c);
    /* the file itself */
    cr_assert_eq(dt_chat_load(path, &c), DT_STATUS_OK, "%s", dt_error_detail());
    dt_chat_free(c);
    /* chat_template.jinja beside it wins, as in transformers */
    put("chat_template.jinja", "J{{ bos_token }}{{ messages | length }}\n");
    cr_assert_eq(dt_chat_load(dir, &c), DT_STATUS_OK, "%s", dt_error_detail());
    out = render1(c, USER, 0, NULL);
    cr_expect_str_eq(out, "J<s>1"); /* one trailing newline dropped, as jinja2 does */
    free(out);
    dt_chat_free(c);
    /* a .jinja file alone: no special tokens */
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    cr_assert_eq(dt_chat_load(path, &c), DT_STATUS_OK, "%s", dt_error_detail());
    out = render1(c, USER, 0, NULL);
    cr_expect_str_eq(out, "J1");
    free(out);
    dt_chat_free(c);
    dt_fs_rm_rf(dir);
}

Test(chat, load_named_templates_and_errors) {
    make_dir();
    put("a.json", "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"},"
                  " {\"name\": \"default\", \"template\": \"D{{ messages[0].role }}\"}]}");
    put("b.json", "{\"eos_token\": \"</s>\"}");
    put("c.json", "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}]}");
    put("d.json", "{\"chat_template\": \"a\\n{% if x %}\\n{% include 'y' %}{% endif %}\"}");
    put("e.json", "{\"chat_template\": \"ok\",,}");
    char path[512];
    dt_chat_t *c;
    snprintf(path, sizeof path, "%s/a.json", dir);
    cr_assert_eq(dt_chat_load(path, &c), DT_STATUS_OK, "%s", dt_error_detail());
    char *out = render1(c, USER, 0, NULL);
    cr_expect_str_eq(out, "Duser");
    free(out);
    dt_chat_free(c);
    snprintf(path, sizeof path, "%s/b.json", dir);
    cr_expect_eq(dt_chat_load(path, &c), DT_STATUS_NOT_FOUND);
    cr_expect(strstr(dt_error_detail(), "b.json") && strstr(dt_error_detail(), "no chat_template"), "%s",
              dt_error_detail());
    snprintf(path, sizeof path, "%s/c.json", dir);
    cr_expect_eq(dt_chat_load(path, &c), DT_STATUS_NOT_FOUND);
    cr_expect(strstr(dt_error_detail(), "\"default\""), "%s", dt_error_detail());
    snprintf(path, sizeof path, "%s/d.json", dir);
    cr_expect_eq(dt_chat_load(path, &c), DT_STATUS_UNSUPPORTED);
    cr_expect(strstr(dt_error_detail(), "d.json: chat_template:3:") && strstr(dt_error_detail(), "include"), "%s",
              dt_error_detail());
    snprintf(path, sizeof path, "%s/e.json", dir);
    cr_expect_eq(dt_chat_load(path, &c), DT_STATUS_FORMAT);
    cr_expect(strstr(dt_error_detail(), "line 1"), "%s", dt_error_detail());
    snprintf(path, sizeof path, "%s/none", dir);
    cr_expect_eq(dt_chat_load(path, &c), DT_STATUS_NOT_FOUND);
    dt_fs_rm_rf(dir);
}

/* ---- the variables apply_chat_template passes ---- */

static dt_chat_t *chat_of(const char *template) {
    make_dir();
    cJSON *cfg = cJSON_CreateObject();
    cJSON_AddStringToObject(cfg, "bos_token", "<s>");
    cJSON_AddStringToObject(cfg, "chat_template", template);
    char *text = cJSON_Print(cfg);
    put("tokenizer_config.json", text);
    free(text);
    cJSON_Delete(cfg);
    dt_chat_t *c;
    cr_assert_eq(dt_chat_load(dir, &c), DT_STATUS_OK, "%s", dt_error_detail());
    dt_fs_rm_rf(dir);
    return c;
}

Test(chat, template_variables_as_transformers_passes_them) {
    /* tools and documents are None unless given; add_generation_prompt a bool */
    dt_chat_t *c = chat_of("{{ tools is defined }} {{ tools is none }} {{ documents is none }} "
                           "{{ add_generation_prompt }} {{ enable_thinking | default('unset') }} {{ tools }}");
    char *out = render1(c, USER, 1, NULL);
    cr_expect_str_eq(out, "True True True True unset None");
    free(out);
    out = render1(c, USER, 0, "{\"enable_thinking\": false, \"tools\": [{\"name\": \"f\"}]}");
    cr_expect_str_eq(out, "True False True False False [{'name': 'f'}]");
    free(out);
    dt_chat_free(c);
    /* None-valued keys dropped; reasoning copied to "thinking" (first) and
     * "reasoning_content", as transformers' _alias_reasoning_fields does */
    c = chat_of("{% for m in messages %}{{ m }}\n{% endfor %}");
    out = render1(c, "[{\"role\": \"user\", \"content\": \"q\", \"x\": null},"
                     " {\"role\": \"assistant\", \"content\": \"a\", \"reasoning\": \"r\"},"
                     " {\"role\": \"assistant\", \"content\": null, \"reasoning_content\": \"t\", \"thinking\": \"u\"}]",
                  0, NULL);
    cr_expect_str_eq(out, "{'role': 'user', 'content': 'q'}\n"
                          "{'thinking': 'r', 'role': 'assistant', 'content': 'a', 'reasoning': 'r', 'reasoning_content': 'r'}\n"
                          "{'thinking': 'u', 'role': 'assistant', 'reasoning_content': 't'}\n");
    free(out);
    dt_chat_free(c);
}

Test(chat, render_errors) {
    dt_chat_t *c = chat_of("{% for m in messages %}{% if m.role == 'system' %}\n"
                           "{{ raise_exception('System role not supported') }}{% endif %}{{ m.content }}{% endfor %}");
    char *out = NULL;
    size_t len;
    cJSON *m = cJSON_Parse("[{\"role\": \"system\", \"content\": \"s\"}]");
    cr_expect_eq(dt_chat_render(c, m, 0, NULL, &out, &len), DT_STATUS_INVALID);
    cr_expect(strstr(dt_error_detail(), "System role not supported") && strstr(dt_error_detail(), ":2:"), "%s",
              dt_error_detail());
    cr_expect_null(out);
    cJSON_Delete(m);
    m = cJSON_Parse("[]");
    cr_expect_eq(dt_chat_render(c, m, 0, NULL, &out, &len), DT_STATUS_INVALID);
    cr_expect(strstr(dt_error_detail(), "empty conversation"), "%s", dt_error_detail());
    cJSON_Delete(m);
    m = cJSON_Parse("[\"hello\"]");
    cr_expect_eq(dt_chat_render(c, m, 0, NULL, &out, &len), DT_STATUS_INVALID);
    cJSON_Delete(m);
    m = cJSON_Parse(USER);
    cJSON *e = cJSON_Parse("{\"messages\": []}");
    cr_expect_eq(dt_chat_render(c, m, 0, e, &out, &len), DT_STATUS_INVALID);
    cJSON_Delete(e);
    cJSON_Delete(m);
    dt_chat_free(c);
    /* an undefined value used as an object fails as jinja2's UndefinedError */
    c = chat_of("{{ messages[0].nope.deeper }}");
    m = cJSON_Parse(USER);
    cr_expect_eq(dt_chat_render(c, m, 0, NULL, &out, &len), DT_STATUS_INVALID);
    cr_expect(strstr(dt_error_detail(), "'dict object' has no attribute 'nope'"), "%s", dt_error_detail());
    cJSON_Delete(m);
    dt_chat_free(c);
}

/* ---- generation spans (the assistant-token mask) ---- */

Test(chat, generation_spans) {
    dt_chat_t *c = chat_of("{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}"
                           "{% generation %}{{ m.content }}</s>{% endgeneration %}{% else %}{{ m.content }}{% endif %}"
                           "{% endfor %}");
    cr_assert(dt_chat_has_generation(c));
    cJSON *m = cJSON_Parse("[{\"role\": \"user\", \"content\": \"héllo\"}, {\"role\": \"assistant\", \"content\": \"ok\"},"
                           " {\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": \"日本\"}]");
    char *out;
    size_t len, n;
    dt_jinja_span *spans;
    cr_assert_eq(dt_chat_render_spans(c, m, 0, NULL, &out, &len, &spans, &n), DT_STATUS_OK, "%s", dt_error_detail());
    cr_expect_str_eq(out, "<user>héllo<assistant>ok</s><user>x<assistant>日本</s>");
    cr_assert_eq(n, 2);
    cr_expect_eq(spans[0].end - spans[0].start, 6);
    cr_expect(memcmp(out + spans[0].start, "ok</s>", 6) == 0);
    cr_expect(memcmp(out + spans[1].start, "日本</s>", spans[1].end - spans[1].start) == 0);
    cr_expect_eq(spans[1].end, len);
    free(out);
    free(spans);
    cJSON_Delete(m);
    dt_chat_free(c);
    c = chat_of("{{ messages[0].content }}");
    cr_expect_not(dt_chat_has_generation(c));
    dt_chat_free(c);
}

/* ---- a loaded template is shared by threads ---- */

typedef struct job {
    const dt_chat_t *c;
    const cJSON *m;
    const char *want;
    int ok;
} job;

static void *render_many(void *arg) {
    job *j = arg;
    j->ok = 1;
    for (int i = 0; i < 50; i++) {
        char *out;
        size_t len;
        if (dt_chat_render(j->c, j->m, 1, NULL, &out, &len) != DT_STATUS_OK || strcmp(out, j->want)) j->ok = 0;
        free(out);
    }
    return NULL;
}

Test(chat, renders_in_parallel) {
    dt_chat_t *c;
    cr_assert_eq(dt_chat_load(FIX "qwen2.5", &c), DT_STATUS_OK, "%s", dt_error_detail());
    cJSON *m = cJSON_Parse("[{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"q\"}]");
    char *want = render1(c, "[{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"q\"}]", 1,
                         NULL);
    cr_expect_str_eq(want, "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n");
    pthread_t th[4];
    job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (job){c, m, want, 0};
        pthread_create(&th[i], NULL, render_many, &jobs[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        cr_expect(jobs[i].ok, "thread %d", i);
    }
    free(want);
    cJSON_Delete(m);
    dt_chat_free(c);
}
