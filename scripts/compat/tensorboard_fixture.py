#!/usr/bin/env python3
"""Writes tests/fixtures/tensorboard/: event files made by TensorBoard's own writer
(tensorboard.summary.writer.EventFileWriter, the protos of tensorboard.compat), the
reference that tests/test_tfevents.c reads with dtrun's reader.

  python3 scripts/compat/tensorboard_fixture.py [OUT_DIR]   (needs: pip install tensorboard)

Two files, as a run that was restarted writes them:
  1. steps 1..8: scalars train/loss = 1/(step+1), train/lr = 1e-3*step, and at step 1
     a text "config" ('{"train_steps": 8}');
  2. a SessionLog START at step 6 (the restart resumed from step 5), then steps 6..10
     with train/loss = 2/(step+1) and train/lr = 1e-3*step.
TensorBoard shows steps 1..5 from file 1 and 6..10 from file 2; tests/test_tfevents.c
asserts exactly that (and scripts/compat/tensorboard_check.py confirms it with
EventAccumulator).
"""
import os
import sys
import time

from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter


def scalar_event(step, values):
    s = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in values])
    return event_pb2.Event(wall_time=time.time(), step=step, summary=s)


def text_event(step, tag, text):
    meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text"))
    tensor = tensor_pb2.TensorProto(dtype="DT_STRING", string_val=[text.encode()],
                                    tensor_shape=tensor_shape_pb2.TensorShapeProto(
                                        dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)]))
    s = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, metadata=meta, tensor=tensor)])
    return event_pb2.Event(wall_time=time.time(), step=step, summary=s)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/tensorboard"
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        if "tfevents" in f:
            os.remove(os.path.join(out, f))
    w = EventFileWriter(out, filename_suffix=".a")
    w.add_event(text_event(1, "config", '{"train_steps": 8}'))
    for step in range(1, 9):
        w.add_event(scalar_event(step, [("train/loss", 1.0 / (step + 1)), ("train/lr", 1e-3 * step)]))
    w.close()
    time.sleep(1.1)  # the next file's name (its seconds) sorts after the first
    w = EventFileWriter(out, filename_suffix=".b")
    w.add_event(event_pb2.Event(wall_time=time.time(), step=6,
                                session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))
    for step in range(6, 11):
        w.add_event(scalar_event(step, [("train/loss", 2.0 / (step + 1)), ("train/lr", 1e-3 * step)]))
    w.close()
    # the host name and pid in the names say nothing a test needs: fixed names, same order
    files = sorted(f for f in os.listdir(out) if "tfevents" in f)
    for i, f in enumerate(files):
        os.rename(os.path.join(out, f), os.path.join(out, "events.out.tfevents.%010d.fixture.%d" % (1700000000 + i, i)))
    print("wrote", out, sorted(os.listdir(out)))


if __name__ == "__main__":
    main()
