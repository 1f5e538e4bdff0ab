"""Input checks of the analysis modules: one-line errors that name the value.

NumPy only. Each check returns the value in a canonical form (a Python int or
float, a float64 or int64 array) or raises ``error`` (default ``ValueError``)
with a message ``"<name> must be <allowed>, got <value>"``. Used by
``easgd.stability``, ``easgd.quadratic`` and the sweep modules (which pass
their own error class); the training side checks its settings in
``easgd.config``.
"""

from __future__ import annotations

import numbers

import numpy as np


def first_bad(arr: np.ndarray, bad: np.ndarray):
  """The first element of ``arr`` where the bool array ``bad`` holds (for messages)."""
  idx = np.argwhere(bad)[0]
  return arr[tuple(idx)] if arr.ndim else arr[()]


def real_array(name: str, value, *, minimum: float | None = None,
               strictly: bool = False) -> np.ndarray:
  """float64 array of finite reals (>= or, if ``strictly``, > ``minimum``).

  Raises:
    ValueError: a non-numeric value, or an element that is not finite or out
      of range (the first one is named).
  """
  try:
    raw = np.asarray(value)
    if raw.dtype.kind not in "iuf":
      raise TypeError
    arr = raw.astype(np.float64)
  except (TypeError, ValueError):
    raise ValueError(
        f"{name} must be a finite real or an array of finite reals, "
        f"got {value!r}") from None
  bad = ~np.isfinite(arr)
  if minimum is not None:
    bad |= (arr <= minimum) if strictly else (arr < minimum)
  if np.any(bad):
    allowed = ("a finite real" if minimum is None else
               f"a finite real {'>' if strictly else '>='} {minimum:g}")
    raise ValueError(f"{name} must be {allowed}, got {first_bad(arr, bad)!r}")
  return arr


def int_array(name: str, value, minimum: int = 1) -> np.ndarray:
  """int64 array of integers >= ``minimum`` (no bools, no floats).

  Raises:
    ValueError: a non-integer dtype, or an element below ``minimum``.
  """
  raw = np.asarray(value)
  if raw.dtype.kind not in "iu":
    raise ValueError(f"{name} must be an integer >= {minimum} (or an integer "
                     f"array), got {value!r}")
  arr = raw.astype(np.int64)
  bad = arr < minimum
  if np.any(bad):
    raise ValueError(
        f"{name} must be an integer >= {minimum}, got {first_bad(arr, bad)!r}")
  return arr


def int_scalar(name: str, value, minimum: int = 1, *,
               error: type[Exception] = ValueError) -> int:
  """``int(value)`` for an integer >= ``minimum`` (not a bool).

  Raises:
    error: anything else.
  """
  if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
      or value < minimum):
    raise error(f"{name} must be an integer >= {minimum}, got {value!r}")
  return int(value)


def real_scalar(name: str, value, *, minimum: float | None = None,
                strictly: bool = False) -> float:
  """``float(value)`` for a finite real scalar (>= or > ``minimum``); a 0-d
  array counts as a scalar.

  Raises:
    ValueError: not a real scalar, not finite, or out of range.
  """
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    if not (isinstance(value, np.ndarray) and value.ndim == 0):
      raise ValueError(f"{name} must be a finite real scalar, got {value!r}")
  return float(real_array(name, value, minimum=minimum, strictly=strictly))
