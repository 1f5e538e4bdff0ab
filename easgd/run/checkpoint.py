"""Checkpoints of the whole training state with Orbax, layout-free.

A checkpoint holds the tree ``easgd.runtimes.executor.checkpoint_tree``
declares, as host arrays in a device-independent form: every worker's state
(leaves [num_workers, ...]), the shared state once, the evaluated center, the
global steps done (the data position and the random state) and the runtime's
own entries (``RUNTIME_ENTRIES``). Because nothing in it refers to devices, a
run resumes on another device count or mesh shape with the same number of
workers; an interrupted save (even SIGKILL) never replaces a good checkpoint;
``max_to_keep`` keeps the last k. docs/guides/checkpoints.md.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import jax

from easgd._util.files import interrupts_deferred
from easgd.parallel.placement import to_host

CHECKPOINT_DIR = "checkpoints"


def _quiet_orbax():
  logging.getLogger("absl").setLevel(logging.WARNING)


class CheckpointError(ValueError):
  """A checkpoint is unreadable or does not fit the run."""


class Checkpointer:
  """Saves and restores layout-free training states under ``workdir/checkpoints``.

  Args:
    workdir: the run directory.
    max_to_keep: number of most recent checkpoints kept (>= 1).
  """

  def __init__(self, workdir, max_to_keep: int = 2):
    import orbax.checkpoint as ocp

    _quiet_orbax()
    self._ocp = ocp
    self.directory = Path(workdir).absolute() / CHECKPOINT_DIR
    self.manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
    )

  def latest_step(self) -> int | None:
    """The step of the newest complete checkpoint, or None."""
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    """The global steps of the checkpoints kept, ascending."""
    return list(self.manager.all_steps())

  def save(self, step: int, state: dict[str, Any]) -> None:
    """Writes ``state`` (a pytree of host arrays) as checkpoint ``step``; waits.

    Ctrl-C during the save is held back until it is complete (older
    checkpoints beyond ``max_to_keep`` deleted too), then raised.
    """
    with interrupts_deferred():
      self.manager.save(int(step), args=self._ocp.args.StandardSave(to_host(state)))
      self.manager.wait_until_finished()

  def restore(self, step: int | None = None, target: dict[str, Any] | None = None):
    """Restores checkpoint ``step`` (default: the latest) as host arrays.

    Args:
      step: which checkpoint; None for the latest.
      target: a pytree of the expected structure, shapes and dtypes (e.g. the
        freshly initialised state); None restores raw nested dicts.

    Raises:
      FileNotFoundError: there is no checkpoint.
      CheckpointError: the checkpoint is damaged or does not fit ``target``
        (names the leaf).
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in '{self.directory}'")
    args = self._ocp.args.StandardRestore(None if target is None else to_host(target))
    try:
      restored = to_host(self.manager.restore(step, args=args))
    except Exception as e:  # Orbax raises many types for damaged files
      first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      raise CheckpointError(
          f"checkpoint {step} in '{self.directory}' cannot be "
          f"read ({type(e).__name__}: {first[:200]}); delete it to "
          "fall back to an earlier one"
      ) from None
    if target is None:
      return restored
    target = to_host(target)
    for (path, want), got in zip(
        jax.tree_util.tree_leaves_with_path(target), jax.tree.leaves(restored)
    ):
      if want.shape != got.shape or want.dtype != got.dtype:
        raise CheckpointError(
            f"checkpoint {step} leaf {jax.tree_util.keystr(path)} has shape "
            f"{got.shape} {got.dtype}; the run expects {want.shape} {want.dtype}"
        )
    return restored

  def close(self):
    """Waits for pending saves and releases Orbax's manager."""
    self.manager.close()
