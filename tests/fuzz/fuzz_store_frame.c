/*
 * fuzz_store_frame.c - libFuzzer target for the store's frame parser
 * (rendezvous/proto.c), built by `make fuzz`.
 *
 * The input is parsed twice: once whole, frame after frame as the server does,
 * and once fed in chunks split at pseudo-random points (seeded by the input) with
 * the parser's "need" hint honoured. Both must see the same frames and end the
 * same way; every frame and every list walk must stay inside the input.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rendezvous/proto.h"

#define MAX_FRAMES 4096

typedef struct outcome {
    size_t nframes;
    uint8_t cmds[MAX_FRAMES];
    size_t sizes[MAX_FRAMES];
    int end; /* last result: NEED_MORE or BAD (or FRAME when input ends exactly) */
    size_t consumed;
} outcome_t;

static void check_frame(const dt_store_frame_t *f, const uint8_t *start, size_t avail) {
    if (f->size == 0 || f->size > avail) abort();
    const uint8_t *end = start + f->size;
    if (f->key.len && (f->key.ptr < start || f->key.ptr + f->key.len > end)) abort();
    if (f->a.len && (f->a.ptr < start || f->a.ptr + f->a.len > end)) abort();
    if (f->b.len && (f->b.ptr < start || f->b.ptr + f->b.len > end)) abort();
    if (f->list) {
        const uint8_t *p = f->list;
        uint64_t items = f->cmd == DT_STORE_CMD_MULTI_SET ? 2 * f->n : f->n;
        for (uint64_t i = 0; i < items; i++) {
            dt_store_bytes_t s = dt_store_list_next(&p);
            if (s.ptr < start || s.ptr + s.len > end || p > end) abort();
            /* touch the bytes so ASan checks them */
            volatile uint8_t sink = 0;
            for (size_t j = 0; j < s.len; j++) sink ^= s.ptr[j];
            (void)sink;
        }
    }
}

static void parse_whole(const uint8_t *data, size_t size, outcome_t *o) {
    size_t off = 0;
    memset(o, 0, sizeof *o);
    for (;;) {
        dt_store_frame_t f;
        size_t need = 0;
        char why[128];
        dt_store_parse_result_t r = dt_store_parse(data + off, size - off, &f, &need, why,
                                                   sizeof why);
        if (r != DT_STORE_PARSE_FRAME) {
            if (r == DT_STORE_PARSE_NEED_MORE && need <= size - off) abort();
            if (r == DT_STORE_PARSE_BAD && why[0] == '\0') abort();
            o->end = r;
            break;
        }
        check_frame(&f, data + off, size - off);
        if (o->nframes < MAX_FRAMES) {
            o->cmds[o->nframes] = (uint8_t)f.cmd;
            o->sizes[o->nframes] = f.size;
        }
        o->nframes++;
        off += f.size;
        if (off == size) {
            o->end = DT_STORE_PARSE_NEED_MORE; /* an empty rest needs more */
            break;
        }
    }
    o->consumed = off;
}

/* As the server: a growing buffer, parse only once `need` bytes are there. */
static void parse_split(const uint8_t *data, size_t size, outcome_t *o) {
    memset(o, 0, sizeof *o);
    uint8_t *buf = malloc(size ? size : 1);
    size_t have = 0, start = 0, fed = 0, need = 0;
    uint32_t rng = 2166136261u;
    for (size_t i = 0; i < size && i < 16; i++) rng = (rng ^ data[i]) * 16777619u;
    o->end = DT_STORE_PARSE_NEED_MORE;
    while (fed < size) {
        rng = rng * 1103515245u + 12345u;
        size_t chunk = 1 + (rng >> 16) % 17;
        if (chunk > size - fed) chunk = size - fed;
        memcpy(buf + have, data + fed, chunk);
        have += chunk;
        fed += chunk;
        if (have - start < need) continue;
        for (;;) {
            dt_store_frame_t f;
            dt_store_parse_result_t r = dt_store_parse(buf + start, have - start, &f, &need,
                                                       NULL, 0);
            if (r == DT_STORE_PARSE_BAD) {
                o->end = r;
                goto out;
            }
            if (r == DT_STORE_PARSE_NEED_MORE) break;
            check_frame(&f, buf + start, have - start);
            if (o->nframes < MAX_FRAMES) {
                o->cmds[o->nframes] = (uint8_t)f.cmd;
                o->sizes[o->nframes] = f.size;
            }
            o->nframes++;
            start += f.size;
            need = 0;
            if (start == have) break;
        }
    }
out:
    o->consumed = start;
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static outcome_t whole, split;
    parse_whole(data, size, &whole);
    parse_split(data, size, &split);
    if (whole.nframes != split.nframes || whole.end != split.end ||
        whole.consumed != split.consumed)
        abort();
    size_t n = whole.nframes < MAX_FRAMES ? whole.nframes : MAX_FRAMES;
    for (size_t i = 0; i < n; i++)
        if (whole.cmds[i] != split.cmds[i] || whole.sizes[i] != split.sizes[i]) abort();
    /* Encoders round-trip through the parser. */
    if (size >= 2) {
        dt_store_buf_t b = {0};
        size_t klen = data[0] % (size - 1 + 1);
        if (klen > size - 1) klen = size - 1;
        dt_store_encode_set(&b, DT_STORE_CMD_SET, data + 1, klen, data + 1 + klen,
                            size - 1 - klen);
        dt_store_frame_t f;
        if (dt_store_parse(b.data, b.len, &f, NULL, NULL, 0) != DT_STORE_PARSE_FRAME ||
            f.size != b.len || f.key.len != klen || f.a.len != size - 1 - klen ||
            memcmp(f.key.ptr, data + 1, klen) != 0)
            abort();
        dt_store_buf_free(&b);
    }
    return 0;
}
