/*
 * clock.h - monotonic and wall clocks.
 */
#ifndef DT_COMMON_CLOCK_H
#define DT_COMMON_CLOCK_H

#include <stddef.h>
#include <stdint.h>

/* Monotonic nanoseconds (CLOCK_MONOTONIC); for intervals and deadlines. */
uint64_t dt_now_ns(void);
/* Monotonic seconds as a double. */
double dt_now_s(void);
/* Wall-clock seconds since the epoch (CLOCK_REALTIME), for reports. */
double dt_wall_s(void);
/* "2026-11-29 07:22:50" (local time) into buf; returns buf. */
char *dt_wall_str(double wall_s, char *buf, size_t len);
/* Sleeps for ms milliseconds, restarting after signals. */
void dt_sleep_ms(uint64_t ms);
/* How often a long wait (for the store, for the other nodes) says it is still
 * waiting: DTRUN_WAIT_REPORT_S seconds (0.1 to 3600), default 30. */
double dt_wait_report_s(void);

#endif /* DT_COMMON_CLOCK_H */
