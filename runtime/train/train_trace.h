/*
 * train_trace.h - the trainer's part of the job timeline (log.trace; the recorder is
 * common/trace.h): the recorder started before the first step with this rank's clock
 * offset to rank 0 measured over the world communicator, and at the end (or when a
 * run stops early after its checkpoint) every rank's file, merged by rank 0 into
 * <log.dir>/trace.json (runtime/tools/timeline.h).
 */
#ifndef DT_RUNTIME_TRAIN_TRACE_H
#define DT_RUNTIME_TRAIN_TRACE_H

#include <stdint.h>

#include "common/status.h"
#include "kernels/kernels.h"       /* defines: dt_device_t */
#include "runtime/comm/comm.h"     /* defines: dt_comm_t */
#include "runtime/config/config.h" /* defines: dt_config_t */

/* Ping-pongs of the clock measurement (the one of least round trip is kept). */
#define DT_TRAIN_TRACE_PINGS 8

/* log.trace on: measures this rank's clock against rank 0's (world: NULL on one
 * rank; collective over it: every rank calls) and starts recording, the spans before
 * the first step going to first_step - 1's. Nothing when log.trace is off. */
dt_status_t dt_train_trace_start(const dt_config_t *cfg, dt_comm_t *world, dt_device_t *dev, int64_t first_step);
/* Every rank writes <log_dir>/trace/rank_<r>.json; after a barrier of world, rank 0
 * merges the files into <log_dir>/trace.json and says so. Nothing when off. */
dt_status_t dt_train_trace_finish(const dt_config_t *cfg, const char *log_dir, dt_comm_t *world, int rank,
                                  int world_size);
/* Stops recording (teardown; safe when off). */
void dt_train_trace_stop(void);

/* Cristian's offset of this rank's wall clock to rank 0's over world: DT_TRAIN_TRACE_PINGS
 * ping-pongs with rank 0 (rank 0 answers every other rank in turn), the sample of least
 * round trip kept (*offset_ns: add to this rank's clock; 0 on rank 0). */
dt_status_t dt_train_trace_clock(dt_comm_t *world, dt_device_t *dev, int64_t *offset_ns, int64_t *rtt_ns);

#endif /* DT_RUNTIME_TRAIN_TRACE_H */
