"""Export: the center of a run as a plain Flax parameter file (``easgd export``)."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from easgd._util.files import check_interrupt, json_text, write_bytes_atomic, write_text_atomic
from easgd.run import checkpoint
from easgd.run.rundir import check_task_record, ensure_writable_dir, saved_config
from easgd.runtimes.training_run import Run, with_validation
from easgd.settings import builtin_tasks
from easgd.settings.config import ConfigError
from easgd.tasks.task import Task, fingerprint


def export_center(workdir, out_path, *, task: Task | None = None) -> Path:
  """Writes the center of the latest checkpoint as a plain Flax parameter file.

  The file is ``flax.serialization.msgpack_serialize`` of the parameter tree
  (load it with ``flax.serialization.msgpack_restore`` and pass it to
  ``model.apply({"params": params}, x)``); ``<out_path>.json`` beside it names
  the task (its name, factory and arguments, and its ``info``: for the
  built-in tasks the model, the data set, the number of classes and the input
  shape), the step, the algorithm and the dtypes (parameters, computation,
  and the center's, float32 for bfloat16 workers).

  Tasks with a ``center_state`` (BatchNorm, e.g. ``"cnn_bn"``): the center's
  state is recomputed exactly as the evaluation does (``Run.center_batch_stats``,
  the run's ``bn_stats_examples``) and written to
  ``<out_path>.batch_stats.msgpack`` (named in the ``.json`` under
  ``"batch_stats"``); apply the model as ``model.apply({"params": params,
  "batch_stats": stats}, x, train=False)``.

  Every file is replaced atomically (``easgd._util.files``).

  Args:
    workdir: the run directory (``easgd.run.rundir``).
    out_path: the parameter file to write, e.g. ``center.msgpack`` (its
      directory is created).
    task: the run's task when it was built in code (None: the one its
      ``config.json`` names, rebuilt).

  Returns:
    ``Path(out_path)``.

  Raises:
    ConfigError: no run or no checkpoint in ``workdir``, ``out_path`` is a
      directory, or its directory cannot be written; a task that differs from
      the one the run recorded (``easgd.run.rundir.check_task_record``:
      parameter shapes, data sizes, a digest of the data), before anything is
      written.
    easgd.run.checkpoint.CheckpointError: the latest checkpoint is unreadable.
    easgd.tasks.task.TaskError: the task does not build.
  """
  from flax import serialization

  config = saved_config(workdir)
  task = builtin_tasks.task_of(config, task)
  check_task_record(
      workdir, fingerprint(with_validation(task, config.validation_examples)), "export"
  )
  out_path = Path(out_path)
  if out_path.is_dir():
    raise ConfigError(
        f"--out '{out_path}' is a directory; give a file name, e.g. "
        f"'{out_path / 'center.msgpack'}'"
    )
  check_interrupt()  # a signal whose exception was swallowed: nothing written
  ensure_writable_dir(out_path.parent)
  ckpt = checkpoint.Checkpointer(workdir)
  try:
    step = ckpt.latest_step()
    if step is None:
      raise ConfigError(f"workdir '{workdir}' has no checkpoint to export")
    center = ckpt.restore(step)["center"]
  finally:
    ckpt.close()

  def write_msgpack(path, tree):
    write_bytes_atomic(path, serialization.msgpack_serialize(jax.tree.map(np.asarray, tree)))

  check_interrupt()
  write_msgpack(out_path, center)
  info = dict(
      **task.info,
      task=dict(name=task.name, factory=task.factory, factory_args=task.factory_args),
      step=int(step),
      algorithm=config.algorithm,
      # the center is kept in float32 for bfloat16 workers (the precision policy)
      param_dtype=config.param_dtype,
      compute_dtype=config.compute_dtype,
      center_dtype=sorted({str(np.asarray(x).dtype) for x in jax.tree.leaves(center)}),
  )
  if task.center_state is not None:
    # BatchNorm: the center's own statistics, as the evaluation computes them (on
    # the run's layout when this machine has its devices).
    if config.num_devices is not None and config.num_devices > jax.device_count():
      config = config.replace(num_devices=None)
    run = Run(config, task)
    stats_path = Path(str(out_path) + ".batch_stats.msgpack")
    write_msgpack(stats_path, run.center_batch_stats(center))
    info.update(
        batch_stats=stats_path.name,  # and the number of examples used
        bn_stats_examples=int(np.prod(jax.tree.leaves(run.bn_stats_data)[0].shape[:3])),
    )
  write_text_atomic(Path(str(out_path) + ".json"), json_text(info, indent=2) + "\n")
  return out_path
