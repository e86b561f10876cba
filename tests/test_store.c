/*
 * test_store.c - the store server and client over real loopback sockets: every
 * command's semantics, waits woken by each kind of write, timeouts that name
 * keys, limits that close only the offender. test_store_clients.c has many
 * concurrent clients, clients vanishing mid-wait, connect retries and timeouts,
 * IPv6. Shared helpers (the per-test server, raw_* sockets that speak the wire
 * protocol directly where the blocking client would refuse to send something
 * bad): store_harness.h.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "rendezvous/proto.h"
#include "rendezvous/store.h"
#include "rendezvous/store_bench.h"
#include "store_harness.h"

TestSuite(store, .init = start_server, .fini = stop_server, .timeout = 30);

/* ---- semantics -------------------------------------------------------------- */

Test(store, set_get_overwrite_binary_and_counts) {
    dt_store_t *st = connect_ok();
    cr_assert_eq(dt_store_set(st, "a", "hello", 5), DT_STATUS_OK);
    char *v = get_str(st, "a");
    cr_assert_str_eq(v, "hello");
    free(v);
    cr_assert_eq(dt_store_set(st, "a", "x", 1), DT_STATUS_OK);
    v = get_str(st, "a");
    cr_assert_str_eq(v, "x");
    free(v);
    static const uint8_t bin[] = {0, 255, 0, 7};
    cr_assert_eq(dt_store_set(st, "bin", bin, sizeof bin), DT_STATUS_OK);
    void *bv;
    size_t bn;
    cr_assert_eq(dt_store_get(st, "bin", &bv, &bn), DT_STATUS_OK);
    cr_assert_eq(bn, sizeof bin);
    cr_assert_arr_eq(bv, bin, sizeof bin);
    free(bv);
    cr_assert_eq(dt_store_set(st, "empty", "", 0), DT_STATUS_OK);
    v = get_str(st, "empty");
    cr_assert_str_eq(v, "");
    free(v);
    int64_t n;
    cr_assert_eq(dt_store_num_keys(st, &n), DT_STATUS_OK);
    cr_assert_eq(n, 3);
    cr_assert_eq(dt_store_server_num_keys(srv), 3);
    int del = -1;
    cr_assert_eq(dt_store_delete(st, "a", &del), DT_STATUS_OK);
    cr_assert_eq(del, 1);
    cr_assert_eq(dt_store_delete(st, "a", &del), DT_STATUS_OK);
    cr_assert_eq(del, 0);
    cr_assert_eq(dt_store_num_keys(st, &n), DT_STATUS_OK);
    cr_assert_eq(n, 2);
    double rtt = -1;
    cr_assert_eq(dt_store_ping(st, &rtt), DT_STATUS_OK);
    cr_assert(rtt >= 0 && rtt < 1.0);
    dt_store_close(st);
}

Test(store, add_counts_in_decimal_text) {
    dt_store_t *st = connect_ok();
    int64_t r = 0;
    cr_assert_eq(dt_store_add(st, "c", 5, &r), DT_STATUS_OK);
    cr_assert_eq(r, 5);
    cr_assert_eq(dt_store_add(st, "c", -7, &r), DT_STATUS_OK);
    cr_assert_eq(r, -2);
    char *v = get_str(st, "c");
    cr_assert_str_eq(v, "-2");
    free(v);
    cr_assert_eq(dt_store_set(st, "n", "40", 2), DT_STATUS_OK);
    cr_assert_eq(dt_store_add(st, "n", 2, &r), DT_STATUS_OK);
    cr_assert_eq(r, 42);
    cr_assert_eq(dt_store_add(st, "big", INT64_MAX - 1, &r), DT_STATUS_OK);
    cr_assert_eq(dt_store_add(st, "big", 1, &r), DT_STATUS_OK);
    cr_assert_eq(r, INT64_MAX);
    dt_store_close(st);
}

Test(store, add_on_text_or_overflow_closes_only_that_client) {
    dt_store_t *bystander = connect_ok();
    dt_store_t *st = connect_ok();
    cr_assert_eq(dt_store_set(bystander, "word", "abc", 3), DT_STATUS_OK);
    cr_assert_eq(dt_store_ping(bystander, NULL), DT_STATUS_OK); /* SET has no reply */
    int64_t r;
    cr_assert_eq(dt_store_add(st, "word", 1, &r), DT_STATUS_CLOSED);
    dt_store_close(st);
    st = connect_ok();
    cr_assert_eq(dt_store_add(st, "max", INT64_MAX, &r), DT_STATUS_OK);
    cr_assert_eq(dt_store_add(st, "max", 1, &r), DT_STATUS_CLOSED);
    dt_store_close(st);
    cr_assert_eq(dt_store_add(bystander, "ok", 1, &r), DT_STATUS_OK);
    cr_assert_eq(r, 1);
    dt_store_close(bystander);
}

Test(store, compare_set_three_cases) {
    dt_store_t *st = connect_ok();
    void *v;
    size_t n;
    /* 1: missing key, empty expected -> sets desired, returns it. */
    cr_assert_eq(dt_store_compare_set(st, "k", "", 0, "one", 3, &v, &n), DT_STATUS_OK);
    cr_assert(n == 3 && !memcmp(v, "one", 3));
    free(v);
    char *g = get_str(st, "k");
    cr_assert_str_eq(g, "one");
    free(g);
    /* 2: missing key, non-empty expected -> returns expected, key stays missing. */
    cr_assert_eq(dt_store_compare_set(st, "absent", "exp", 3, "des", 3, &v, &n), DT_STATUS_OK);
    cr_assert(n == 3 && !memcmp(v, "exp", 3));
    free(v);
    const char *absent = "absent";
    int ready = 1;
    cr_assert_eq(dt_store_check(st, &absent, 1, &ready), DT_STATUS_OK);
    cr_assert_eq(ready, 0);
    /* 3a: present and equal -> swapped. */
    cr_assert_eq(dt_store_compare_set(st, "k", "one", 3, "two", 3, &v, &n), DT_STATUS_OK);
    cr_assert(n == 3 && !memcmp(v, "two", 3));
    free(v);
    /* 3b: present and different -> unchanged, current value returned. */
    cr_assert_eq(dt_store_compare_set(st, "k", "one", 3, "three", 5, &v, &n), DT_STATUS_OK);
    cr_assert(n == 3 && !memcmp(v, "two", 3));
    free(v);
    /* present, empty expected, non-empty value -> unchanged. */
    cr_assert_eq(dt_store_compare_set(st, "k", "", 0, "x", 1, &v, &n), DT_STATUS_OK);
    cr_assert(n == 3 && !memcmp(v, "two", 3));
    free(v);
    dt_store_close(st);
}

Test(store, check_append_multi_set_multi_get) {
    dt_store_t *st = connect_ok();
    cr_assert_eq(dt_store_append(st, "log", "ab", 2), DT_STATUS_OK);
    cr_assert_eq(dt_store_append(st, "log", "cd", 2), DT_STATUS_OK);
    char *v = get_str(st, "log");
    cr_assert_str_eq(v, "abcd");
    free(v);
    const char *keys[] = {"m1", "m2", "m3"};
    const void *vals[] = {"v1", "", "value3"};
    size_t lens[] = {2, 0, 6};
    int ready = 1;
    cr_assert_eq(dt_store_check(st, keys, 3, &ready), DT_STATUS_OK);
    cr_assert_eq(ready, 0);
    cr_assert_eq(dt_store_multi_set(st, keys, vals, lens, 3), DT_STATUS_OK);
    cr_assert_eq(dt_store_check(st, keys, 3, &ready), DT_STATUS_OK);
    cr_assert_eq(ready, 1);
    void *out[3];
    size_t outn[3];
    cr_assert_eq(dt_store_multi_get(st, keys, 3, out, outn), DT_STATUS_OK);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(outn[i], lens[i]);
        cr_assert(!memcmp(out[i], vals[i], lens[i]));
        free(out[i]);
    }
    cr_assert_eq(dt_store_check(st, NULL, 0, &ready), DT_STATUS_OK);
    cr_assert_eq(ready, 1, "no keys are all present");
    dt_store_close(st);
}

Test(store, values_at_the_limits_and_client_side_refusals) {
    dt_store_t *st = connect_ok();
    size_t big = DT_STORE_MAX_VALUE_BYTES;
    uint8_t *val = malloc(big + 1);
    for (size_t i = 0; i <= big; i++) val[i] = (uint8_t)(i * 31 + 7);
    char key[DT_STORE_MAX_KEY_BYTES + 2];
    memset(key, 'k', DT_STORE_MAX_KEY_BYTES);
    key[DT_STORE_MAX_KEY_BYTES] = '\0';
    cr_assert_eq(dt_store_set(st, key, val, big), DT_STATUS_OK, "%s", dt_error_detail());
    void *got;
    size_t n;
    cr_assert_eq(dt_store_get(st, key, &got, &n), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(n, big);
    cr_assert(!memcmp(got, val, big));
    free(got);
    /* One byte over: refused before sending, the connection stays usable. */
    cr_assert_eq(dt_store_set(st, "v", val, big + 1), DT_STATUS_LIMIT);
    cr_assert(strstr(dt_error_detail(), "value of 8388609 bytes"), "%s", dt_error_detail());
    key[DT_STORE_MAX_KEY_BYTES] = 'k';
    key[DT_STORE_MAX_KEY_BYTES + 1] = '\0';
    cr_assert_eq(dt_store_set(st, key, "x", 1), DT_STATUS_LIMIT);
    cr_assert(strstr(dt_error_detail(), "key of 8193 bytes"), "%s", dt_error_detail());
    cr_assert_eq(dt_store_ping(st, NULL), DT_STATUS_OK);
    free(val);
    dt_store_close(st);
}

/* ---- waiting ---------------------------------------------------------------- */

typedef struct {
    int port;
    int delay_ms;
    int how; /* which write makes the key exist */
    const char *key;
} writer_arg_t;

enum { W_SET, W_ADD, W_CAS, W_MULTI_SET, W_APPEND };

static void *writer(void *p) {
    writer_arg_t *a = p;
    dt_sleep_ms((uint64_t)a->delay_ms);
    dt_store_t *st = NULL;
    if (dt_store_connect("127.0.0.1", a->port, 5.0, &st) != DT_STATUS_OK) return NULL;
    int64_t r;
    void *v;
    size_t n;
    const char *keys[1] = {a->key};
    const void *vals[1] = {"m"};
    size_t lens[1] = {1};
    switch (a->how) {
    case W_SET: dt_store_set(st, a->key, "late", 4); break;
    case W_ADD: dt_store_add(st, a->key, 1, &r); break;
    case W_CAS:
        if (dt_store_compare_set(st, a->key, "", 0, "c", 1, &v, &n) == DT_STATUS_OK) free(v);
        break;
    case W_MULTI_SET: dt_store_multi_set(st, keys, vals, lens, 1); break;
    case W_APPEND: dt_store_append(st, a->key, "a", 1); break;
    }
    dt_store_ping(st, NULL); /* make sure the write was processed before closing */
    dt_store_close(st);
    return NULL;
}

Test(store, get_waits_for_a_later_set_from_another_thread) {
    dt_store_t *st = connect_ok();
    writer_arg_t a = {.port = port, .delay_ms = 300, .how = W_SET, .key = "late"};
    pthread_t th;
    pthread_create(&th, NULL, writer, &a);
    double t0 = dt_now_s();
    char *v = get_str(st, "late");
    double dt = dt_now_s() - t0;
    pthread_join(th, NULL);
    cr_assert_str_eq(v, "late");
    cr_assert(dt > 0.25 && dt < 3.0, "took %.3f s", dt);
    free(v);
    dt_store_close(st);
}

Test(store, wait_is_woken_by_every_kind_of_write) {
    static const char *names[] = {"set", "add", "cas", "multi_set", "append"};
    dt_store_t *st = connect_ok();
    for (int how = W_SET; how <= W_APPEND; how++) {
        writer_arg_t a = {.port = port, .delay_ms = 50, .how = how, .key = names[how]};
        pthread_t th;
        pthread_create(&th, NULL, writer, &a);
        double t0 = dt_now_s();
        const char *key = names[how];
        cr_assert_eq(dt_store_wait(st, &key, 1, 5.0), DT_STATUS_OK, "%s: %s", names[how],
                     dt_error_detail());
        cr_assert_lt(dt_now_s() - t0, 2.0, "%s woke late", names[how]);
        pthread_join(th, NULL);
    }
    dt_store_close(st);
}

Test(store, multi_get_waits_for_all_keys) {
    dt_store_t *st = connect_ok();
    cr_assert_eq(dt_store_set(st, "x1", "a", 1), DT_STATUS_OK);
    writer_arg_t a = {.port = port, .delay_ms = 200, .how = W_SET, .key = "x2"};
    pthread_t th;
    pthread_create(&th, NULL, writer, &a);
    const char *keys[] = {"x1", "x2"};
    void *v[2];
    size_t n[2];
    cr_assert_eq(dt_store_multi_get(st, keys, 2, v, n), DT_STATUS_OK, "%s", dt_error_detail());
    pthread_join(th, NULL);
    cr_assert(n[0] == 1 && !memcmp(v[0], "a", 1));
    cr_assert(n[1] == 4 && !memcmp(v[1], "late", 4));
    free(v[0]);
    free(v[1]);
    dt_store_close(st);
}

Test(store, wait_timeout_names_the_missing_keys_and_connection_survives) {
    dt_store_t *st = connect_ok();
    cr_assert_eq(dt_store_set(st, "here", "1", 1), DT_STATUS_OK);
    const char *keys[] = {"here", "gone/a", "gone/b"};
    double t0 = dt_now_s();
    cr_assert_eq(dt_store_wait(st, keys, 3, 0.3), DT_STATUS_TIMEOUT);
    double dt = dt_now_s() - t0;
    cr_assert(dt >= 0.29 && dt < 2.0, "took %.3f s", dt);
    const char *d = dt_error_detail();
    cr_assert(strstr(d, "'gone/a'") && strstr(d, "'gone/b'"), "%s", d);
    cr_assert(!strstr(d, "'here'"), "present key named as missing: %s", d);
    cr_assert(strstr(d, "127.0.0.1:"), "endpoint not named: %s", d);
    /* The canceled wait must not fire later and desynchronise the stream. */
    cr_assert_eq(dt_store_set(st, "gone/a", "1", 1), DT_STATUS_OK);
    cr_assert_eq(dt_store_set(st, "gone/b", "1", 1), DT_STATUS_OK);
    int64_t r = 0;
    cr_assert_eq(dt_store_add(st, "after", 3, &r), DT_STATUS_OK);
    cr_assert_eq(r, 3);
    /* A GET of a missing key times out the same way. */
    dt_store_set_timeout(st, 0.2);
    void *v;
    size_t n;
    cr_assert_eq(dt_store_get(st, "never", &v, &n), DT_STATUS_TIMEOUT);
    cr_assert(strstr(dt_error_detail(), "'never'"), "%s", dt_error_detail());
    cr_assert_eq(dt_store_ping(st, NULL), DT_STATUS_OK);
    dt_store_close(st);
}

Test(store, cancel_wait_on_the_wire) {
    int fd = raw_validated();
    dt_store_buf_t b = {0};
    const char *keys[] = {"cw"};
    dt_store_encode_keys(&b, DT_STORE_CMD_WAIT, keys, 1);
    dt_store_encode_simple(&b, DT_STORE_CMD_CANCEL_WAIT);
    raw_send(fd, &b);
    uint8_t r = 0xff;
    raw_recv(fd, &r, 1);
    cr_assert_eq(r, DT_STORE_WAIT_CANCELED);
    /* The key appearing later must not produce a STOP_WAITING. */
    dt_store_t *st = connect_ok();
    cr_assert_eq(dt_store_set(st, "cw", "1", 1), DT_STATUS_OK);
    cr_assert_eq(dt_store_ping(st, NULL), DT_STATUS_OK);
    raw_expect_silence(fd, 100);
    /* A CANCEL_WAIT with nothing pending still answers. */
    b.len = 0;
    dt_store_encode_simple(&b, DT_STORE_CMD_CANCEL_WAIT);
    raw_send(fd, &b);
    raw_recv(fd, &r, 1);
    cr_assert_eq(r, DT_STORE_WAIT_CANCELED);
    dt_store_buf_free(&b);
    close(fd);
    dt_store_close(st);
}

Test(store, raw_get_of_missing_key_blocks_the_stream_in_order) {
    int fd = raw_validated();
    dt_store_buf_t b = {0};
    dt_store_encode_key(&b, DT_STORE_CMD_GET, "later", 5);
    dt_store_encode_ping(&b, 77);
    raw_send(fd, &b);
    raw_expect_silence(fd, 100);
    dt_store_t *st = connect_ok();
    cr_assert_eq(dt_store_set(st, "later", "val", 3), DT_STATUS_OK);
    uint64_t n = 0;
    raw_recv(fd, &n, 8);
    cr_assert_eq(n, 3);
    char v[3];
    raw_recv(fd, v, 3);
    cr_assert(!memcmp(v, "val", 3));
    uint32_t nonce = 0;
    raw_recv(fd, &nonce, 4);
    cr_assert_eq(nonce, 77, "PING answered after the GET it followed");
    dt_store_buf_free(&b);
    close(fd);
    dt_store_close(st);
}

Test(store, list_keys_and_barrier_commands) {
    int fd = raw_validated();
    dt_store_buf_t b = {0};
    dt_store_encode_set(&b, DT_STORE_CMD_SET, "l1", 2, "x", 1);
    dt_store_encode_simple(&b, DT_STORE_CMD_LIST_KEYS);
    raw_send(fd, &b);
    int64_t n = 0;
    raw_recv(fd, &n, 8);
    cr_assert_eq(n, 1);
    uint64_t kl = 0;
    raw_recv(fd, &kl, 8);
    char k[2];
    cr_assert_eq(kl, 2);
    raw_recv(fd, k, 2);
    cr_assert(!memcmp(k, "l1", 2));
    /* BARRIER of 2: the first waits, the second releases both. */
    int fd2 = raw_validated();
    b.len = 0;
    dt_store_encode_barrier(&b, "bar", 3, 2);
    raw_send(fd, &b);
    raw_expect_silence(fd, 100);
    raw_send(fd2, &b);
    uint8_t r1 = 9, r2 = 9;
    raw_recv(fd2, &r2, 1);
    raw_recv(fd, &r1, 1);
    cr_assert(r1 == DT_STORE_WAIT_STOP_WAITING && r2 == DT_STORE_WAIT_STOP_WAITING);
    dt_store_buf_free(&b);
    close(fd);
    close(fd2);
}

/* ---- limits and bad input ------------------------------------------------------ */

/* Sends the frame on a fresh validated connection and expects the server to
 * close it, while another client keeps working. */
static void expect_offender_closed(const dt_store_buf_t *frame, int validate) {
    dt_store_t *bystander = connect_ok();
    int fd = validate ? raw_validated() : raw_connect(port);
    raw_send(fd, frame);
    raw_expect_closed(fd);
    close(fd);
    int64_t r = 0;
    cr_assert_eq(dt_store_add(bystander, "still_here", 1, &r), DT_STATUS_OK, "%s",
                 dt_error_detail());
    dt_store_close(bystander);
}

static void put_len(dt_store_buf_t *b, uint64_t n) { dt_store_buf_put_u64(b, n); }

Test(store, limits_close_only_the_offender) {
    dt_store_buf_t b = {0};
    /* Key over 8 KiB: only the length is sent; the server must not wait for it. */
    dt_store_buf_put_u8(&b, DT_STORE_CMD_SET);
    put_len(&b, DT_STORE_MAX_KEY_BYTES + 1);
    expect_offender_closed(&b, 1);
    /* Value over 8 MiB. */
    b.len = 0;
    dt_store_buf_put_u8(&b, DT_STORE_CMD_SET);
    dt_store_buf_put_bytes(&b, "k", 1);
    put_len(&b, DT_STORE_MAX_VALUE_BYTES + 1);
    expect_offender_closed(&b, 1);
    /* More than 128 Ki keys. */
    uint8_t cmds[] = {DT_STORE_CMD_WAIT, DT_STORE_CMD_CHECK, DT_STORE_CMD_MULTI_GET,
                      DT_STORE_CMD_MULTI_SET};
    for (int i = 0; i < 4; i++) {
        b.len = 0;
        dt_store_buf_put_u8(&b, cmds[i]);
        put_len(&b, DT_STORE_MAX_KEYS_PER_REQUEST + 1);
        expect_offender_closed(&b, 1);
    }
    /* Unknown and unimplemented commands. */
    b.len = 0;
    dt_store_buf_put_u8(&b, 99);
    expect_offender_closed(&b, 1);
    b.len = 0;
    dt_store_encode_key(&b, DT_STORE_CMD_QUEUE_LEN, "q", 1);
    expect_offender_closed(&b, 1);
    /* Wrong magic; a command before VALIDATE. */
    b.len = 0;
    dt_store_buf_put_u8(&b, DT_STORE_CMD_VALIDATE);
    dt_store_buf_put_u32(&b, 0x12345678);
    expect_offender_closed(&b, 0);
    b.len = 0;
    dt_store_encode_set(&b, DT_STORE_CMD_SET, "k", 1, "v", 1);
    expect_offender_closed(&b, 0);
    dt_store_buf_free(&b);
    EVENTUALLY(dt_store_server_num_clients(srv) == 0);
}

Test(store, exactly_128ki_keys_in_one_request_is_served) {
    /* Built by hand: 131072 keys "k<i>" in one CHECK, all present after a MULTI_SET. */
    size_t n = DT_STORE_MAX_KEYS_PER_REQUEST;
    char **keys = malloc(n * sizeof *keys);
    const void **vals = malloc(n * sizeof *vals);
    size_t *lens = malloc(n * sizeof *lens);
    for (size_t i = 0; i < n; i++) {
        keys[i] = malloc(16);
        snprintf(keys[i], 16, "k%zu", i);
        vals[i] = "";
        lens[i] = 0;
    }
    dt_store_t *st = connect_ok();
    cr_assert_eq(dt_store_multi_set(st, (const char *const *)keys, vals, lens, n), DT_STATUS_OK);
    int ready = 0;
    cr_assert_eq(dt_store_check(st, (const char *const *)keys, n, &ready), DT_STATUS_OK, "%s",
                 dt_error_detail());
    cr_assert_eq(ready, 1);
    int64_t nk = 0;
    cr_assert_eq(dt_store_num_keys(st, &nk), DT_STATUS_OK);
    cr_assert_eq(nk, (int64_t)n);
    for (size_t i = 0; i < n; i++) free(keys[i]);
    free(keys);
    free(vals);
    free(lens);
    dt_store_close(st);
}

Test(store, truncated_frame_then_disconnect_is_cleaned_up) {
    dt_store_buf_t b = {0};
    dt_store_encode_set(&b, DT_STORE_CMD_SET, "trunc", 5, "0123456789", 10);
    for (size_t cut = 1; cut < b.len; cut += 3) {
        int fd = raw_validated();
        cr_assert_eq(send(fd, b.data, cut, MSG_NOSIGNAL), (ssize_t)cut);
        close(fd);
    }
    dt_store_buf_free(&b);
    EVENTUALLY(dt_store_server_num_clients(srv) == 0);
    cr_assert_eq(dt_store_server_num_keys(srv), 0, "a partial SET must not store anything");
}

Test(store, frame_split_across_many_writes) {
    /* torch's _splitSet sends the key, pauses, then the value: parse must resume. */
    int fd = raw_validated();
    dt_store_buf_t b = {0};
    dt_store_encode_set(&b, DT_STORE_CMD_SET, "split", 5, "abcdefgh", 8);
    dt_store_encode_key(&b, DT_STORE_CMD_GET, "split", 5);
    for (size_t i = 0; i < b.len; i++) {
        cr_assert_eq(send(fd, b.data + i, 1, MSG_NOSIGNAL), 1);
        if (i % 7 == 0) dt_sleep_ms(2);
    }
    uint64_t n = 0;
    raw_recv(fd, &n, 8);
    cr_assert_eq(n, 8);
    char v[8];
    raw_recv(fd, v, 8);
    cr_assert(!memcmp(v, "abcdefgh", 8));
    dt_store_buf_free(&b);
    close(fd);
}

Test(store, client_that_never_reads_its_replies_is_closed) {
    size_t big = DT_STORE_MAX_VALUE_BYTES;
    char *val = calloc(1, big);
    dt_store_t *st = connect_ok();
    cr_assert_eq(dt_store_set(st, "big", val, big), DT_STATUS_OK);
    cr_assert_eq(dt_store_ping(st, NULL), DT_STATUS_OK);
    free(val);
    /* 12 GETs of 8 MiB = 96 MiB of replies that are never read. */
    int fd = raw_validated();
    int rcvbuf = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    dt_store_buf_t b = {0};
    for (int i = 0; i < 12; i++) dt_store_encode_key(&b, DT_STORE_CMD_GET, "big", 3);
    raw_send(fd, &b);
    dt_store_buf_free(&b);
    cr_assert_eq(dt_store_ping(st, NULL), DT_STATUS_OK, "others keep being served");
    /* What the kernel had buffered arrives, then the close: far less than asked. */
    size_t total = 0;
    static char sink[1 << 16];
    ssize_t r;
    while ((r = recv(fd, sink, sizeof sink, 0)) > 0) total += (size_t)r;
    cr_assert(r == 0 || errno == ECONNRESET, "no close: %s", strerror(errno));
    cr_assert_lt(total, 12 * (8 + big), "got all %zu bytes: never closed", total);
    close(fd);
    dt_store_close(st);
}
