"""The training loops' progress display: a bar on a terminal, one line per epoch elsewhere.

:func:`progress_bar` returns a ``tqdm.std.tqdm`` bar when the stream (stderr by
default) is a terminal; otherwise (a file, a pipe, a notebook kernel) an
:class:`EpochLines`, which prints one plain line per finished epoch, e.g.

    easgd p=4: epoch 3/40 step 186/2480 test_acc 0.9105

instead of a bar's carriage returns, which a file collapses into one line.
Both take the same calls: ``update(n)``, ``n``, ``set_postfix(...)``,
``close()``. ``tqdm.std`` (never ``tqdm.auto``): importing ``tqdm.auto`` in a
kernel without ipywidgets warns, and a notebook gets the plain lines.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from tqdm.std import tqdm


class EpochLines:
  """One line per finished epoch, for a stream that is not a terminal.

  An epoch's line is printed when the metrics of its evaluation arrive
  (:meth:`set_postfix`), or, for an epoch without evaluation, at the next
  :meth:`update` or :meth:`close`.

  Args:
    total: the run's steps (num_epochs x steps_per_epoch).
    steps_per_epoch: steps of one epoch (>= 1).
    initial: steps already done (a resumed run).
    desc: the line's prefix, e.g. ``"easgd p=4"``.
    disable: print nothing.
    file: the stream (default: ``sys.stderr`` at the time of printing).
  """

  def __init__(
      self,
      total: int,
      steps_per_epoch: int,
      initial: int = 0,
      desc: str = "",
      disable: bool = False,
      file: TextIO | None = None,
  ):
    self.total, self.steps_per_epoch = int(total), max(int(steps_per_epoch), 1)
    self.n, self.desc, self.disable, self.file = int(initial), desc, disable, file
    self._pending: int | None = None  # an epoch that ended, its line not printed yet

  @property
  def num_epochs(self) -> int:
    """The run's epochs (total / steps_per_epoch, rounded up)."""
    return -(-self.total // self.steps_per_epoch)

  def update(self, n: int = 1) -> None:
    """Counts ``n`` more steps; an epoch ending here awaits its metrics."""
    if n <= 0:
      return
    self._flush()
    before, self.n = self.n, self.n + int(n)
    ends = range(before // self.steps_per_epoch + 1, self.n // self.steps_per_epoch + 1)
    for e in ends[:-1]:  # several epochs in one update: their lines now
      self._print(e, {})
    if ends:
      self._pending = ends[-1]

  def set_postfix(self, refresh: bool = False, **metrics: Any) -> None:
    """Prints the line of the epoch that just ended, with ``metrics``."""
    del refresh  # tqdm's argument; a line is printed once
    if self._pending is not None:
      self._print(self._pending, metrics)
      self._pending = None

  def close(self) -> None:
    """Prints the line of an epoch that ended without metrics."""
    self._flush()

  def _flush(self) -> None:
    if self._pending is not None:
      self._print(self._pending, {})
      self._pending = None

  def _print(self, epoch: int, metrics: dict) -> None:
    if self.disable:
      return
    step = min(epoch * self.steps_per_epoch, self.n)
    parts = [f"epoch {epoch}/{self.num_epochs}", f"step {step}/{self.total}"]
    parts += [f"{k} {v}" for k, v in metrics.items()]
    prefix = f"{self.desc}: " if self.desc else ""
    print(prefix + " ".join(parts), file=self.file or sys.stderr, flush=True)


def progress_bar(
    total: int,
    steps_per_epoch: int,
    *,
    initial: int = 0,
    desc: str = "",
    disable: bool = False,
    file: TextIO | None = None,
) -> tqdm | EpochLines:
  """The progress display of a training loop.

  Args:
    total: the run's steps (the bar's total).
    steps_per_epoch: steps per epoch (the plain lines' epochs).
    initial: steps already done (a resumed run).
    desc: the bar's label, e.g. ``"easgd p=4"``.
    disable: show nothing (``TrainConfig.progress`` off, or not the process
      that reports).
    file: the stream; default ``sys.stderr``.

  Returns:
    A ``tqdm.std.tqdm`` when ``file`` is a terminal (``isatty()``), else an
    :class:`EpochLines`; both take ``update``, ``set_postfix``, ``close``.
  """
  stream = file if file is not None else sys.stderr
  isatty = getattr(stream, "isatty", None)
  if callable(isatty) and isatty():
    return tqdm(total=total, initial=initial, unit="step", desc=desc, disable=disable, file=stream)
  return EpochLines(total, steps_per_epoch, initial=initial, desc=desc, disable=disable, file=file)
