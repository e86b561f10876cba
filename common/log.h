/*
 * log.h - leveled logging to stderr with a "[dtrun host rank]" style prefix.
 *
 * The level comes from DTRUN_LOG_LEVEL (debug|info|warn|error, default info).
 * One write(2) per line, so lines from concurrent processes never tear.
 */
#ifndef DT_COMMON_LOG_H
#define DT_COMMON_LOG_H

typedef enum dt_log_level {
    DT_LOG_DEBUG = 0,
    DT_LOG_INFO = 1,
    DT_LOG_WARN = 2,
    DT_LOG_ERROR = 3,
    DT_LOG_OFF = 4,
} dt_log_level_t;

/* Reads DTRUN_LOG_LEVEL; called lazily by the first dt_log() as well. */
void dt_log_init(void);
void dt_log_set_level(dt_log_level_t level);
dt_log_level_t dt_log_get_level(void);
/* Prefix printed before every line, e.g. "dtrun agent" or "dtrun rank 3". */
void dt_log_set_prefix(const char *prefix);
/* Parses "debug", "info", "warn", "error", "off"; -1 when unknown. */
int dt_log_level_parse(const char *s);

void dt_log(dt_log_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define DT_LOG_DEBUG(...) dt_log(DT_LOG_DEBUG, __VA_ARGS__)
#define DT_LOG_INFO(...) dt_log(DT_LOG_INFO, __VA_ARGS__)
#define DT_LOG_WARN(...) dt_log(DT_LOG_WARN, __VA_ARGS__)
#define DT_LOG_ERROR(...) dt_log(DT_LOG_ERROR, __VA_ARGS__)

#endif /* DT_COMMON_LOG_H */
