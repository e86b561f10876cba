/*
 * agent.h - the per-node agent: hosts the store (node 0), joins the rendezvous,
 * spawns one worker per local rank with torchrun's environment, forwards their
 * output line by line, forwards signals, watches the group, restarts it on failure
 * and prints torchrun's failure summary.
 *
 * Workers are started (spawn.c) with fork + execve by the agent itself rather than with
 * uv_spawn: the child must call prctl(PR_SET_PDEATHSIG, SIGKILL) and check that
 * its parent is still the agent between fork and exec, which uv_spawn cannot do,
 * and doing it here avoids exec'ing a trampoline (one more exec per worker). libuv
 * still runs everything else: the output pipes, the signals (SIGCHLD included),
 * the timers. Only async-signal-safe calls run in the child. Each worker leads its
 * own process group, so a forwarded signal reaches the worker's own children too
 * and a Ctrl-C on the terminal reaches only the agent, which decides. Nothing a
 * worker started outlives the job (orphans.c): its group is killed when the round
 * ends, the agent is a child subreaper, and a guardian process cleans up after an
 * agent that was SIGKILLed.
 */
#ifndef DT_RUNTIME_AGENT_H
#define DT_RUNTIME_AGENT_H

#include "runtime/launch/launch_args.h"

/* Runs the launch described by spec; the workers run argv[0] (a path, or a name
 * looked up in PATH) with argv. Returns the process exit code (docs/interface.md:
 * 0, 1 job failed, 2 usage, 3 rendezvous/network, 128+N ended by signal N). */
int dt_agent_run(const dt_launch_spec_t *spec, char **argv, int argc);

/* Finds a program like execvp does; *path is malloc'ed. DT_STATUS_NOT_FOUND names it. */
dt_status_t dt_agent_find_program(const char *name, char **path);

#endif /* DT_RUNTIME_AGENT_H */
