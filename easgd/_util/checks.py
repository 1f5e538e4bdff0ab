"""One vocabulary for checking input values (integers, reals, choices, flags, arrays), one message form.

Every check takes the value's name as the user writes it, the value, what is allowed and
the error class to raise, and says ``{name} must be {allowed}, got {value!r}`` or
``unknown {name} {value!r}; allowed: {a}, {b}, ...`` (docs/guides/bad_input.md). Bools are
never numbers here; traced JAX arrays are not checked (:func:`is_python_number`). A
dataclass field declares its allowed values once (:class:`Integer`, :class:`Real`,
:class:`OneOf`, ...), and :func:`check_fields` checks an instance against them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import typing
from typing import Any, Callable, Sequence

import numpy as np

from easgd._util.flags import ALLOWED


def _label(name: str, what: str | None) -> str:
  return f"{name} ({what})" if what else name


def _interval(low, high, open_low: bool, open_high: bool) -> str:
  lo = "(-inf" if low is None else f"{'(' if open_low else '['}{low}"
  hi = "inf)" if high is None else f"{high}{')' if open_high else ']'}"
  return f"{lo}, {hi}"


def is_python_number(value) -> bool:
  """True for a Python or NumPy int or float scalar (not a bool, not an array)."""
  return (
      isinstance(value, (numbers.Real, np.generic))
      and not isinstance(value, (bool, np.bool_))
      and np.ndim(value) == 0
  )


def integer(
    name: str,
    value,
    low: int | None = None,
    high: int | None = None,
    *,
    error: type[Exception] = ValueError,
    what: str | None = None,
) -> int:
  """``value`` as a Python int in [low, high].

  Args:
    name: the value's name as the user writes it (e.g. ``"tau"``).
    value: the value to check.
    low, high: the inclusive bounds (None: unbounded).
    error: the exception class to raise.
    what: a short unit or meaning shown after the name, e.g. "communication period".

  Returns:
    ``int(value)``.

  Raises:
    error: not an integer (bools and floats included), or outside [low, high].
  """
  ok = isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_))
  if ok:
    value = int(value)
    ok = (low is None or value >= low) and (high is None or value <= high)
  if not ok:
    allowed = (
        "an integer"
        if low is None and high is None
        else f"an integer >= {low}"
        if high is None
        else f"an integer in [{low if low is not None else '-inf'}, {high}]"
    )
    raise error(f"{_label(name, what)} must be {allowed}, got {value!r}")
  return value


def real(
    name: str,
    value,
    low: float | None = None,
    high: float | None = None,
    *,
    open_low: bool = False,
    open_high: bool = False,
    error: type[Exception] = ValueError,
    what: str | None = None,
) -> float:
  """``value`` as a finite Python float in the interval from low to high.

  Args:
    name, what, error: as :func:`integer`.
    value: the value to check (an int or float; not a bool).
    low, high: the bounds (None: unbounded); ``open_low``/``open_high`` exclude
      them.

  Returns:
    ``float(value)``.

  Raises:
    error: not a finite real, or outside the interval.
  """
  ok = is_python_number(value)
  if ok:
    try:
      value = float(value)
    except OverflowError:  # an integer too large for a float
      ok = False
  ok = ok and math.isfinite(value)
  if ok:
    if low is not None:
      ok = value > low if open_low else value >= low
    if high is not None:
      ok = ok and (value < high if open_high else value <= high)
  if not ok:
    raise error(
        f"{_label(name, what)} must be a finite real in "
        f"{_interval(low, high, open_low, open_high)}, got {value!r}"
    )
  return value


def choice(name: str, value, allowed: Sequence[Any], *, error: type[Exception] = ValueError):
  """``value`` if it is one of ``allowed``.

  Raises:
    error: ``unknown {name} {value!r}; allowed: ...``.
  """
  try:
    found = value in allowed
  except TypeError:  # an unhashable value
    found = False
  if not found or isinstance(value, bool) and not any(a is value for a in allowed):
    raise error(f"unknown {name} {value!r}; allowed: {', '.join(map(str, allowed))}")
  return value


def flag(name: str, value, *, error: type[Exception] = ValueError) -> bool:
  """``value`` if it is a bool (``True``/``False``, NumPy's included).

  Raises:
    error: anything else (1 and "yes" are not flags).
  """
  if not isinstance(value, (bool, np.bool_)):
    raise error(f"{name} must be a bool (True or False), got {value!r}")
  return bool(value)


def real_array(
    name: str,
    value,
    low: float | None = None,
    high: float | None = None,
    *,
    open_low: bool = False,
    open_high: bool = False,
    error: type[Exception] = ValueError,
) -> np.ndarray:
  """``value`` (a scalar or array-like of reals) as a float64 NumPy array, every
  entry finite and in the interval.

  Raises:
    error: an entry that is not a finite real in the interval (named with its
      index), or a value that is not numeric.
  """
  try:
    arr = np.asarray(value)
  except (TypeError, ValueError):
    raise error(f"{name} must be reals, got {value!r}") from None
  if arr.dtype.kind not in "iuf" or arr.dtype.kind == "b":
    raise error(f"{name} must be reals, got {value!r}")
  arr = arr.astype(np.float64)
  bad = ~np.isfinite(arr)
  if low is not None:
    bad |= (arr <= low) if open_low else (arr < low)
  if high is not None:
    bad |= (arr >= high) if open_high else (arr > high)
  if bad.any():
    index = tuple(int(i) for i in np.argwhere(bad)[0])
    shown = f"{name}[{', '.join(map(str, index))}]" if arr.ndim else name
    raise error(
        f"{shown} must be a finite real in "
        f"{_interval(low, high, open_low, open_high)}, got {arr[bad][0]!r}"
    )
  return arr


def integer_array(
    name: str,
    value,
    low: int | None = None,
    high: int | None = None,
    *,
    error: type[Exception] = ValueError,
) -> np.ndarray:
  """``value`` (a scalar or array-like of integers) as an int64 NumPy array, every
  entry in [low, high] (integral floats such as 2.0 are refused: give integers).

  Raises:
    error: an entry that is not an integer in the range, or a non-integer array.
  """
  arr = np.asarray(value)
  if arr.dtype.kind not in "iu":
    raise error(f"{name} must be integers, got {value!r}")
  arr = arr.astype(np.int64)
  bad = np.zeros(arr.shape, bool)
  if low is not None:
    bad |= arr < low
  if high is not None:
    bad |= arr > high
  if bad.any():
    index = tuple(int(i) for i in np.argwhere(bad)[0])
    shown = f"{name}[{', '.join(map(str, index))}]" if arr.ndim else name
    allowed = (
        f"an integer >= {low}"
        if high is None
        else f"an integer in [{low if low is not None else '-inf'}, {high}]"
    )
    raise error(f"{shown} must be {allowed}, got {int(arr[bad][0])}")
  return arr


# Declared checks: a field's allowed values, declared once with its help text
# (``easgd._util.flags.option(..., allowed=...)``) and checked by
# :func:`check_fields`. A bound given as a string is the value of that field
# of the same instance (declared earlier, so already checked).


def _bound(bound, values):
  return values[bound] if isinstance(bound, str) else bound


@dataclasses.dataclass(frozen=True)
class Integer:
  """An integer in [low, high] (:func:`integer`); ``whole_floats``: 2.0 counts as 2."""

  low: int | str | None = None
  high: int | str | None = None
  what: str | None = None
  whole_floats: bool = False

  def check(self, name: str, value, values: dict, error: type[Exception]) -> None:
    if self.whole_floats and is_python_number(value) and float(value).is_integer():
      value = int(value)
    integer(
        name,
        value,
        _bound(self.low, values),
        _bound(self.high, values),
        error=error,
        what=self.what,
    )


@dataclasses.dataclass(frozen=True)
class Real:
  """A finite real in the interval from low to high (:func:`real`)."""

  low: float | str | None = None
  high: float | str | None = None
  open_low: bool = False
  open_high: bool = False
  what: str | None = None

  def check(self, name: str, value, values: dict, error: type[Exception]) -> None:
    real(
        name,
        value,
        _bound(self.low, values),
        _bound(self.high, values),
        open_low=self.open_low,
        open_high=self.open_high,
        error=error,
        what=self.what,
    )


@dataclasses.dataclass(frozen=True)
class OneOf:
  """One of ``allowed`` (:func:`choice`)."""

  allowed: tuple

  def check(self, name: str, value, values: dict, error: type[Exception]) -> None:
    choice(name, value, self.allowed, error=error)


@dataclasses.dataclass(frozen=True)
class Flag:
  """A bool (:func:`flag`)."""

  def check(self, name: str, value, values: dict, error: type[Exception]) -> None:
    flag(name, value, error=error)


@dataclasses.dataclass(frozen=True)
class Satisfies:
  """A value for which ``test(value)`` is true: ``{name} must be {what}, got {value!r}``."""

  test: Callable[[Any], bool]
  what: str

  def check(self, name: str, value, values: dict, error: type[Exception]) -> None:
    if not self.test(value):
      raise error(f"{name} must be {self.what}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class Entries:
  """A tuple or list (``{name} must be {what}``), optionally one entry per
  worker (its length that of the field ``per_worker``, unless empty) and
  strictly increasing, each entry checked by ``entry`` under the name
  ``label`` (``{name}`` and ``{i}`` filled in)."""

  entry: Any
  what: str
  label: str = "{name} entry"
  per_worker: str | None = None
  increasing: bool = False

  def check(self, name: str, value, values: dict, error: type[Exception]) -> None:
    if not isinstance(value, (tuple, list)):
      raise error(f"{name} must be {self.what}, got {value!r}")
    workers = values[self.per_worker] if self.per_worker else None
    if value and workers is not None and len(value) != workers:
      raise error(
          f"{name} has {len(value)} entries; expected one per worker "
          f"({self.per_worker}={workers})"
      )
    for i, v in enumerate(value):
      self.entry.check(self.label.format(name=name, i=i), v, values, error)
    if self.increasing and list(value) != sorted(set(value)):
      raise error(f"{name} must be strictly increasing, got {tuple(value)}")


@functools.lru_cache(maxsize=None)
def _declared(cls: type) -> tuple[tuple[str, Any, bool], ...]:
  hints = typing.get_type_hints(cls)
  return tuple(
      (f.name, f.metadata[ALLOWED], type(None) in typing.get_args(hints[f.name]))
      for f in dataclasses.fields(cls)
      if ALLOWED in f.metadata
  )


def check_fields(instance, error: type[Exception]) -> None:
  """Checks each field of the dataclass ``instance`` against its declaration
  (``metadata["allowed"]``: :class:`Integer`, :class:`Real`, :class:`OneOf`,
  :class:`Flag`, :class:`Satisfies`, :class:`Entries`), in field order; a
  field annotated ``X | None`` may also be None.

  Raises:
    error: the first field outside its declaration (the message of the
      declaration's check).
  """
  values = {f.name: getattr(instance, f.name) for f in dataclasses.fields(instance)}
  for name, allowed, optional in _declared(type(instance)):
    if not (optional and values[name] is None):
      allowed.check(name, values[name], values, error)
