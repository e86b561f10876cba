/*
 * meminfo.h - the host memory this process can still get, for the memory check
 * before the first step (runtime/tools/mem_check.h): the agent samples it once per
 * round before it starts the workers (DTRUN_NODE_MEM_AVAILABLE), so that ranks that
 * check at different moments share the same figure rather than each other's arenas.
 * And the CPUs it may use (worker counts, the collectives' oversubscription test).
 */
#ifndef DT_COMMON_MEMINFO_H
#define DT_COMMON_MEMINFO_H

/* The worker environment variable with the agent's sample: "<bytes> <what>". */
#define DT_MEMINFO_NODE_ENV "DTRUN_NODE_MEM_AVAILABLE"

/* Bytes this process can still allocate on the host: MemAvailable, or the room under
 * its cgroup's limits when lower (the inactive file cache counts as free); 0 when
 * unknown. *what names the source ("available on this host (MemAvailable)", ...).
 * DTRUN_TEST_MEM_AVAILABLE=BYTES replaces the figure (tests). */
double dt_meminfo_host_available(const char **what);

/* The CPUs this process may run on: its affinity mask (a SLURM job's or a
 * container's cpuset), not every CPU online; at least 1. */
int dt_meminfo_cpus(void);

#endif /* DT_COMMON_MEMINFO_H */
