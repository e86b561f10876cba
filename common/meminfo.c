/*
 * meminfo.c - the host memory a process can still get (meminfo.h): /proc/meminfo's
 * MemAvailable, or the room under its cgroup's memory limits (v2 memory.max, v1
 * memory.limit_in_bytes, ancestors included) when that is lower.
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "common/meminfo.h"

#include <sched.h>
#include <unistd.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The value of key in the memory.stat at dir (0 when absent). */
static double stat_value(const char *dir, const char *key) {
    char p[4500], line[256];
    snprintf(p, sizeof p, "%s/memory.stat", dir);
    FILE *f = fopen(p, "r");
    if (!f) return 0;
    double v = 0;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && line[kl] == ' ') {
            v = strtod(line + kl + 1, NULL);
            break;
        }
    fclose(f);
    return v > 0 ? v : 0;
}

/* The smallest room (limit - usage) under the memory limits of the cgroup at path
 * (below root) and its ancestors, or -1 when none is set. A limit of 2^60 or more is
 * cgroup v1's "none". The usage leaves out the inactive file cache (memory.stat's
 * inactive_key), which the kernel reclaims before it fails an allocation: a cgroup
 * full of an earlier job's page cache is not short of memory (as MemAvailable). */
static double room_under(const char *root, char *path, const char *max_file, const char *cur_file,
                         const char *inactive_key) {
    double room = -1;
    for (;;) {
        char p[4400], buf[64];
        double mx = -1, cur = -1;
        snprintf(p, sizeof p, "%s%s/%s", root, path, max_file);
        FILE *m = fopen(p, "r");
        if (m) {
            if (fgets(buf, sizeof buf, m) && strncmp(buf, "max", 3)) mx = strtod(buf, NULL);
            fclose(m);
        }
        snprintf(p, sizeof p, "%s%s/%s", root, path, cur_file);
        m = fopen(p, "r");
        if (m) {
            if (fgets(buf, sizeof buf, m)) cur = strtod(buf, NULL);
            fclose(m);
        }
        if (mx >= 0 && mx < 1.15e18 && cur >= 0) {
            snprintf(p, sizeof p, "%s%s", root, path);
            cur -= stat_value(p, inactive_key);
            if (cur < 0) cur = 0;
            if (room < 0 || mx - cur < room) room = mx > cur ? mx - cur : 0;
        }
        char *slash = strrchr(path, '/');
        if (!slash || !path[0] || !path[1]) break; /* the root done */
        if (slash == path) slash[1] = '\0'; /* "/a" -> "/" */
        else *slash = '\0';
    }
    return room;
}

/* The room under this process's cgroup memory limits (v2 memory.max, or v1
 * memory.limit_in_bytes), -1 when there is none; *v2 says which. */
static double cgroup_room(int *v2) {
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return -1;
    char line[4096], p2[4096] = "", p1[4096] = "";
    int have2 = 0, have1 = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c2 = '\0';
        const char *ctl = c1 + 1, *path = c2 + 1;
        if (!*ctl) snprintf(p2, sizeof p2, "%s", path), have2 = 1;
        else if (!strcmp(ctl, "memory") || strstr(ctl, "memory,") || strstr(ctl, ",memory"))
            snprintf(p1, sizeof p1, "%s", path), have1 = 1;
    }
    fclose(f);
    double room = -1;
    *v2 = 0;
    if (have1) room = room_under("/sys/fs/cgroup/memory", p1, "memory.limit_in_bytes", "memory.usage_in_bytes",
                           "total_inactive_file");
    if (have2) {
        double r2 = room_under("/sys/fs/cgroup", p2, "memory.max", "memory.current", "inactive_file");
        if (r2 >= 0 && (room < 0 || r2 < room)) room = r2, *v2 = 1;
    }
    return room;
}

double dt_meminfo_host_available(const char **what) {
    const char *e = getenv("DTRUN_TEST_MEM_AVAILABLE");
    if (e && *e) {
        *what = "DTRUN_TEST_MEM_AVAILABLE";
        return strtod(e, NULL);
    }
    double kb = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
        fclose(f);
    }
    int v2;
    double avail = kb * 1024, room = cgroup_room(&v2);
    *what = "available on this host (MemAvailable)";
    if (room >= 0 && (avail <= 0 || room < avail)) {
        *what = v2 ? "left under this cgroup's memory.max" : "left under this cgroup's memory.limit_in_bytes";
        avail = room;
    }
    return avail;
}

int dt_meminfo_cpus(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
