"""The running averages of ASGD and ADOWNPOUR / MVASGD and MVADOWNPOUR.

z_{t+1} = (1 - a_{t+1}) z_t + a_{t+1} x_t with a_{t+1} = 1/(t+1) (Polyak
averaging) or a constant rate (the paper's moving average, 0.001).

References:
  B. T. Polyak, A. B. Juditsky. Acceleration of stochastic approximation by
  averaging. SIAM J. Control Optim. 1992 (ASGD).
"""

from __future__ import annotations

from typing import Any

import jax

from easgd._util import checks
from easgd.core import elastic

Params = Any


def check_average_rate(rate) -> float | jax.Array:
  """Checks a constant moving-average rate a in (0, 1]; returns it as a float
  (a JAX array is returned unchecked, ``easgd.core.elastic.is_array_hyperparameter``).

  Raises:
    HyperparameterError: rate not a real in (0, 1].
  """
  if elastic.is_array_hyperparameter(rate):
    return rate
  return checks.real("average_rate", rate, 0, 1, open_low=True, error=elastic.HyperparameterError)


def _average(z: Params, x: Params, rate) -> Params:
  """(1 - a) z + a x, leaf by leaf, in each leaf's dtype.

  ``rate`` is a Python float (the constant rate, weakly typed: it takes the
  leaf's dtype), a JAX array, or a function ``dtype -> scalar`` giving a in that dtype
  (:func:`_polyak_rate`), so a and 1 - a are computed in the dtype of the
  leaf they multiply (float64 parameters get float64 weights).
  """

  def leaf(zz, xx):
    a = rate(zz.dtype) if callable(rate) else rate
    return ((1 - a) * zz + a * xx).astype(zz.dtype)

  return jax.tree.map(leaf, z, x)


def _polyak_rate(clock):
  """a_{t+1} = 1 / (t + 1), t the clock before the update, as ``dtype -> a``."""
  return lambda dtype: 1 / (clock + 1).astype(dtype)
