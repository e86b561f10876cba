/*
 * test_args.c - the flags' number parsers (cli/args.h): the whole string a number
 * within the bounds, nan, inf and overflowing suffixes refused, *out untouched on
 * a refusal; the suffixes of each kind.
 */
#include <criterion/criterion.h>
#include <float.h>
#include <stdint.h>

#include "cli/args.h"

Test(args, int_bounds_and_garbage) {
    int v = 7;
    cr_assert_eq(dt_arg_int("42", 1, 100, &v), 0);
    cr_assert_eq(v, 42);
    cr_assert_eq(dt_arg_int("-1", -1, 1, &v), 0);
    cr_assert_eq(v, -1);
    v = 7;
    const char *bad[] = {"", "x", "5x", "1.5", "101", "0", "99999999999999999999", "nan", "inf"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(dt_arg_int(bad[i], 1, 100, &v), -1, "%s", bad[i]);
        cr_assert_eq(v, 7);
    }
}

Test(args, double_finite_in_bounds) {
    double d = 3;
    cr_assert_eq(dt_arg_double("0.4", 0, 1, &d), 0);
    cr_assert_float_eq(d, 0.4, 1e-15);
    cr_assert_eq(dt_arg_double("1e-3", -DBL_MAX, DBL_MAX, &d), 0);
    const char *bad[] = {"nan", "inf", "-inf", "1e999", "2", "0.5x", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) cr_assert_eq(dt_arg_double(bad[i], -1, 1, &d), -1, "%s", bad[i]);
}

Test(args, count_decimal_suffixes) {
    double d = 0;
    cr_assert_eq(dt_arg_count("7B", 1, DBL_MAX, &d), 0);
    cr_assert_float_eq(d, 7e9, 1);
    cr_assert_eq(dt_arg_count("124M", 1, DBL_MAX, &d), 0);
    cr_assert_float_eq(d, 124e6, 1);
    cr_assert_eq(dt_arg_count("1.5T", 1, DBL_MAX, &d), 0);
    cr_assert_float_eq(d, 1.5e12, 1);
    cr_assert_eq(dt_arg_count("2k", 1, DBL_MAX, &d), 0);
    cr_assert_float_eq(d, 2e3, 1e-9);
    /* inf after the suffix, nan, an unknown suffix, below the bound */
    const char *bad[] = {"1e305T", "nan", "inf", "7m", "7BB", "0.5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(dt_arg_count(bad[i], 1, DBL_MAX, &d), -1, "%s", bad[i]);
}

Test(args, u64_and_bytes) {
    uint64_t u = 0;
    cr_assert_eq(dt_arg_u64("10M", 1, UINT64_MAX, &u), 0);
    cr_assert_eq(u, 10000000u);
    cr_assert_eq(dt_arg_u64("3g", 1, UINT64_MAX, &u), 0);
    cr_assert_eq(u, 3000000000u);
    const char *ubad[] = {"-1", "+1", "1.5K", "", "99999999999999999999G"};
    for (size_t i = 0; i < sizeof ubad / sizeof ubad[0]; i++)
        cr_assert_eq(dt_arg_u64(ubad[i], 0, UINT64_MAX, &u), -1, "%s", ubad[i]);
    size_t b = 0;
    cr_assert_eq(dt_arg_bytes("256M", 0, SIZE_MAX, &b), 0);
    cr_assert_eq(b, (size_t)256 << 20);
    cr_assert_eq(dt_arg_bytes("1.5KB", 0, SIZE_MAX, &b), 0);
    cr_assert_eq(b, 1536u);
    const char *bbad[] = {"nan", "inf", "1e30", "-1", "8X", "4KBB"};
    for (size_t i = 0; i < sizeof bbad / sizeof bbad[0]; i++)
        cr_assert_eq(dt_arg_bytes(bbad[i], 0, SIZE_MAX, &b), -1, "%s", bbad[i]);
}

Test(args, int_list) {
    int v[4];
    cr_assert_eq(dt_arg_int_list("1,2,4", 1, 16384, v, 4), 3);
    cr_assert_eq(v[2], 4);
    cr_assert_eq(dt_arg_int_list("1,x", 1, 16384, v, 4), -1);
    cr_assert_eq(dt_arg_int_list("1,2,3,4,5", 1, 16384, v, 4), -1);
    cr_assert_eq(dt_arg_int_list("", 1, 16384, v, 4), -1);
    cr_assert_eq(dt_arg_int_list("0", 1, 16384, v, 4), -1);
}
