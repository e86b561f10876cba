/*
 * fuzz_tokenizer.c - libFuzzer target for tokenizer.json (runtime/tokenize/
 * tok_load.c), built by `make fuzz`.
 *
 * The input is written as a folder's tokenizer.json and loaded; a tokenizer that
 * loads then encodes a short fixed text (ASCII, accents, CJK, an emoji, invalid
 * UTF-8, special-token-like text) and decodes the ids it got. Loading must fail
 * cleanly or give a tokenizer whose ids all decode.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "runtime/tokenize/tok.h"
#include "tests/fuzz/fuzz_file.h"

static const char TEXT[] = "Hello world! It's 2024: naïve café, 東京 🙂\t\n  <|endoftext|><s> \xff\xfe end";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_write("tokenizer.json", data, size);
    dt_tok_t *t = NULL;
    if (dt_tok_load(fuzz_dir(), &t) != DT_STATUS_OK) return 0;
    (void)dt_tok_describe(t);
    (void)dt_tok_doc_token(t);
    dt_tok_enc_t *e = dt_tok_enc_new(t);
    dt_tok_ids ids = {0};
    if (dt_tok_encode(e, TEXT, sizeof TEXT - 1, 1, &ids) == DT_STATUS_OK) {
        uint32_t vocab = dt_tok_vocab_size(t);
        for (size_t i = 0; i < ids.n; i++)
            if (ids.ids[i] >= vocab) abort(); /* an id outside the vocabulary */
        char *buf = NULL;
        size_t len = 0, cap = 0;
        (void)dt_tok_decode(t, ids.ids, ids.n, &buf, &len, &cap);
        free(buf);
    }
    (void)dt_tok_split_point(t, TEXT, sizeof TEXT - 1, 0);
    free(ids.ids);
    dt_tok_enc_free(e);
    dt_tok_free(t);
    return 0;
}
