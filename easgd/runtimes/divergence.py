"""Divergence: the error a run stops with, its message, and the stability warning.

Every runtime's run (``easgd.run.trainer``) checks before each checkpoint
that the losses and the state are finite and, at each evaluation, that the
evaluated losses are (``easgd.runtimes.training_run.Run.check_finite``,
``check_finite_record``); a failed check raises :class:`DivergenceError` with
a message built here (:func:`divergence_message`), which names what diverged
and, for synchronous EASGD, the quadratic model's stability bound
(``easgd.analysis.stability``).
"""

from __future__ import annotations

from easgd.methods import registry
from easgd.settings.config import TrainConfig


class DivergenceError(RuntimeError):
  """Training produced a non-finite loss or parameters."""


def divergence_message(config: TrainConfig, what: str) -> str:
  """The one-line message of a :class:`DivergenceError`.

  Args:
    config: the run's validated config.
    what: what was found, e.g. "worker 2 had a non-finite loss (nan) at step 7".

  Returns:
    ``"training diverged: <what>; algorithm=..., learning_rate=...[, alpha=...,
    tau=..., num_workers=...; <the stability bound>]; lower the learning rate"``.
  """
  c = config
  msg = (
      f"training diverged: {what}; algorithm={c.algorithm}, "
      f"learning_rate={c.learning_rate}"
      + (
          f" (resolved {c.resolved_learning_rate:g}: lr_scaling {c.lr_scaling!r})"
          if c.lr_scaling != "none"
          else ""
      )
  )
  if "curvature" in registry.TABLE[c.algorithm].reads:  # synchronous EASGD
    msg += f", alpha={c.resolved_alpha:g}, tau={c.tau}, num_workers={c.num_workers}"
    hint = _stability_hint(c)
    if hint:
      msg += f"; {hint}"
  return msg + "; lower the learning rate"


def worker_loss_message(config: TrainConfig, worker: int, local_step: int, value) -> str:
  """The message of a real asynchronous worker's non-finite loss at its local step.

  Args:
    config: the run's validated config (``runtime`` threads or ray).
    worker, local_step, value: the worker, its clock and the loss it reported.

  Returns:
    The one-line message of the :class:`DivergenceError`.
  """
  c = config
  return (
      f"training diverged: worker {worker} had a non-finite loss ({value}) at its "
      f"local step {local_step}; algorithm={c.algorithm}, "
      f"learning_rate={c.learning_rate}, runtime={c.runtime}; lower the learning rate"
  )


class StabilityWarning(UserWarning):
  """The config lies outside the analytic stable region of the quadratic model."""


def stability_warning(config: TrainConfig) -> str | None:
  """A one-line warning when synchronous EASGD is configured outside the region
  where the quadratic model F(x) = h x^2 / 2 is stable, else None (an elastic
  method with alpha = 0, whose center never moves, is refused by
  ``TrainConfig.validate``).

  With ``config.curvature`` (an estimate of the loss's largest Hessian
  eigenvalue h, e.g. from ``easgd.analysis.hessian``) the check is at eta*h =
  the resolved learning rate (``lr_scaling`` applied) * curvature
  (``easgd.analysis.stability.stability_bound_message``);
  without it, only whether ANY eta*h is stable at this alpha, tau and p.

  Args:
    config: a validated config.

  Returns:
    The warning's text, or None.
  """
  spec = registry.TABLE[config.algorithm]
  if spec.family != "elastic":
    return None
  a, tau, p = config.resolved_alpha, config.tau, config.num_workers
  if "curvature" not in spec.reads:  # the analysis is synchronous EASGD's
    return None
  from easgd.analysis import stability

  if config.curvature is not None:
    return stability.stability_bound_message(
        config.resolved_learning_rate * config.curvature, a, tau, p
    )
  if stability.stable_eta_h_interval(a, tau, p) is None:
    return (
        f"EASGD with alpha={a:g} (beta={a * p:g}), tau={tau}, num_workers={p} is "
        "outside the analytic stability region of the quadratic model for every "
        "eta*h in [0, 4] (see easgd.analysis.stability.stability_bound_message)"
    )
  return None


def _stability_hint(config: TrainConfig) -> str | None:
  """For divergence errors: the quadratic model's eta*h bound at this alpha, tau, p."""
  if "curvature" not in registry.TABLE[config.algorithm].reads:  # EASGD's analysis
    return None
  from easgd.analysis import stability

  a, tau, p = config.resolved_alpha, config.tau, config.num_workers
  interval = stability.stable_eta_h_interval(a, tau, p)
  if interval is None:
    return (
        f"the quadratic model is unstable at alpha={a:g}, tau={tau}, "
        f"num_workers={p} for every eta*h in [0, 4]"
    )
  return (
      f"the quadratic model is stable at alpha={a:g}, tau={tau}, num_workers={p} "
      f"only for eta*h < {interval[1]:.4g} (resolved learning rate * largest Hessian "
      f"eigenvalue)"
  )
