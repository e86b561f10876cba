/*
 * tokenize_chat.c - one jsonl document of `dtrun tokenize --chat`: its ids and its
 * loss mask (tokenize_run.h: dt_tokenize_chat_doc).
 *
 * A line holds one of:
 *   messages: [{role, content, ...}, ...]  a conversation, rendered by the chat
 *            template (chat.h) exactly as transformers' apply_chat_template, then
 *            encoded whole (the ids equal apply_chat_template(tokenize=True)'s);
 *   prompt, completion (strings)            the document token, the prompt, the
 *            completion and the template's end-of-sequence token when known;
 *   the text field                          the document token and the text.
 * Trained tokens (DT_MASK_TRAIN): by mask mode, the assistant turns (each from
 * the end of its generation prompt to the end of its rendering, the end-of-turn
 * token included), the last assistant turn only, or every token; the completion;
 * all of a text. The first token has DT_MASK_DOC.
 *
 * Assistant spans come from rendering prefixes: render(messages[:i],
 * add_generation_prompt) and render(messages[:i+1]) must both be prefixes of the
 * whole rendering (true of templates that render turn by turn; a template that
 * rewrites earlier turns is refused with the message index, and --mask all still
 * works). Spans are mapped to tokens by encoding the text in pieces cut at exact
 * split points (dt_tok_split_point) at or after each span boundary; a piece that
 * holds a boundary gets its tokens' byte offsets from decoding its own prefixes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "runtime/tokenize/chat.h"
#include "runtime/tokenize/shard.h" /* defines: DT_MASK_* */
#include "runtime/tokenize/tokenize_run.h"

#define MAX_SPANS 4096

typedef struct span {
    size_t a, b;
} span;

static void mask_push(dt_tok_mask *m, uint8_t v) {
    if (m->n == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 256;
        m->bytes = dt_xrealloc(m->bytes, m->cap);
    }
    m->bytes[m->n++] = v;
}

/* Marks ids [from, ids->n) with v, DT_MASK_DOC added to id doc_first. */
static void mark(dt_tok_mask *m, const dt_tok_ids *ids, size_t from, size_t doc_first, uint8_t v) {
    for (size_t i = from; i < ids->n; i++) mask_push(m, (uint8_t)(v | (i == doc_first ? DT_MASK_DOC : 0)));
}

static dt_status_t render_prefix(const dt_tokenize_opts *o, const cJSON *msgs, int n, int gen, char **out,
                                 size_t *len) {
    cJSON *arr = cJSON_CreateArray();
    int i = 0;
    for (const cJSON *m = msgs->child; m && i < n; m = m->next, i++)
        cJSON_AddItemReferenceToArray(arr, (cJSON *)m);
    dt_status_t st = dt_chat_render(o->chat, arr, gen, NULL, out, len);
    cJSON_Delete(arr);
    return st;
}

/* The byte spans of the trained assistant turns of a conversation rendered as text. */
static dt_status_t assistant_spans(const dt_tokenize_opts *o, const cJSON *msgs, const char *text, size_t len,
                                   span *sp, int *nsp) {
    int last = -1, i = 0;
    *nsp = 0;
    for (const cJSON *m = msgs->child; m; m = m->next, i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (cJSON_IsString(role) && !strcmp(role->valuestring, "assistant")) last = i;
    }
    i = 0;
    for (const cJSON *m = msgs->child; m; m = m->next, i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role) || strcmp(role->valuestring, "assistant")) continue;
        if (o->mask_mode == DT_TOKENIZE_MASK_LAST && i != last) continue;
        char *p = NULL, *f = NULL;
        size_t pl = 0, fl = 0;
        dt_status_t st = render_prefix(o, msgs, i, 1, &p, &pl);
        if (st == DT_STATUS_OK) st = render_prefix(o, msgs, i + 1, 0, &f, &fl);
        int ok = st == DT_STATUS_OK && pl <= fl && fl <= len && !memcmp(p, text, pl) && !memcmp(f, text, fl);
        free(p);
        free(f);
        DT_CHECK(st);
        if (!ok)
            return dt_error(DT_STATUS_UNSUPPORTED,
                            "messages[%d]: the chat template does not render this conversation turn by turn (the "
                            "rendering up to this assistant turn is not a prefix of the whole), so its tokens cannot "
                            "be told apart; --mask all trains on every token", i);
        if (*nsp == MAX_SPANS) return dt_error(DT_STATUS_LIMIT, "more than %d assistant turns", MAX_SPANS);
        sp[(*nsp)++] = (span){pl, fl};
    }
    return DT_STATUS_OK;
}

static int in_spans(const span *sp, int nsp, size_t off) {
    for (int k = 0; k < nsp; k++)
        if (off >= sp[k].a && off < sp[k].b) return 1;
    return 0;
}

/* Encodes text whole (ids exactly as at once) and marks the tokens whose first byte
 * lies in a span. */
static dt_status_t encode_spans(const dt_tokenize_opts *o, dt_tok_enc_t *e, const char *text, size_t len,
                                const span *sp, int nsp, dt_tok_ids *ids, dt_tok_mask *mask) {
    size_t from = 0, first = ids->n;
    char *dec = NULL;
    size_t dlen = 0, dcap = 0;
    dt_status_t st = DT_STATUS_OK;
    while (from < len) {
        /* the next boundary after from, and the first exact cut at or after it */
        size_t bnd = len;
        for (int k = 0; k < nsp; k++) {
            if (sp[k].a > from && sp[k].a < bnd) bnd = sp[k].a;
            if (sp[k].b > from && sp[k].b < bnd) bnd = sp[k].b;
        }
        size_t cut = bnd < len ? dt_tok_split_point(o->tok, text, len, bnd) : len;
        if (cut <= from) cut = len;
        size_t i0 = ids->n;
        DT_CHECK_GOTO(dt_tok_encode(e, text + from, cut - from, from == 0, ids), st, out);
        if (cut == bnd || bnd == len) {
            /* no boundary inside: the piece's tokens all start where its first does,
             * as far as the spans go (a span changes only at bnd == cut) */
            uint8_t v = in_spans(sp, nsp, from) ? DT_MASK_TRAIN : 0;
            for (size_t i = i0; i < ids->n; i++) mask_push(mask, (uint8_t)(v | (i == first ? DT_MASK_DOC : 0)));
        } else {
            size_t off = from;
            for (size_t i = i0; i < ids->n; i++) {
                uint8_t v = in_spans(sp, nsp, off) ? DT_MASK_TRAIN : 0;
                mask_push(mask, (uint8_t)(v | (i == first ? DT_MASK_DOC : 0)));
                dlen = 0;
                DT_CHECK_GOTO(dt_tok_decode(o->tok, ids->ids + i0, i - i0 + 1, &dec, &dlen, &dcap), st, out);
                off = from + dlen;
            }
        }
        from = cut;
    }
out:
    free(dec);
    return st;
}

static int is_str(const cJSON *j, const char *key) { return cJSON_IsString(cJSON_GetObjectItemCaseSensitive(j, key)); }

dt_status_t dt_tokenize_chat_doc(const dt_tokenize_opts *o, dt_tok_enc_t *e, const cJSON *j, dt_tok_ids *ids,
                                 dt_tok_mask *mask) {
    size_t first = ids->n;
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(j, "messages");
    if (cJSON_IsArray(msgs)) {
        if (!o->chat)
            return dt_error(DT_STATUS_USAGE, "a conversation (\"messages\") needs a chat template: the tokenizer's "
                            "folder has no tokenizer_config.json with chat_template (give one with --template)");
        if (cJSON_GetArraySize(msgs) == 0) return DT_STATUS_OK; /* an empty conversation: nothing */
        char *text = NULL;
        size_t len = 0;
        DT_CHECK(dt_chat_render(o->chat, msgs, 0, NULL, &text, &len));
        span *sp = dt_xcalloc(MAX_SPANS, sizeof *sp);
        int nsp = 0;
        dt_status_t st = DT_STATUS_OK;
        if (o->mask_mode == DT_TOKENIZE_MASK_ALL) sp[nsp++] = (span){0, len};
        else st = assistant_spans(o, msgs, text, len, sp, &nsp);
        if (st == DT_STATUS_OK) st = encode_spans(o, e, text, len, sp, nsp, ids, mask);
        free(sp);
        free(text);
        return st;
    }
    if (is_str(j, "prompt") || is_str(j, "completion")) {
        if (!is_str(j, "prompt") || !is_str(j, "completion"))
            return dt_error(DT_STATUS_FORMAT, "\"prompt\" and \"completion\" must both be strings");
        const char *pr = cJSON_GetObjectItemCaseSensitive(j, "prompt")->valuestring;
        const char *co = cJSON_GetObjectItemCaseSensitive(j, "completion")->valuestring;
        dt_tok_ids_push(ids, o->doc_token);
        DT_CHECK(dt_tok_encode(e, pr, strlen(pr), 1, ids));
        mark(mask, ids, first, first, 0);
        size_t c0 = ids->n;
        DT_CHECK(dt_tok_encode(e, co, strlen(co), 0, ids));
        if (o->eos_token >= 0) dt_tok_ids_push(ids, (uint32_t)o->eos_token);
        mark(mask, ids, c0, first, DT_MASK_TRAIN);
        return DT_STATUS_OK;
    }
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, o->field);
    if (!cJSON_IsString(f))
        return dt_error(DT_STATUS_FORMAT, "no \"messages\" array, no \"prompt\"/\"completion\" and no \"%s\" string "
                        "(a --chat line holds one of them)", o->field);
    if (!f->valuestring[0]) return DT_STATUS_OK;
    dt_tok_ids_push(ids, o->doc_token);
    DT_CHECK(dt_tok_encode(e, f->valuestring, strlen(f->valuestring), 1, ids));
    mark(mask, ids, first, first, DT_MASK_TRAIN);
    return DT_STATUS_OK;
}
