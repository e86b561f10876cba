/*
 * clock.c - monotonic and wall clocks.
 */
#include "common/clock.h"

#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <time.h>

uint64_t dt_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double dt_now_s(void) { return (double)dt_now_ns() * 1e-9; }

double dt_wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

char *dt_wall_str(double wall_s, char *buf, size_t len) {
    time_t t = (time_t)wall_s;
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(buf, len, "%Y-%m-%d %H:%M:%S", &tm);
    return buf;
}

void dt_sleep_ms(uint64_t ms) {
    struct timespec req = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&req, &req) != 0 && errno == EINTR) {
    }
}

double dt_wait_report_s(void) {
    const char *v = getenv("DTRUN_WAIT_REPORT_S");
    char *end;
    double s = v && *v ? strtod(v, &end) : 30.0;
    if (!v || !*v || *end || !(s >= 0.1) || s > 3600) s = 30.0;
    return s;
}
