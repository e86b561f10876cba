/*
 * test_tok.c - the tokenizer against Hugging Face `tokenizers`: the ids of every
 * fixture document equal those tokenizers produced (tests/fixtures/tok/<name>/,
 * written by scripts/compat/tokenizer_check.py --write-fixtures), cut points give
 * the same ids as the whole text, decode round-trips, invalid UTF-8 is counted and
 * encoded byte by byte, and malformed or unsupported tokenizer.json files are
 * errors naming the file and key.
 */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fs.h"
#include "runtime/tokenize/tok.h"

#define FIX "tests/fixtures/tok/"

typedef struct docs {
    char **text;
    size_t *len;
    dt_tok_ids *want;
    size_t n;
} docs;

static docs read_fixture(const char *name) {
    char path[256];
    char *jl, *ids;
    docs d = {0};
    snprintf(path, sizeof path, FIX "%s/docs.jsonl", name);
    cr_assert_eq(dt_fs_read_file(path, 1 << 24, &jl, NULL), DT_STATUS_OK, "%s", dt_error_detail());
    snprintf(path, sizeof path, FIX "%s/ids.txt", name);
    cr_assert_eq(dt_fs_read_file(path, 1 << 24, &ids, NULL), DT_STATUS_OK, "%s", dt_error_detail());
    d.text = calloc(4096, sizeof *d.text);
    d.len = calloc(4096, sizeof *d.len);
    d.want = calloc(4096, sizeof *d.want);
    char *save1, *save2;
    for (char *line = strtok_r(jl, "\n", &save1); line; line = strtok_r(NULL, "\n", &save1)) {
        cJSON *j = cJSON_Parse(line);
        cr_assert(cJSON_IsString(cJSON_GetObjectItem(j, "text")));
        d.text[d.n] = strdup(cJSON_GetObjectItem(j, "text")->valuestring);
        d.len[d.n] = strlen(d.text[d.n]);
        d.n++;
        cJSON_Delete(j);
    }
    size_t k = 0;
    for (char *p = ids; *p && k < d.n; k++) {
        char *nl = strchr(p, '\n');
        cr_assert_not_null(nl);
        *nl = 0;
        for (char *q = strtok_r(p, " ", &save2); q; q = strtok_r(NULL, " ", &save2))
            dt_tok_ids_push(&d.want[k], (uint32_t)strtoul(q, NULL, 10));
        p = nl + 1;
    }
    cr_assert_eq(k, d.n, "%s: %zu id lines for %zu documents", name, k, d.n);
    cr_assert_gt(d.n, 100);
    free(jl), free(ids);
    return d;
}

static void docs_free(docs *d) {
    for (size_t i = 0; i < d->n; i++) {
        free(d->text[i]);
        free(d->want[i].ids);
    }
    free(d->text), free(d->len), free(d->want);
}

static dt_tok_t *load(const char *name) {
    char path[256];
    snprintf(path, sizeof path, FIX "%s/tokenizer.json", name);
    dt_tok_t *t;
    cr_assert_eq(dt_tok_load(path, &t), DT_STATUS_OK, "%s", dt_error_detail());
    return t;
}

static void ids_eq(const dt_tok_ids *got, const dt_tok_ids *want, const char *what, size_t doc) {
    size_t k = 0;
    while (k < got->n && k < want->n && got->ids[k] == want->ids[k])
        k++;
    cr_assert(got->n == want->n && k == got->n, "%s doc %zu: %zu ids, want %zu; first difference at %zu", what, doc,
              got->n, want->n, k);
}

static void check_fixture(const char *name) {
    dt_tok_t *t = load(name);
    docs d = read_fixture(name);
    dt_tok_enc_t *e = dt_tok_enc_new(t);
    for (size_t i = 0; i < d.n; i++) {
        dt_tok_ids got = {0};
        cr_assert_eq(dt_tok_encode(e, d.text[i], d.len[i], 1, &got), DT_STATUS_OK);
        ids_eq(&got, &d.want[i], name, i);
        free(got.ids);
    }
    /* The cache must not change results: every document again, in reverse. */
    for (size_t i = d.n; i-- > 0;) {
        dt_tok_ids got = {0};
        dt_tok_encode(e, d.text[i], d.len[i], 1, &got);
        ids_eq(&got, &d.want[i], name, i);
        free(got.ids);
    }
    cr_assert_eq(dt_tok_enc_stats(e).invalid_utf8, 0);
    dt_tok_enc_free(e);
    docs_free(&d);
    dt_tok_free(t);
}

Test(tok, gpt2_ids_equal_tokenizers) { check_fixture("gpt2"); }
Test(tok, llama3_ids_equal_tokenizers) { check_fixture("llama3"); }
Test(tok, qwen2_ids_equal_tokenizers) { check_fixture("qwen2"); }
Test(tok, mistral_ids_equal_tokenizers) { check_fixture("mistral"); }

/* All documents joined by "\n" into one text; cuts from random positions. */
static void check_split(const char *name, int expect_cuts) {
    dt_tok_t *t = load(name);
    docs d = read_fixture(name);
    size_t total = 0;
    for (size_t i = 0; i < d.n; i++)
        total += d.len[i] + 1;
    char *all = malloc(total + 1);
    size_t n = 0;
    for (size_t i = 0; i < d.n; i++) {
        memcpy(all + n, d.text[i], d.len[i]);
        n += d.len[i];
        all[n++] = '\n';
    }
    dt_tok_enc_t *e = dt_tok_enc_new(t);
    dt_tok_ids whole = {0};
    dt_tok_encode(e, all, n, 1, &whole);
    srand(16);
    int cuts = 0;
    for (int trial = 0; trial < 40; trial++) {
        /* Cut the text into pieces at cut points found from random positions. */
        dt_tok_ids got = {0};
        size_t at = 0;
        while (at < n) {
            size_t from = at + (size_t)rand() % 4000;
            size_t p = from >= n ? n : dt_tok_split_point(t, all, n, from);
            cr_assert(p >= (from < n ? from : n) && p <= n);
            if (p < n)
                cuts++;
            dt_tok_encode(e, all + at, p - at, at == 0, &got);
            at = p;
        }
        ids_eq(&got, &whole, name, (size_t)trial);
        free(got.ids);
    }
    if (expect_cuts)
        cr_assert_gt(cuts, 100, "%s: only %d cut points found", name, cuts);
    else
        cr_assert_eq(cuts, 0, "%s: a tokenizer without a split has no cut points", name);
    free(whole.ids), free(all);
    dt_tok_enc_free(e);
    docs_free(&d);
    dt_tok_free(t);
}

Test(tok, gpt2_cut_points_give_the_same_ids) { check_split("gpt2", 1); }
Test(tok, llama3_cut_points_give_the_same_ids) { check_split("llama3", 1); }
Test(tok, qwen2_cut_points_give_the_same_ids) { check_split("qwen2", 1); }
Test(tok, mistral_cut_points_give_the_same_ids) { check_split("mistral", 1); }
/* Llama 2 / Mistral as they ship (a vocabulary of words, no pre-tokenizer): the
 * whole-text BPE runs in chunks (tok_chunk.c) and must give tokenizers' ids. */
Test(tok, spm_ids_equal_tokenizers) { check_fixture("spm"); }
Test(tok, spm_cut_points_give_the_same_ids) { check_split("spm", 1); }

/* Text with neither newlines nor spaces (Cyrillic, Latin, some CJK, apostrophes,
 * digits and punctuation): no "\n" cut exists, so pieces are cut between letters
 * (tok_cut.c); the ids must be the whole text's, and cuts must be found. */
static void check_letter_cuts(const char *name, unsigned seed) {
    static const char *const alpha[] = {"\xd0\xb0", "\xd0\xb1", "\xd0\xb2", "\xd0\xb3", "\xd0\xb4", "\xd0\xb5",
                                        "\xd0\xbe", "\xd0\xb8", "\xd0\xbd", "\xd1\x82", "\xd1\x8f", "\xd1\x91",
                                        "\xd0\x96", "t", "h", "e", "a", "n", "T", "'", "s", "ll", "7", ",",
                                        "\xe4\xb8\xad", "\xe6\x96\x87", "\xef\xbc\x8c", "\xe2\x96\x81"};
    const size_t na = sizeof alpha / sizeof *alpha, n_want = 400u << 10;
    dt_tok_t *t = load(name);
    char *all = malloc(n_want + 8);
    size_t n = 0;
    srand(seed);
    while (n < n_want) {
        int r = rand() % 100;
        const char *c = alpha[r < 60 ? r % 13 : r < 90 ? 13 + r % 6 : 19 + r % (int)(na - 19)];
        memcpy(all + n, c, strlen(c));
        n += strlen(c);
    }
    dt_tok_enc_t *e = dt_tok_enc_new(t);
    dt_tok_ids whole = {0}, got = {0};
    dt_tok_encode(e, all, n, 1, &whole);
    size_t at = 0;
    int cuts = 0;
    while (at < n) {
        size_t from = at + (size_t)rand() % 4000;
        size_t p = from >= n ? n : dt_tok_split_point(t, all + at, n - at, from - at) + at;
        cr_assert(p >= (from < n ? from : n) && p <= n);
        if (p < n)
            cuts++;
        dt_tok_encode(e, all + at, p - at, at == 0, &got);
        at = p;
    }
    ids_eq(&got, &whole, name, 0);
    cr_assert_gt(cuts, 20, "%s: only %d cuts between letters", name, cuts);
    free(whole.ids), free(got.ids), free(all);
    dt_tok_enc_free(e);
    dt_tok_free(t);
}

Test(tok, gpt2_letter_cuts_give_the_same_ids) { check_letter_cuts("gpt2", 1); }
Test(tok, llama3_letter_cuts_give_the_same_ids) { check_letter_cuts("llama3", 2); }
Test(tok, qwen2_letter_cuts_give_the_same_ids) { check_letter_cuts("qwen2", 3); }
Test(tok, mistral_letter_cuts_give_the_same_ids) { check_letter_cuts("mistral", 4); }
Test(tok, spm_letter_cuts_give_the_same_ids) { check_letter_cuts("spm", 5); }

/* The text tokenizers' decode gives back under a Prepend normalizer: each segment
 * after a special token was prepended, so one space follows each special token
 * that has text after it. */
static char *with_prepend_spaces(const char *s) {
    static const char *sp[] = {"</s>", "<s>", "<unk>"};
    char *out = malloc(strlen(s) * 2 + 1), *w = out;
    while (*s) {
        int hit = 0;
        for (int k = 0; k < 3 && !hit; k++) {
            size_t l = strlen(sp[k]);
            if (!strncmp(s, sp[k], l)) {
                memcpy(w, s, l), w += l, s += l, hit = 1;
                int next_special = 0;
                for (int j = 0; j < 3; j++)
                    next_special |= !strncmp(s, sp[j], strlen(sp[j]));
                if (*s && !next_special)
                    *w++ = ' ';
            }
        }
        if (!hit)
            *w++ = *s++;
    }
    *w = 0;
    return out;
}

/* decode(encode(text)) == text, or for NFC (qwen2) encode(decode(ids)) == ids. */
static void check_roundtrip(const char *name, int exact) {
    dt_tok_t *t = load(name);
    docs d = read_fixture(name);
    dt_tok_enc_t *e = dt_tok_enc_new(t);
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (size_t i = 0; i < d.n; i++) {
        len = 0;
        cr_assert_eq(dt_tok_decode(t, d.want[i].ids, d.want[i].n, &buf, &len, &cap), DT_STATUS_OK);
        if (exact) {
            char *want = !strcmp(name, "mistral") || !strcmp(name, "spm") ? with_prepend_spaces(d.text[i]) : strdup(d.text[i]);
            cr_assert(len == strlen(want) && !memcmp(buf, want, len), "%s doc %zu decodes to \"%.80s\"", name, i, buf);
            free(want);
        } else {
            dt_tok_ids again = {0};
            dt_tok_encode(e, buf, len, 1, &again);
            ids_eq(&again, &d.want[i], name, i);
            free(again.ids);
        }
    }
    uint32_t bad = dt_tok_vocab_size(t) + 5;
    cr_assert_eq(dt_tok_decode(t, &bad, 1, &buf, &len, &cap), DT_STATUS_FORMAT);
    cr_assert_not_null(strstr(dt_error_detail(), "not in the vocabulary"));
    free(buf);
    dt_tok_enc_free(e);
    docs_free(&d);
    dt_tok_free(t);
}

Test(tok, gpt2_decode_round_trips) { check_roundtrip("gpt2", 1); }
Test(tok, llama3_decode_round_trips) { check_roundtrip("llama3", 1); }
Test(tok, qwen2_decode_reencodes) { check_roundtrip("qwen2", 0); }
Test(tok, mistral_decode_round_trips) { check_roundtrip("mistral", 1); }
Test(tok, spm_decode_round_trips) { check_roundtrip("spm", 1); }

static void encode_str(dt_tok_enc_t *e, const char *s, int doc_start, dt_tok_ids *out) {
    cr_assert_eq(dt_tok_encode(e, s, strlen(s), doc_start, out), DT_STATUS_OK);
}

/* Byte-level: each invalid byte is its own GPT-2 character; "\xff\xfe" is a run of
 * symbols between two letter runs, and its ids are those of the two characters
 * the mapping gives (U+00FF and U+00FE map to themselves). */
Test(tok, invalid_utf8_byte_level) {
    dt_tok_t *t = load("gpt2");
    dt_tok_enc_t *e = dt_tok_enc_new(t);
    dt_tok_ids got = {0}, want = {0};
    encode_str(e, "ab\xff\xfe" "cd", 1, &got);
    dt_tok_stats st = dt_tok_enc_stats(e);
    cr_assert_eq(st.invalid_utf8, 2);
    cr_assert_eq(st.first_invalid_offset, 2);
    cr_assert_lt(dt_tok_token_id(t, "\xc3\xbf\xc3\xbe"), 0, "the fixture has no merge of the two");
    encode_str(e, "ab", 1, &want);
    dt_tok_ids_push(&want, (uint32_t)dt_tok_token_id(t, "\xc3\xbf")); /* byte 0xFF -> U+00FF */
    dt_tok_ids_push(&want, (uint32_t)dt_tok_token_id(t, "\xc3\xbe")); /* byte 0xFE -> U+00FE */
    encode_str(e, "cd", 0, &want);
    ids_eq(&got, &want, "invalid utf8", 0);
    /* A truncated sequence (E4 B8 without its last byte) is two invalid bytes. */
    dt_tok_enc_t *e2 = dt_tok_enc_new(t);
    got.n = 0;
    encode_str(e2, "x\xe4\xb8", 1, &got);
    cr_assert_eq(dt_tok_enc_stats(e2).invalid_utf8, 2);
    cr_assert_eq(dt_tok_enc_stats(e2).first_invalid_offset, 1);
    free(got.ids), free(want.ids);
    dt_tok_enc_free(e), dt_tok_enc_free(e2);
    dt_tok_free(t);
}

/* Byte fallback: the invalid byte becomes its <0xFF> token. */
Test(tok, invalid_utf8_byte_fallback) {
    dt_tok_t *t = load("mistral");
    dt_tok_enc_t *e = dt_tok_enc_new(t);
    dt_tok_ids got = {0}, want = {0};
    encode_str(e, "ab\xff" "cd", 1, &got);
    cr_assert_eq(dt_tok_enc_stats(e).invalid_utf8, 1);
    encode_str(e, "ab", 1, &want);
    cr_assert_geq(dt_tok_token_id(t, "<0xFF>"), 0);
    dt_tok_ids_push(&want, (uint32_t)dt_tok_token_id(t, "<0xFF>"));
    encode_str(e, "cd", 0, &want);
    ids_eq(&got, &want, "invalid utf8", 0);
    free(got.ids), free(want.ids);
    dt_tok_enc_free(e);
    dt_tok_free(t);
}

Test(tok, accessors) {
    dt_tok_t *t = load("gpt2");
    int64_t eot = dt_tok_token_id(t, "<|endoftext|>");
    cr_assert_geq(eot, 0);
    cr_assert_eq(dt_tok_doc_token(t), eot);
    cr_assert_str_eq(dt_tok_token_str(t, (uint32_t)eot), "<|endoftext|>");
    cr_assert_geq(dt_tok_vocab_size(t), 900);
    cr_assert_not_null(strstr(dt_tok_describe(t), "GPT-2 split"));
    dt_tok_free(t);
    t = load("mistral");
    cr_assert_eq(dt_tok_doc_token(t), dt_tok_token_id(t, "<s>"));
    cr_assert_not_null(strstr(dt_tok_describe(t), "byte fallback"));
    dt_tok_free(t);
}

/* Byte-level with byte fallback and a vocabulary without the <0xNN> tokens of a
 * character (tests/fuzz/seeds_tokenizer/crash_byte_fallback_missing.json, found by
 * `make fuzz`): the character is the unknown token, as in tokenizers, never an id
 * of -1 (4294967295) past the vocabulary. */
Test(tok, byte_fallback_without_byte_tokens_is_unk) {
    static const char json[] =
        "{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"unk_token\": \"<unk>\", "
        "\"vocab\": {\"<unk>\": 0, \"a\": 1, \"<0xC3>\": 2}, \"merges\": []}, "
        "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}}";
    char path[64];
    snprintf(path, sizeof path, "/tmp/dt-tok-XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, json, strlen(json)), (ssize_t)strlen(json));
    close(fd);
    dt_tok_t *t = NULL;
    cr_assert_eq(dt_tok_load(path, &t), DT_STATUS_OK, "%s", dt_error_detail());
    unlink(path);
    dt_tok_enc_t *e = dt_tok_enc_new(t);
    dt_tok_ids got = {0};
    /* "a", then "é" (bytes C3 A9: byte-level chars Ã and ©, whose UTF-8 needs <0xC2>,
     * <0xA9>, <0xC3>, <0x83> of which only <0xC3> exists) */
    encode_str(e, "a\xc3\xa9", 1, &got);
    cr_assert_eq(got.n, 3, "got %zu ids", got.n); /* fuse_unk false: one <unk> per character */
    cr_assert_eq(got.ids[0], 1);
    cr_assert(got.ids[1] == 0 && got.ids[2] == 0, "expected <unk> (0) twice, got %u %u", got.ids[1], got.ids[2]);
    for (size_t i = 0; i < got.n; i++) cr_assert_lt(got.ids[i], dt_tok_vocab_size(t));
    free(got.ids);
    dt_tok_enc_free(e);
    dt_tok_free(t);
}

/* ---- errors ---- */

static dt_status_t load_text(const char *json, char *path, size_t cap) {
    snprintf(path, cap, "/tmp/dt-tok-XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, json, strlen(json)), (ssize_t)strlen(json));
    close(fd);
    dt_tok_t *t = NULL;
    dt_status_t st = dt_tok_load(path, &t);
    cr_assert((st == DT_STATUS_OK) == (t != NULL));
    dt_tok_free(t);
    unlink(path);
    return st;
}

static void expect_error(const char *json, dt_status_t want, const char *needle) {
    char path[64];
    dt_status_t st = load_text(json, path, sizeof path);
    cr_assert_eq(st, want, "got %s: %s", dt_status_name(st), dt_error_detail());
    cr_assert_not_null(strstr(dt_error_detail(), path), "no file name in: %s", dt_error_detail());
    cr_assert_not_null(strstr(dt_error_detail(), needle), "\"%s\" not in: %s", needle, dt_error_detail());
}

#define VOCAB "\"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}"

Test(tok, errors_name_file_and_key) {
    char path[64];
    cr_assert_eq(load_text("{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": [\"a b\"]}}", path, sizeof path),
                 DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(load_text("{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": [[\"a\", \"b\"]]}}", path,
                           sizeof path), DT_STATUS_OK, "%s", dt_error_detail());
    expect_error("{\n\"model\": {\n\"type\": \"BPE\",,\n}}", DT_STATUS_FORMAT, "line 3");
    expect_error("{\"model\": {\"type\": \"BPE\", \"merges\": []}}", DT_STATUS_FORMAT, "model.vocab: missing");
    expect_error("{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": [\"a b\", 7]}}", DT_STATUS_FORMAT,
                 "model.merges[1]: expected a string or a pair");
    expect_error("{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": [\"a c\"]}}", DT_STATUS_FORMAT,
                 "model.merges[0]: token \"c\" is not in model.vocab");
    expect_error("{\"model\": {\"type\": \"WordPiece\", " VOCAB "}}", DT_STATUS_UNSUPPORTED, "\"WordPiece\"");
    expect_error("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", DT_STATUS_UNSUPPORTED, "\"Unigram\"");
    expect_error("{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": []}, \"pre_tokenizer\": {\"type\": "
                 "\"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\w+\"}, "
                 "\"behavior\": \"Isolated\", \"invert\": false}]}}",
                 DT_STATUS_UNSUPPORTED, "pre_tokenizer.pretokenizers[0].pattern: the regex \"\\w+\"");
    expect_error("{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": []}, \"normalizer\": {\"type\": \"NFKC\"}}",
                 DT_STATUS_UNSUPPORTED, "normalizer: normalizer type \"NFKC\"");
    expect_error("{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": [], \"continuing_subword_prefix\": \"##\"}}",
                 DT_STATUS_UNSUPPORTED, "continuing_subword_prefix");
    expect_error("{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": []}, \"added_tokens\": [{\"content\": \"x\"}]}",
                 DT_STATUS_FORMAT, "added_tokens[0].id");
    dt_tok_t *t;
    cr_assert_eq(dt_tok_load("/nonexistent/tokenizer.json", &t), DT_STATUS_NOT_FOUND);
    cr_assert_not_null(strstr(dt_error_detail(), "/nonexistent/tokenizer.json"));
    /* The reason survives the prefix (it came out "...: le or directory"). */
    cr_assert_not_null(strstr(dt_error_detail(), "tokenizer /nonexistent/tokenizer.json: "
                                                 "/nonexistent/tokenizer.json: No such file or directory"),
                       "%s", dt_error_detail());
}

/* Hostile tokenizer.json (issue 31): a huge id (in the vocabulary or the added
 * tokens) would size the id table by it (24 GB for 2^31 - 1); an empty Metaspace
 * replacement or Replace pattern would loop forever. Each is an error naming the
 * file, the key and, for ids, the token and the id. */
Test(tok, hostile_ids_and_empty_patterns_are_errors) {
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 2147483647}, \"merges\": []}}",
                 DT_STATUS_FORMAT, "model.vocab: the id 2147483647 of \"b\" is too large: ids must be below 131074");
    expect_error("{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": []}, \"added_tokens\": [{\"id\": 2147483647, "
                 "\"content\": \"<s>\"}]}",
                 DT_STATUS_FORMAT, "added_tokens[0].id: the id 2147483647 of \"<s>\" is too large");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1e300}, \"merges\": []}}",
                 DT_STATUS_FORMAT, "model.vocab: expected a non-negative integer id for \"b\"");
    expect_error("{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": []}, \"pre_tokenizer\": {\"type\": "
                 "\"Metaspace\", \"replacement\": \"\"}}",
                 DT_STATUS_FORMAT, "pre_tokenizer.replacement: empty");
    expect_error("{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": []}, \"decoder\": {\"type\": \"Sequence\", "
                 "\"decoders\": [{\"type\": \"Metaspace\", \"replacement\": \"\"}]}}",
                 DT_STATUS_FORMAT, "decoder.decoders[0].replacement: empty");
    expect_error("{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": []}, \"decoder\": {\"type\": \"Replace\", "
                 "\"pattern\": {\"String\": \"\"}, \"content\": \" \"}}",
                 DT_STATUS_FORMAT, "decoder.pattern: empty");
    /* A chain of Replace steps that grows text without bound (make fuzz: 40 bytes gave
     * half a million tokens): 16x then 16x is 256x, refused at load naming the step */
    expect_error("{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": []}, \"normalizer\": {\"type\": "
                 "\"Sequence\", \"normalizers\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, "
                 "\"content\": \"                \"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, "
                 "\"content\": \"                \"}]}}",
                 DT_STATUS_FORMAT, "normalizer: its Replace steps can grow a text 256x (step 2 of the normalizer");
    /* Llama 2's and Mistral's: Prepend and Replace " " by the 3-byte U+2581 load */
    char path0[64];
    cr_assert_eq(load_text("{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": []}, \"normalizer\": {\"type\": "
                           "\"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\u2581\"}, "
                           "{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\u2581\"}]}}",
                           path0, sizeof path0), DT_STATUS_OK, "%s", dt_error_detail());
    /* Gaps within the slack are fine (ids 0, 1 and 1000 of three entries). */
    char path[64];
    cr_assert_eq(load_text("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 1000}, "
                           "\"merges\": []}}", path, sizeof path), DT_STATUS_OK, "%s", dt_error_detail());
}

/* A whole-text BPE (Mistral-style normalizer, no pre-tokenizer) whose merges join
 * "\n" and "T": cuts fall after "\n" only before letters no token joins to it
 * ("x" here, never "T"), and the pieces' ids are the whole text's. */
Test(tok, whole_text_cuts_avoid_pairs_a_token_joins) {
    const char *json =
        "{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"unk_token\": \"<unk>\", \"vocab\": {\"<unk>\": 0, "
        "\"<0x0A>\": 1, \"\\n\": 2, \"T\": 3, \"h\": 4, \"e\": 5, \"x\": 6, \"\\u2581\": 7, \"\\nT\": 8, "
        "\"\\nTh\": 9, \"\\u2581x\": 10, \"he\": 11, \"a\": 12}, \"merges\": [\"\\n T\", \"\\nT h\", \"\\u2581 x\", "
        "\"h e\"]},"
        " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": "
        "\"\\u2581\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"}]}}";
    char path[64];
    snprintf(path, sizeof path, "/tmp/dt-tok-XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, json, strlen(json)), (ssize_t)strlen(json));
    close(fd);
    dt_tok_t *t;
    cr_assert_eq(dt_tok_load(path, &t), DT_STATUS_OK, "%s", dt_error_detail());
    unlink(path);
    const char *s = "a\nThe\nx\nThe x\nxa\nThe\nx";
    size_t n = strlen(s);
    dt_tok_enc_t *e = dt_tok_enc_new(t);
    dt_tok_ids whole = {0}, got = {0};
    cr_assert_eq(dt_tok_encode(e, s, n, 1, &whole), DT_STATUS_OK);
    int joined = 0;
    for (size_t i = 0; i < whole.n; i++) joined += whole.ids[i] == 9; /* "\nTh" */
    cr_assert_eq(joined, 3, "the whole text merges \"\\nTh\" three times");
    size_t at = 0;
    int cuts = 0;
    while (at < n) {
        size_t p = dt_tok_split_point(t, s, n, at + 1);
        if (p < n) {
            cr_assert(s[p - 1] == '\n' && s[p] == 'x', "a cut at %zu, before '%c'", p, s[p]);
            cuts++;
        }
        cr_assert_eq(dt_tok_encode(e, s + at, p - at, at == 0, &got), DT_STATUS_OK);
        at = p;
    }
    cr_assert_eq(cuts, 3, "every \"\\nx\" is a cut");
    ids_eq(&got, &whole, "whole-text cuts", 0);
    free(whole.ids), free(got.ids);
    dt_tok_enc_free(e);
    dt_tok_free(t);
}
