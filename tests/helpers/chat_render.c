/*
 * chat_render.c - the chat template renderer from the command line, for
 * scripts/compat/chat_templates.py and for trying templates by hand:
 *
 *   chat_render PATH CASES.jsonl    PATH as dt_chat_load takes it; each line of
 *                                   CASES.jsonl {"messages", "add_generation_prompt",
 *                                   "extra"?} -> one line {"text": ...} or
 *                                   {"error": ..., "status": ...}
 *   chat_render --jinja FILE [VARS.json]   renders a bare template with the
 *                                   variables of VARS.json; the text to stdout
 *   chat_render --jinja-cases CASES.jsonl  each line {"template", "vars"} -> one
 *                                   line {"text": ...} or {"error": ..., "status": ...}
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fs.h"
#include "runtime/tokenize/chat.h"
#include "runtime/tokenize/jinja.h"

static int bare(const char *file, const char *vars_file) {
    char *src, *vtext = NULL;
    size_t len;
    if (dt_fs_read_file(file, 1 << 26, &src, &len) != DT_STATUS_OK) {
        fprintf(stderr, "chat_render: %s\n", dt_error_detail());
        return 2;
    }
    cJSON *vars = NULL;
    if (vars_file) {
        if (dt_fs_read_file(vars_file, 1 << 26, &vtext, NULL) != DT_STATUS_OK || !(vars = cJSON_Parse(vtext))) {
            fprintf(stderr, "chat_render: %s: cannot read the variables\n", vars_file);
            return 2;
        }
    }
    dt_jinja_t *t;
    dt_status_t st = dt_jinja_parse(src, len, file, &t);
    if (st == DT_STATUS_OK) {
        dt_jinja_result res;
        st = dt_jinja_render(t, vars, NULL, &res);
        if (st == DT_STATUS_OK) {
            fwrite(res.text, 1, res.len, stdout);
            for (size_t i = 0; i < res.nspans; i++)
                fprintf(stderr, "generation span %zu..%zu\n", res.spans[i].start, res.spans[i].end);
            dt_jinja_result_free(&res);
        }
        dt_jinja_free(t);
    }
    if (st != DT_STATUS_OK) fprintf(stderr, "%s: %s\n", dt_status_name(st), dt_error_detail());
    cJSON_Delete(vars);
    free(vtext);
    free(src);
    return st == DT_STATUS_OK ? 0 : 1;
}

/* One rendered case as a JSON line. */
static void answer(dt_status_t st, const char *text) {
    cJSON *o = cJSON_CreateObject();
    if (st == DT_STATUS_OK) {
        cJSON_AddStringToObject(o, "text", text);
    } else {
        cJSON_AddStringToObject(o, "error", dt_error_detail());
        cJSON_AddStringToObject(o, "status", dt_status_name(st));
    }
    char *s = cJSON_PrintUnformatted(o);
    puts(s);
    free(s);
    cJSON_Delete(o);
}

static int bare_cases(const char *file) {
    char *text;
    size_t len;
    if (dt_fs_read_file(file, (size_t)1 << 30, &text, &len) != DT_STATUS_OK) {
        fprintf(stderr, "chat_render: %s\n", dt_error_detail());
        return 2;
    }
    for (char *line = text, *nl; line < text + len; line = nl + 1) {
        nl = memchr(line, '\n', (size_t)(text + len - line));
        if (!nl) nl = text + len;
        *nl = 0;
        if (line == nl) continue;
        cJSON *cs = cJSON_Parse(line);
        const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(cs, "template");
        dt_jinja_t *t = NULL;
        dt_jinja_result res = {0};
        dt_status_t st = cJSON_IsString(tpl) ? dt_jinja_parse(tpl->valuestring, strlen(tpl->valuestring), "t", &t)
                                             : dt_error(DT_STATUS_FORMAT, "a case without a template");
        if (st == DT_STATUS_OK) st = dt_jinja_render(t, cJSON_GetObjectItemCaseSensitive(cs, "vars"), NULL, &res);
        answer(st, res.text);
        dt_jinja_result_free(&res);
        dt_jinja_free(t);
        cJSON_Delete(cs);
    }
    free(text);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "--jinja") == 0) return bare(argv[2], argc > 3 ? argv[3] : NULL);
    if (argc == 3 && strcmp(argv[1], "--jinja-cases") == 0) return bare_cases(argv[2]);
    if (argc != 3) {
        fprintf(stderr, "usage: chat_render PATH CASES.jsonl | chat_render --jinja FILE [VARS.json]\n");
        return 2;
    }
    dt_chat_t *c;
    if (dt_chat_load(argv[1], &c) != DT_STATUS_OK) {
        fprintf(stderr, "chat_render: %s\n", dt_error_detail());
        return 2;
    }
    char *text;
    size_t len;
    if (dt_fs_read_file(argv[2], (size_t)1 << 30, &text, &len) != DT_STATUS_OK) {
        fprintf(stderr, "chat_render: %s\n", dt_error_detail());
        dt_chat_free(c);
        return 2;
    }
    for (char *line = text, *nl; line < text + len; line = nl + 1) {
        nl = memchr(line, '\n', (size_t)(text + len - line));
        if (!nl) nl = text + len;
        *nl = 0;
        if (line == nl) continue;
        cJSON *cs = cJSON_Parse(line);
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(cs, "messages");
        const cJSON *agp = cJSON_GetObjectItemCaseSensitive(cs, "add_generation_prompt");
        const cJSON *extra = cJSON_GetObjectItemCaseSensitive(cs, "extra");
        char *out = NULL;
        size_t olen;
        dt_status_t st = cs ? dt_chat_render(c, msgs, cJSON_IsTrue(agp), cJSON_IsObject(extra) ? extra : NULL, &out,
                                             &olen)
                            : dt_error(DT_STATUS_FORMAT, "a case is not JSON");
        answer(st, out);
        free(out);
        cJSON_Delete(cs);
    }
    free(text);
    dt_chat_free(c);
    return 0;
}
