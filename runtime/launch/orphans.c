/*
 * orphans.c - nothing a worker started outlives the job.
 *
 * Three rules, for three ways a worker's descendants escape:
 *
 *   - Each worker leads its own process group (spawn.c). When a round ends, every
 *     worker's group is SIGKILLed even though its leader has exited: a shell's
 *     background job that ignored the stop signal (sh makes `&` jobs ignore SIGINT),
 *     or a child a worker left behind when it exited, is in that group.
 *   - The agent is a child subreaper (PR_SET_CHILD_SUBREAPER): a descendant whose
 *     parent died is re-parented to the agent rather than to init, so one that left
 *     its worker's group (setsid) is still the agent's child, reaped by its SIGCHLD
 *     handler and SIGKILLed (with its own group) when the round ends.
 *   - PR_SET_PDEATHSIG reaches only a worker itself when the agent is SIGKILLed. A
 *     guardian process, forked before anything else runs, holds the read end of a
 *     pipe the agent writes each worker's process group to; when the agent dies,
 *     however it dies, the pipe reads end-of-file and the guardian SIGKILLs every
 *     group it was told of, then every process whose environment names this job
 *     (DTRUN_AGENT_PID and DTRUN_RUN_DIR, set for every worker and inherited by its
 *     descendants: that finds one that left its group too), then exits. An orderly
 *     agent says goodbye first.
 *
 * What is not covered: a descendant that leaves its worker's process group, clears
 * its environment and outlives a SIGKILLed agent (a cgroup per job would find it).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "common/mem.h"
#include "runtime/launch/agent_impl.h"

/* One message on the guardian's pipe: 8 bytes, so each write is atomic. */
enum guard_op { GUARD_WATCH = 1, GUARD_FORGET = 2, GUARD_BYE = 3 };
typedef struct guard_msg {
    int32_t op;
    int32_t pgid;
} guard_msg_t;

/* Passes over the agent's children when the round ends: a killed child's own
 * children are re-parented to the agent, and are found by the next pass. */
#define SWEEP_PASSES 50
#define SWEEP_PASS_US 20000

/* The guardian reads at most this much of a process's environment. */
#define GUARD_ENVIRON_MAX (1 << 20)

/* ---- the guardian -------------------------------------------------------- */

/* Moves the pipe ends the guardian keeps to descriptors 3 (the agent's messages) and
 * 4 (held open until it exits) and closes every other one from 3 up: the guardian
 * must not hold the agent's terminal pipes, sockets or files open after it dies. */
static void keep_only(int rfd, int done_fd) {
    int a = fcntl(rfd, F_DUPFD, 10), b = fcntl(done_fd, F_DUPFD, 10);
    dup2(a, 3);
    dup2(b, 4);
#ifdef SYS_close_range
    if (syscall(SYS_close_range, 5u, ~0u, 0u) == 0) return;
#endif
    for (int fd = 5; fd < 4096; fd++) close(fd);
}

/* Whether process pid's environment holds both entries (exactly, as set by spawn.c). */
static int environ_has(long pid, const char *a, const char *b) {
    static char buf[GUARD_ENVIRON_MAX];
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/environ", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    size_t len = 0;
    for (;;) {
        ssize_t n = read(fd, buf + len, sizeof buf - 1 - len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        len += (size_t)n;
        if (len == sizeof buf - 1) break;
    }
    close(fd);
    buf[len] = '\0';
    int found_a = 0, found_b = 0;
    for (size_t at = 0; at < len; at += strlen(buf + at) + 1) {
        found_a |= !strcmp(buf + at, a);
        found_b |= !strcmp(buf + at, b);
    }
    return found_a && found_b;
}

/* SIGKILLs every other process whose environment names this job (also those of the
 * groups just killed that have not died yet); returns how many.
 * A few passes: one that forked between the scan and the kill is found by the next. */
static int kill_by_environ(pid_t agent, const char *run_dir) {
    char a[64], b[PATH_MAX + 32];
    snprintf(a, sizeof a, "DTRUN_AGENT_PID=%d", (int)agent);
    snprintf(b, sizeof b, "DTRUN_RUN_DIR=%s", run_dir);
    pid_t self = getpid();
    int killed = 0;
    for (int pass = 0; pass < 3; pass++) {
        DIR *d = opendir("/proc");
        if (!d) break;
        int found = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
            char *end;
            long pid = strtol(de->d_name, &end, 10);
            if (*end || pid <= 0 || pid == self || !environ_has(pid, a, b)) continue;
            if (kill((pid_t)pid, SIGKILL) == 0) found++;
        }
        closedir(d);
        if (pass == 0) killed = found;
        if (found == 0) break;
    }
    return killed;
}

/* The guardian's life: collect the worker groups, kill them when the agent is gone.
 * The agent has no thread yet when it forks it (dt_agent_orphans_init), so the C
 * library (opendir, snprintf) is safe here. */
static void guardian_main(int rfd, int done_fd, int nslots, pid_t agent, const char *run_dir) {
    static const int ignored[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE};
    struct sigaction ign;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    for (size_t i = 0; i < sizeof ignored / sizeof *ignored; i++) sigaction(ignored[i], &ign, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    prctl(PR_SET_NAME, "dtrun-guard");
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
        dup2(null, STDIN_FILENO);
        dup2(null, STDOUT_FILENO);
        if (null > STDERR_FILENO) close(null);
    }
    keep_only(rfd, done_fd);
    rfd = 3;

    pid_t slots[nslots]; /* the groups being watched, 0 for a free slot */
    for (int i = 0; i < nslots; i++) slots[i] = 0;
    guard_msg_t m;
    size_t have = 0;
    for (;;) {
        ssize_t n = read(rfd, (char *)&m + have, sizeof m - have);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break; /* the agent is gone */
        have += (size_t)n;
        if (have < sizeof m) continue;
        have = 0;
        if (m.op == GUARD_BYE) _exit(0);
        for (int i = 0; i < nslots; i++) {
            if (m.op == GUARD_WATCH && slots[i] == 0) {
                slots[i] = m.pgid;
                break;
            }
            if (m.op == GUARD_FORGET && slots[i] == m.pgid) {
                slots[i] = 0;
                break;
            }
        }
    }
    int killed = 0;
    for (int i = 0; i < nslots; i++)
        if (slots[i] > 0 && kill(-slots[i], SIGKILL) == 0) killed++;
    int strays = kill_by_environ(agent, run_dir);
    if (killed > 0 || strays > 0) {
        char line[200];
        int len = snprintf(line, sizeof line,
                           "[dtrun guard] the agent (pid %d) died: killed %d worker process "
                           "group(s), then %d process(es) by the job's environment\n", (int)agent,
                           killed, strays);
        if (len > 0 && write(STDERR_FILENO, line, (size_t)len) < 0) _exit(1);
    }
    _exit(0);
}

static void guard_send(agent_t *ag, int op, pid_t pgid) {
    if (ag->guard_fd < 0) return;
    guard_msg_t m = {op, (int32_t)pgid};
    ssize_t n;
    do n = write(ag->guard_fd, &m, sizeof m);
    while (n < 0 && errno == EINTR);
    if (n != (ssize_t)sizeof m) {
        DT_LOG_WARN("the guardian process is gone (%s): workers' children may outlive a "
                    "killed agent", n < 0 ? strerror(errno) : "short write");
        close(ag->guard_fd);
        ag->guard_fd = -1;
    }
}

/* Forks the guardian twice removed, so that it is not the agent's child (the agent's
 * children are its workers: `pgrep -P` finds them, the sweep kills the others); its
 * pid comes back on done[] and that pipe reads end-of-file when the guardian exits. */
static void guard_start(agent_t *ag) {
    int p[2], done[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        DT_LOG_WARN("no guardian process (pipe: %s): workers' children may outlive a killed "
                    "agent", strerror(errno));
        return;
    }
    if (pipe2(done, O_CLOEXEC) != 0) {
        DT_LOG_WARN("no guardian process (pipe: %s): workers' children may outlive a killed "
                    "agent", strerror(errno));
        goto out_close_pipe;
    }
    /* Two slots per local rank: a round's groups are forgotten before the next's. */
    int nslots = 2 * ag->nw + 8;
    pid_t agent = getpid();
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t mid = fork();
    if (mid == 0) {
        setsid(); /* out of the agent's group: a Ctrl-C or a kill of that group misses it */
        pid_t g = fork();
        if (g == 0) {
            close(p[1]);
            close(done[0]);
            guardian_main(p[0], done[1], nslots, agent, ag->run_dir);
        }
        int32_t v = (int32_t)g;
        ssize_t w = write(done[1], &v, sizeof v);
        _exit(w == (ssize_t)sizeof v && g > 0 ? 0 : 1);
    }
    int e = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    close(p[0]);
    p[0] = -1;
    close(done[1]);
    int32_t gpid = 0;
    int mid_status = 1;
    if (mid > 0) {
        while (waitpid(mid, &mid_status, 0) < 0 && errno == EINTR) {
        }
        if (read(done[0], &gpid, sizeof gpid) != (ssize_t)sizeof gpid) gpid = 0;
    }
    if (mid < 0 || gpid <= 0) {
        DT_LOG_WARN("no guardian process (fork: %s): workers' children may outlive a killed "
                    "agent", mid < 0 ? strerror(e) : "failed");
        close(done[0]);
        goto out_close_pipe;
    }
    ag->guard_fd = p[1];
    ag->guard_done_fd = done[0];
    ag->guard_pid = gpid;
    return;
out_close_pipe:
    close(p[1]);
    if (p[0] >= 0) close(p[0]);
}

void dt_agent_orphans_init(agent_t *ag) {
    ag->guard_fd = ag->guard_done_fd = -1;
    ag->guard_pid = 0;
    guard_start(ag);
    /* After the guardian is started: made before, it would be re-parented to the agent. */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
        DT_LOG_WARN("cannot make the agent a child subreaper (%s): a worker's child that "
                    "leaves its process group may outlive the job", strerror(errno));
}

void dt_agent_orphans_watch(agent_t *ag, pid_t pgid) { guard_send(ag, GUARD_WATCH, pgid); }

void dt_agent_orphans_reaped(agent_t *ag, worker_t *w) {
    if (w->group_gone || kill(-w->pid, 0) == 0 || errno != ESRCH) return;
    w->group_gone = 1;
    guard_send(ag, GUARD_FORGET, w->pid);
}

void dt_agent_orphans_end(agent_t *ag) {
    if (ag->guard_fd >= 0) {
        guard_send(ag, GUARD_BYE, 0);
        if (ag->guard_fd >= 0) close(ag->guard_fd);
        ag->guard_fd = -1;
    }
    if (ag->guard_done_fd >= 0) {
        /* End-of-file once the guardian has exited: nothing of the job outlives dtrun. */
        char c;
        while (read(ag->guard_done_fd, &c, 1) < 0 && errno == EINTR) {
        }
        close(ag->guard_done_fd);
        ag->guard_done_fd = -1;
    }
    ag->guard_pid = 0;
}

/* ---- the sweep when a round ends ------------------------------------------ */

/* The agent's live children other than the guardian, up to max; returns the count.
 * Reaps the zombies among them as it goes. */
static int list_children(agent_t *ag, pid_t *out, int max) {
    DIR *d = opendir("/proc");
    if (!d) return 0;
    pid_t self = getpid();
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < max) {
        char *end;
        long pid = strtol(de->d_name, &end, 10);
        if (*end || pid <= 0 || pid == ag->guard_pid) continue;
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t len = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (len <= 0) continue;
        buf[len] = '\0';
        /* "pid (comm) state ppid ...": comm may hold spaces and parentheses. */
        char *rp = strrchr(buf, ')');
        char state;
        long ppid;
        if (!rp || sscanf(rp + 1, " %c %ld", &state, &ppid) != 2 || ppid != self) continue;
        if (state == 'Z') {
            waitpid((pid_t)pid, NULL, WNOHANG);
            continue;
        }
        out[n++] = (pid_t)pid;
    }
    closedir(d);
    return n;
}

void dt_agent_orphans_sweep(agent_t *ag) {
    int groups = 0, strays = 0;
    for (int i = 0; i < ag->nw; i++) {
        worker_t *w = &ag->w[i];
        if (w->pid <= 0) continue;
        if (!w->group_gone && kill(-w->pid, SIGKILL) == 0) groups++;
        w->group_gone = 1;
        guard_send(ag, GUARD_FORGET, w->pid);
    }
    pid_t kids[256];
    for (int pass = 0; pass < SWEEP_PASSES; pass++) {
        int n = list_children(ag, kids, (int)(sizeof kids / sizeof *kids));
        if (n == 0) break;
        for (int k = 0; k < n; k++) {
            if (getpgid(kids[k]) == kids[k]) kill(-kids[k], SIGKILL);
            if (kill(kids[k], SIGKILL) == 0 && pass == 0) strays++;
        }
        usleep(SWEEP_PASS_US);
    }
    if (groups > 0 || strays > 0)
        DT_LOG_INFO("killed what the workers left running: %d process group(s), %d other "
                    "process(es)", groups, strays);
}
