/*
 * test_sha256.c - SHA-256 against the FIPS 180-4 examples (one block, two
 * blocks, a million 'a's, the empty message), incremental updates split at every
 * offset, and HMAC-SHA256 against RFC 4231's test cases 1-4, 6 and 7.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "common/sha256.h"

static void hex(const uint8_t *d, char out[65]) {
    for (int i = 0; i < 32; i++) sprintf(out + 2 * i, "%02x", d[i]);
}

static void check_sha(const void *msg, size_t n, const char *want) {
    uint8_t d[32];
    char h[65];
    dt_sha256(msg, n, d);
    hex(d, h);
    cr_assert_str_eq(h, want, "SHA-256 of %zu bytes", n);
}

Test(sha256, fips_examples) {
    check_sha("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    check_sha("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    check_sha(two, strlen(two), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    static char million[1000000];
    memset(million, 'a', sizeof million);
    check_sha(million, sizeof million,
              "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

Test(sha256, incremental_matches_one_call) {
    uint8_t msg[200], whole[32], part[32];
    for (size_t i = 0; i < sizeof msg; i++) msg[i] = (uint8_t)(i * 7 + 3);
    for (size_t n = 0; n <= sizeof msg; n += 11) {
        dt_sha256(msg, n, whole);
        for (size_t cut = 0; cut <= n; cut++) {
            dt_sha256_ctx c;
            dt_sha256_init(&c);
            dt_sha256_update(&c, msg, cut);
            dt_sha256_update(&c, msg + cut, n - cut);
            dt_sha256_final(&c, part);
            cr_assert(!memcmp(whole, part, 32), "n %zu cut %zu", n, cut);
        }
    }
}

static void check_hmac(const void *key, size_t kl, const void *msg, size_t ml, const char *want) {
    uint8_t d[32];
    char h[65];
    dt_hmac_sha256(key, kl, msg, ml, d);
    hex(d, h);
    cr_assert_str_eq(h, want, "HMAC-SHA256 with a %zu-byte key", kl);
}

Test(sha256, hmac_rfc4231) {
    uint8_t k[131], m[50];
    memset(k, 0x0b, 20);
    check_hmac(k, 20, "Hi There", 8,
               "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
    const char *jefe = "what do ya want for nothing?";
    check_hmac("Jefe", 4, jefe, strlen(jefe),
               "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    memset(k, 0xaa, 20);
    memset(m, 0xdd, 50);
    check_hmac(k, 20, m, 50, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
    for (int i = 0; i < 25; i++) k[i] = (uint8_t)(i + 1);
    memset(m, 0xcd, 50);
    check_hmac(k, 25, m, 50, "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
    memset(k, 0xaa, 131);
    const char *t6 = "Test Using Larger Than Block-Size Key - Hash Key First";
    check_hmac(k, 131, t6, strlen(t6),
               "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    const char *t7 = "This is a test using a larger than block-size key and a larger than "
                     "block-size data. The key needs to be hashed before being used by the "
                     "HMAC algorithm.";
    check_hmac(k, 131, t7, strlen(t7),
               "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

Test(sha256, constant_time_compare) {
    cr_assert(dt_mem_equal_ct("abcd", "abcd", 4));
    cr_assert(!dt_mem_equal_ct("abcd", "abce", 4));
    cr_assert(!dt_mem_equal_ct("xbcd", "abcd", 4));
    cr_assert(dt_mem_equal_ct("", "", 0));
}
