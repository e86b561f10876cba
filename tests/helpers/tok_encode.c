/*
 * tok_encode.c - `tok_encode TOKENIZER DOCS.jsonl [--decode] [--bench]`: one line
 * of space-separated ids per document (its "text" field), for
 * scripts/compat/tokenizer_check.py. --decode prints each document's decoded ids
 * as a JSON string instead; --bench prints "docs tokens seconds" only.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/fs.h"
#include "runtime/tokenize/tok.h"

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: tok_encode TOKENIZER DOCS.jsonl [--decode|--bench]\n");
        return 2;
    }
    int decode = argc > 3 && !strcmp(argv[3], "--decode"), bench = argc > 3 && !strcmp(argv[3], "--bench");
    dt_tok_t *t;
    if (dt_tok_load(argv[1], &t) != DT_STATUS_OK) {
        fprintf(stderr, "tok_encode: %s\n", dt_error_detail());
        return 2;
    }
    char *text;
    size_t len;
    if (dt_fs_read_file(argv[2], (size_t)1 << 34, &text, &len) != DT_STATUS_OK) {
        fprintf(stderr, "tok_encode: %s\n", dt_error_detail());
        return 2;
    }
    /* Parse every document first so that --bench times encoding only. */
    size_t ndocs = 0, cap = 1024;
    char **docs = malloc(cap * sizeof *docs);
    size_t *lens = malloc(cap * sizeof *lens);
    for (char *line = text, *nl; line < text + len; line = nl + 1) {
        nl = memchr(line, '\n', (size_t)(text + len - line));
        if (!nl)
            nl = text + len;
        if (nl == line)
            continue;
        cJSON *j = cJSON_ParseWithLength(line, (size_t)(nl - line));
        const cJSON *tx = cJSON_GetObjectItemCaseSensitive(j, "text");
        if (!cJSON_IsString(tx)) {
            fprintf(stderr, "tok_encode: %s: document %zu has no \"text\" string\n", argv[2], ndocs + 1);
            return 2;
        }
        if (ndocs == cap) {
            cap *= 2;
            docs = realloc(docs, cap * sizeof *docs);
            lens = realloc(lens, cap * sizeof *lens);
        }
        lens[ndocs] = strlen(tx->valuestring);
        docs[ndocs++] = strdup(tx->valuestring);
        cJSON_Delete(j);
    }
    dt_tok_enc_t *e = dt_tok_enc_new(t);
    dt_tok_ids ids = {0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    size_t total = 0;
    char *buf = NULL;
    size_t blen = 0, bcap = 0;
    for (size_t d = 0; d < ndocs; d++) {
        ids.n = 0;
        dt_tok_encode(e, docs[d], lens[d], 1, &ids);
        total += ids.n;
        if (bench)
            continue;
        if (decode) {
            blen = 0;
            if (dt_tok_decode(t, ids.ids, ids.n, &buf, &blen, &bcap) != DT_STATUS_OK) {
                fprintf(stderr, "tok_encode: %s\n", dt_error_detail());
                return 1;
            }
            cJSON *s = cJSON_CreateString(buf);
            char *js = cJSON_PrintUnformatted(s);
            printf("%s\n", js);
            free(js);
            cJSON_Delete(s);
            continue;
        }
        for (size_t i = 0; i < ids.n; i++)
            printf(i ? " %u" : "%u", ids.ids[i]);
        printf("\n");
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (bench)
        printf("%zu %zu %.6f\n", ndocs, total, (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    dt_tok_enc_free(e);
    dt_tok_free(t);
    return 0;
}
