/*
 * test_store_proto.c - the TCPStore frame parser and encoders: exact byte
 * layouts (as torch's client writes them), every command round-tripping through
 * encode -> parse, truncation at every byte offset, limits, garbage.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "rendezvous/proto.h"
#include "rendezvous/store.h"

static dt_store_frame_t parse_ok(const dt_store_buf_t *b) {
    dt_store_frame_t f;
    char why[128];
    dt_store_parse_result_t r = dt_store_parse(b->data, b->len, &f, NULL, why, sizeof why);
    cr_assert_eq(r, DT_STORE_PARSE_FRAME, "parse failed: %s", why);
    cr_assert_eq(f.size, b->len);
    return f;
}

static int bytes_eq(dt_store_bytes_t s, const char *want) {
    return s.len == strlen(want) && !memcmp(s.ptr, want, s.len);
}

/* Every strict prefix is NEED_MORE with a need beyond it; the whole is a FRAME. */
static void check_every_truncation(const dt_store_buf_t *b) {
    for (size_t cut = 0; cut < b->len; cut++) {
        dt_store_frame_t f;
        size_t need = 0;
        dt_store_parse_result_t r = dt_store_parse(b->data, cut, &f, &need, NULL, 0);
        cr_assert_eq(r, DT_STORE_PARSE_NEED_MORE, "cut at %zu of %zu: result %d", cut, b->len,
                     r);
        cr_assert_gt(need, cut, "need %zu at cut %zu", need, cut);
        cr_assert_leq(need, b->len, "need %zu overshoots frame of %zu", need, b->len);
    }
    parse_ok(b);
}

Test(store_proto, command_numbers_match_torch_query_type) {
    cr_assert_eq(DT_STORE_CMD_VALIDATE, 0);
    cr_assert_eq(DT_STORE_CMD_SET, 1);
    cr_assert_eq(DT_STORE_CMD_COMPARE_SET, 2);
    cr_assert_eq(DT_STORE_CMD_GET, 3);
    cr_assert_eq(DT_STORE_CMD_ADD, 4);
    cr_assert_eq(DT_STORE_CMD_CHECK, 5);
    cr_assert_eq(DT_STORE_CMD_WAIT, 6);
    cr_assert_eq(DT_STORE_CMD_GETNUMKEYS, 7);
    cr_assert_eq(DT_STORE_CMD_DELETE_KEY, 8);
    cr_assert_eq(DT_STORE_CMD_APPEND, 9);
    cr_assert_eq(DT_STORE_CMD_MULTI_GET, 10);
    cr_assert_eq(DT_STORE_CMD_MULTI_SET, 11);
    cr_assert_eq(DT_STORE_CMD_CANCEL_WAIT, 12);
    cr_assert_eq(DT_STORE_CMD_PING, 13);
    cr_assert_eq(DT_STORE_CMD_LIST_KEYS, 17);
    cr_assert_eq(DT_STORE_CMD_BARRIER, 18);
    cr_assert_str_eq(dt_store_cmd_name(DT_STORE_CMD_MULTI_SET), "MULTI_SET");
    cr_assert_str_eq(dt_store_cmd_name(200), "UNKNOWN");
}

Test(store_proto, exact_bytes_of_set_and_validate) {
    dt_store_buf_t b = {0};
    dt_store_encode_validate(&b);
    static const uint8_t validate[] = {0, 0xCE, 0xF7, 0x85, 0x3C};
    cr_assert_eq(b.len, sizeof validate);
    cr_assert_arr_eq(b.data, validate, sizeof validate);
    b.len = 0;
    dt_store_encode_set(&b, DT_STORE_CMD_SET, "/k", 2, "vv", 2);
    static const uint8_t set[] = {1, 2, 0, 0, 0, 0, 0, 0, 0, '/', 'k',
                                  2, 0, 0, 0, 0, 0, 0, 0, 'v', 'v'};
    cr_assert_eq(b.len, sizeof set);
    cr_assert_arr_eq(b.data, set, sizeof set);
    b.len = 0;
    dt_store_encode_add(&b, "c", 1, -2);
    static const uint8_t add[] = {4, 1, 0, 0, 0, 0, 0, 0, 0, 'c',
                                  0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    cr_assert_eq(b.len, sizeof add);
    cr_assert_arr_eq(b.data, add, sizeof add);
    dt_store_buf_free(&b);
}

Test(store_proto, every_command_round_trips_and_survives_truncation) {
    dt_store_buf_t b = {0};
    dt_store_frame_t f;

    dt_store_encode_validate(&b);
    f = parse_ok(&b);
    cr_assert_eq(f.cmd, DT_STORE_CMD_VALIDATE);
    cr_assert_eq(f.u32, DT_STORE_VALIDATE_MAGIC);
    check_every_truncation(&b);

    b.len = 0;
    dt_store_encode_ping(&b, 0xdeadbeef);
    f = parse_ok(&b);
    cr_assert_eq(f.cmd, DT_STORE_CMD_PING);
    cr_assert_eq(f.u32, 0xdeadbeef);
    check_every_truncation(&b);

    b.len = 0;
    dt_store_encode_set(&b, DT_STORE_CMD_SET, "key", 3, "value", 5);
    f = parse_ok(&b);
    cr_assert_eq(f.cmd, DT_STORE_CMD_SET);
    cr_assert(bytes_eq(f.key, "key") && bytes_eq(f.a, "value"));
    check_every_truncation(&b);

    b.len = 0;
    dt_store_encode_set(&b, DT_STORE_CMD_APPEND, "k", 1, "", 0);
    f = parse_ok(&b);
    cr_assert_eq(f.cmd, DT_STORE_CMD_APPEND);
    cr_assert(bytes_eq(f.key, "k") && f.a.len == 0);

    b.len = 0;
    dt_store_encode_compare_set(&b, "k", 1, "old", 3, "new!", 4);
    f = parse_ok(&b);
    cr_assert_eq(f.cmd, DT_STORE_CMD_COMPARE_SET);
    cr_assert(bytes_eq(f.key, "k") && bytes_eq(f.a, "old") && bytes_eq(f.b, "new!"));
    check_every_truncation(&b);

    b.len = 0;
    dt_store_encode_key(&b, DT_STORE_CMD_GET, "g", 1);
    f = parse_ok(&b);
    cr_assert_eq(f.cmd, DT_STORE_CMD_GET);
    cr_assert(bytes_eq(f.key, "g"));
    check_every_truncation(&b);

    b.len = 0;
    dt_store_encode_key(&b, DT_STORE_CMD_DELETE_KEY, "", 0);
    f = parse_ok(&b);
    cr_assert_eq(f.cmd, DT_STORE_CMD_DELETE_KEY);
    cr_assert_eq(f.key.len, 0);

    b.len = 0;
    dt_store_encode_add(&b, "counter", 7, -42);
    f = parse_ok(&b);
    cr_assert_eq(f.cmd, DT_STORE_CMD_ADD);
    cr_assert(bytes_eq(f.key, "counter"));
    cr_assert_eq(f.i64, -42);
    check_every_truncation(&b);

    const char *keys[] = {"a", "bb", "", "dddd"};
    dt_store_cmd_t listed[] = {DT_STORE_CMD_CHECK, DT_STORE_CMD_WAIT, DT_STORE_CMD_MULTI_GET};
    for (int c = 0; c < 3; c++) {
        b.len = 0;
        dt_store_encode_keys(&b, listed[c], keys, 4);
        f = parse_ok(&b);
        cr_assert_eq(f.cmd, listed[c]);
        cr_assert_eq(f.n, 4);
        const uint8_t *p = f.list;
        for (int i = 0; i < 4; i++) cr_assert(bytes_eq(dt_store_list_next(&p), keys[i]));
        check_every_truncation(&b);
    }

    const void *vals[] = {"1", "22", "", "4444"};
    size_t lens[] = {1, 2, 0, 4};
    b.len = 0;
    dt_store_encode_multi_set(&b, keys, vals, lens, 4);
    f = parse_ok(&b);
    cr_assert_eq(f.cmd, DT_STORE_CMD_MULTI_SET);
    cr_assert_eq(f.n, 4);
    const uint8_t *p = f.list;
    for (int i = 0; i < 4; i++) {
        cr_assert(bytes_eq(dt_store_list_next(&p), keys[i]));
        cr_assert(bytes_eq(dt_store_list_next(&p), vals[i]));
    }
    check_every_truncation(&b);

    dt_store_cmd_t simple[] = {DT_STORE_CMD_GETNUMKEYS, DT_STORE_CMD_CANCEL_WAIT,
                               DT_STORE_CMD_LIST_KEYS};
    for (int c = 0; c < 3; c++) {
        b.len = 0;
        dt_store_encode_simple(&b, simple[c]);
        f = parse_ok(&b);
        cr_assert_eq(f.cmd, simple[c]);
        cr_assert_eq(f.size, 1);
        check_every_truncation(&b);
    }

    b.len = 0;
    dt_store_encode_barrier(&b, "bar", 3, 8);
    f = parse_ok(&b);
    cr_assert_eq(f.cmd, DT_STORE_CMD_BARRIER);
    cr_assert(bytes_eq(f.key, "bar"));
    cr_assert_eq(f.i64, 8);
    check_every_truncation(&b);
    dt_store_buf_free(&b);
}

Test(store_proto, back_to_back_frames_parse_one_at_a_time) {
    dt_store_buf_t b = {0};
    dt_store_encode_validate(&b);
    dt_store_encode_set(&b, DT_STORE_CMD_SET, "x", 1, "1", 1);
    dt_store_encode_add(&b, "y", 1, 5);
    dt_store_cmd_t want[] = {DT_STORE_CMD_VALIDATE, DT_STORE_CMD_SET, DT_STORE_CMD_ADD};
    size_t off = 0;
    for (int i = 0; i < 3; i++) {
        dt_store_frame_t f;
        cr_assert_eq(dt_store_parse(b.data + off, b.len - off, &f, NULL, NULL, 0),
                     DT_STORE_PARSE_FRAME);
        cr_assert_eq(f.cmd, want[i]);
        off += f.size;
    }
    cr_assert_eq(off, b.len);
    dt_store_buf_free(&b);
}

/* A frame header announcing n bytes for a key or value, without the payload. */
static dt_store_parse_result_t parse_header(uint8_t cmd, uint64_t klen, uint64_t vlen,
                                            int with_value, char *why, size_t need_want,
                                            size_t *need) {
    uint8_t buf[64];
    size_t n = 0;
    buf[n++] = cmd;
    memcpy(buf + n, &klen, 8);
    n += 8;
    if (with_value) {
        /* Only meaningful when klen is small: the key bytes follow. */
        memset(buf + n, 'k', (size_t)klen);
        n += (size_t)klen;
        memcpy(buf + n, &vlen, 8);
        n += 8;
    }
    dt_store_frame_t f;
    (void)need_want;
    return dt_store_parse(buf, n, &f, need, why, 128);
}

Test(store_proto, limits_are_bad_frames_as_soon_as_the_length_arrives) {
    char why[128];
    size_t need = 0;
    /* Key of exactly 8 KiB is fine (needs its bytes); one more is bad. */
    cr_assert_eq(parse_header(DT_STORE_CMD_GET, DT_STORE_MAX_KEY_BYTES, 0, 0, why, 0, &need),
                 DT_STORE_PARSE_NEED_MORE);
    cr_assert_eq(need, 9 + DT_STORE_MAX_KEY_BYTES);
    cr_assert_eq(parse_header(DT_STORE_CMD_GET, DT_STORE_MAX_KEY_BYTES + 1, 0, 0, why, 0, &need),
                 DT_STORE_PARSE_BAD);
    cr_assert(strstr(why, "key of 8193 bytes"), "%s", why);
    /* Value of 8 MiB fine, 8 MiB + 1 bad. */
    cr_assert_eq(parse_header(DT_STORE_CMD_SET, 1, DT_STORE_MAX_VALUE_BYTES, 1, why, 0, &need),
                 DT_STORE_PARSE_NEED_MORE);
    cr_assert_eq(need, 1 + 8 + 1 + 8 + DT_STORE_MAX_VALUE_BYTES);
    cr_assert_eq(
        parse_header(DT_STORE_CMD_SET, 1, DT_STORE_MAX_VALUE_BYTES + 1ull, 1, why, 0, &need),
        DT_STORE_PARSE_BAD);
    cr_assert(strstr(why, "value of 8388609 bytes"), "%s", why);
    /* Absurd lengths (that would overflow size_t arithmetic) are bad too. */
    cr_assert_eq(parse_header(DT_STORE_CMD_SET, UINT64_MAX, 0, 0, why, 0, &need),
                 DT_STORE_PARSE_BAD);
    cr_assert_eq(parse_header(DT_STORE_CMD_SET, 1, UINT64_MAX, 1, why, 0, &need),
                 DT_STORE_PARSE_BAD);
    /* Key counts: 128 Ki fine, one more bad, for every list command. */
    uint8_t cmds[] = {DT_STORE_CMD_CHECK, DT_STORE_CMD_WAIT, DT_STORE_CMD_MULTI_GET,
                      DT_STORE_CMD_MULTI_SET};
    for (int c = 0; c < 4; c++) {
        cr_assert_eq(parse_header(cmds[c], DT_STORE_MAX_KEYS_PER_REQUEST, 0, 0, why, 0, &need),
                     DT_STORE_PARSE_NEED_MORE);
        cr_assert_eq(
            parse_header(cmds[c], DT_STORE_MAX_KEYS_PER_REQUEST + 1, 0, 0, why, 0, &need),
            DT_STORE_PARSE_BAD);
        cr_assert(strstr(why, "131073 keys"), "%s", why);
    }
}

Test(store_proto, unknown_and_unsupported_commands_are_bad) {
    char why[128];
    dt_store_frame_t f;
    for (int cmd = 14; cmd < 256; cmd++) {
        if (cmd == DT_STORE_CMD_LIST_KEYS || cmd == DT_STORE_CMD_BARRIER ||
            cmd == DT_STORE_CMD_AUTH_HELLO || cmd == DT_STORE_CMD_AUTH_PROOF)
            continue;
        uint8_t b = (uint8_t)cmd;
        cr_assert_eq(dt_store_parse(&b, 1, &f, NULL, why, sizeof why), DT_STORE_PARSE_BAD,
                     "cmd %d", cmd);
        cr_assert(strstr(why, "command"), "%s", why);
    }
}

/* The token exchange's frames: the command byte and exactly 32 bytes. */
Test(store_proto, auth_frames) {
    uint8_t b[40];
    dt_store_frame_t f;
    size_t need = 0;
    for (int cmd = DT_STORE_CMD_AUTH_HELLO; cmd <= DT_STORE_CMD_AUTH_PROOF; cmd++) {
        b[0] = (uint8_t)cmd;
        for (int i = 1; i < 40; i++) b[i] = (uint8_t)i;
        cr_assert_eq(dt_store_parse(b, 32, &f, &need, NULL, 0), DT_STORE_PARSE_NEED_MORE);
        cr_assert_eq(need, 33);
        cr_assert_eq(dt_store_parse(b, 40, &f, &need, NULL, 0), DT_STORE_PARSE_FRAME);
        cr_assert_eq(f.size, 33);
        cr_assert_eq(f.auth, b + 1);
    }
    cr_assert_str_eq(dt_store_cmd_name(DT_STORE_CMD_AUTH_PROOF), "AUTH_PROOF");
}

Test(store_proto, random_garbage_never_reads_out_of_bounds) {
    /* Each result must be consistent: a FRAME fits in the input, NEED_MORE asks
     * for more than was given. Run under ASan (make test SAN=1) for bounds. */
    unsigned seed = 12345;
    uint8_t buf[256];
    for (int iter = 0; iter < 20000; iter++) {
        size_t n = (size_t)(rand_r(&seed) % sizeof buf);
        for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)rand_r(&seed);
        if (n) buf[0] %= 20;
        /* Small lengths make deep parses likely. */
        for (size_t i = 1; i + 8 <= n; i += 9) memset(buf + i + 1, 0, 7);
        dt_store_frame_t f;
        size_t need = 0;
        dt_store_parse_result_t r = dt_store_parse(buf, n, &f, &need, NULL, 0);
        if (r == DT_STORE_PARSE_FRAME) cr_assert_leq(f.size, n);
        if (r == DT_STORE_PARSE_NEED_MORE) cr_assert_gt(need, n);
    }
}

Test(store_proto, buffer_consume_and_growth) {
    dt_store_buf_t b = {0};
    for (int i = 0; i < 1000; i++) dt_store_buf_put_u32(&b, (uint32_t)i);
    cr_assert_eq(b.len, 4000);
    dt_store_buf_consume(&b, 4 * 999);
    uint32_t v;
    memcpy(&v, b.data, 4);
    cr_assert_eq(v, 999);
    dt_store_buf_consume(&b, 100);
    cr_assert_eq(b.len, 0);
    dt_store_buf_free(&b);
    cr_assert_null(b.data);
}
