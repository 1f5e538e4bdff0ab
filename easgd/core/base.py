"""The interface every algorithm implements (:class:`Algorithm`), and the building blocks of the steps.

An algorithm is a record of pure functions written for ONE worker, which talk to the
others by collectives over ``axis_name``; its state is split into worker state (one value
per worker) and shared state (identical on every device, updated only from all-reduced
quantities); it declares which step program runs at clock t (:class:`Program`,
``Algorithm.program_at``; docs/guides/architecture.md). The building blocks: the step's key
(:func:`worker_key`), the local optimizer and its reset, the host-side exchange schedule
(:func:`every_tau_steps`) and its communication count (:func:`periodic_communication`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Hashable, Mapping, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import optax

from easgd._util import checks
from easgd.core import elastic
from easgd.core.elastic import WORKER_AXES

Params = Any
WorkerState = Any  # one worker's state (a pytree; ``()`` for one-model methods)
SharedState = Any  # the state all workers share (a pytree with an int32 ``step``)
LossFn = Callable[..., Any]
"""``loss_fn(params, batch, key) -> float32 scalar``: mean loss of one worker's
mini-batch; ``key`` is this worker's key for this step (dropout etc.). A model
with state (BatchNorm statistics) takes and returns it:
``loss_fn(params, batch, key, model_state) -> (loss, new_model_state)``, used
when the algorithm's ``init`` was given a ``model_state``
(``easgd.core.momentum.loss_and_grad``)."""


class InitFn(Protocol):
  """``init(params, model_state=()) -> (worker_state, shared_state)`` for ONE worker.

  ``model_state`` (e.g. a Flax model's ``{"batch_stats": ...}``) is carried by
  every worker (by the shared state for the one-model methods, averaged over
  the workers at each step); with it the loss function takes and returns the
  state (``easgd.core.momentum.loss_and_grad``).
  """

  def __call__(self, params: Params, model_state: Any = ()) -> tuple[WorkerState, SharedState]:
    ...


class StepFn(Protocol):
  """``step(worker, shared, batch, key) -> (worker, shared, loss)``, per worker."""

  def __call__(
      self, worker: WorkerState, shared: SharedState, batch: Any, key: jax.Array
  ) -> tuple[WorkerState, SharedState, jax.Array]:
    ...


class ScheduledStepFn(Protocol):
  """A step that also takes the host's exchange flag (``Algorithm.exchange_at``).

  ``exchange=None`` decides on the device from the clock (``lax.cond``); a
  Python bool fixes the branch when the step is traced (:func:`on_exchange`).
  """

  def __call__(
      self,
      worker: WorkerState,
      shared: SharedState,
      batch: Any,
      key: jax.Array,
      exchange: bool | None = None,
  ) -> tuple[WorkerState, SharedState, jax.Array]:
    ...


class CenterFn(Protocol):
  """``center(shared) -> params``: the model the method evaluates."""

  def __call__(self, shared: SharedState) -> Params:
    ...


class WorkerParamsFn(Protocol):
  """``worker_params(worker, shared) -> params``: one worker's iterate."""

  def __call__(self, worker: WorkerState, shared: SharedState) -> Params:
    ...


class CommunicationFn(Protocol):
  """``communication(num_steps, param_bytes) -> Communication`` per worker."""

  def __call__(self, num_steps: int, param_bytes: int) -> "Communication":
    ...


class ExchangeSchedule(Protocol):
  """``exchange_at(t) -> bool``: whether the step at clock t communicates (an
  int on the host, or the state's int32 counter on the device)."""

  def __call__(self, t: Any) -> Any:
    ...


class Communication(NamedTuple):
  """Communication of one worker, counted over a number of steps.

  An algorithm counts its own exchange across workers; where a worker spans
  several devices, the layout adds the data-parallel average inside it
  (``easgd.parallel.accounting.communication_by_level``: one record per level).

  Attributes:
    all_reduces: number of all-reduces the worker took part in.
    bytes: payload bytes the worker contributed to them (the size of the
      reduced buffers; what a ring all-reduce puts on the wire is
      2 (p - 1) / p times this).
    all_gathers: number of all-gathers the worker took part in (compressed
      exchanges, ``easgd.core.streaming``: XLA has no all-reduce of the
      compressed form).
    gathered_bytes: payload bytes the worker contributed to them (a ring
      all-gather puts (p - 1) times this on the wire per worker).
  """

  all_reduces: int
  bytes: int
  all_gathers: int = 0
  gathered_bytes: int = 0


class Program(NamedTuple):
  """One program of an algorithm: a step and the clocks at which it runs.

  Attributes:
    step: ``step(worker, shared, batch, key) -> (worker, shared, loss)``, per
      worker (:class:`StepFn`); with ``exchange_at`` it also takes the keyword
      ``exchange`` (:class:`ScheduledStepFn`).
    runs_at: ``runs_at(t) -> bool``: whether this program runs the step at
      clock t, a host int or the shared state's int32 counter ``shared.step``
      (traced). Built from Python values only (the clock, K, a Python tau), so
      that a driver can pick the program on the host.
    exchange_at: None, or the host-side schedule of the exchange flag this
      program's step takes (:class:`ExchangeSchedule` on the same clock):
      :meth:`Algorithm.programs` then splits it into the programs with and
      without the exchange.
  """

  step: StepFn | ScheduledStepFn
  runs_at: Callable[[Any], Any]
  exchange_at: ExchangeSchedule | None = None


WARMUP = "warmup"
"""The name of the synchronous warm-up's program (``easgd.core.warmup``)."""


def _every_clock(t) -> bool:
  """``Program.runs_at`` of an algorithm's only phase: every clock."""
  return True


def distinct_events(event_of: Callable[[int], Hashable], num_clocks: int) -> list:
  """The distinct values of ``event_of(t)`` for t = 0 .. num_clocks - 1, in the order of
  their first clock (an algorithm whose step depends on a periodic event of the clock)."""
  events: list = []
  for t in range(num_clocks):
    event = event_of(t)
    if event not in events:
      events.append(event)
  return events


def event_programs(events, event_step: Callable, holds: Callable):
  """``(phases, step)`` of an algorithm whose step is one of a few events of the clock
  (the fragments of ``easgd.core.streaming``, Streaming DiLoCo).

  Args:
    events: the events, hashable (each a program's name).
    event_step: ``event_step(worker, shared, batch, key, event)``.
    holds: ``holds(t, event) -> bool``: whether clock t (a host int or the traced int32
      ``shared.step``) has ``event``; exactly one event holds at each clock.

  Returns:
    ``phases``: ``{event: Program(step of the event, runs_at)}`` (``Algorithm.phases``:
    a driver that knows the clock compiles one program per event, no conditional);
    ``step``: the event decided on the device, ``lax.switch`` over the same steps.
  """
  events = list(events)
  steps = [functools.partial(event_step, event=e) for e in events]
  phases = {e: Program(s, functools.partial(holds, event=e)) for e, s in zip(events, steps)}

  def step(worker, shared, batch, key):
    index = sum(jnp.where(holds(shared.step, event=e), k, 0) for k, e in enumerate(events))
    return jax.lax.switch(index, steps, worker, shared, batch, key)

  return phases, step


def select_program(programs: Mapping[Hashable, Program], t: int) -> Hashable:
  """The name of the one program of ``programs`` that runs at host clock ``t``.

  Args:
    programs: a program table (:meth:`Algorithm.programs`).
    t: the clock, a Python int (steps taken).

  Returns:
    The name whose ``runs_at(t)`` holds.

  Raises:
    ValueError: no program or more than one runs at ``t`` (a table that does
      not cover the clocks once).
  """
  names = [name for name, program in programs.items() if bool(program.runs_at(t))]
  if len(names) != 1:
    raise ValueError(
        f"the programs {list(programs)} must name exactly one program for "
        f"clock {t}, got {names}"
    )
  return names[0]


class Algorithm(NamedTuple):
  """A distributed algorithm written for one worker.

  Attributes:
    name: short name, e.g. ``"easgd"``.
    init: ``init(params) -> (worker_state, shared_state)`` for ONE worker from
      the common initial parameters (every worker gets the same values).
    step: ``step(worker_state, shared_state, batch, key) -> (worker_state,
      shared_state, loss)``, per worker, inside a mapping that binds the
      algorithm's axis name. ``key`` is the run's base key (the same for all);
      the step derives the worker's own key from it. ``loss`` is the worker's
      mini-batch loss at its parameters before the step (float32 scalar).
    center: ``center(shared_state) -> params``, the model the method evaluates.
    worker_params: ``worker_params(worker_state, shared_state) -> params``.
    communication: ``communication(num_steps, param_bytes) -> Communication``,
      the per-worker count over the first ``num_steps`` steps: what the
      method sends (for a simulated asynchronous method, what a real
      asynchronous run sends: one exchange per tau local steps per worker),
      the count that compares methods.
    hyperparameters: resolved hyperparameters, for logs.
    shared_model: True when the worker state is empty and every worker
      computes on the one model of the shared state (pmean SGD, the
      sequential methods): ``easgd.parallel.mapping.map_step`` then runs the workers of
      a device as one batch (one forward and backward pass over their
      examples), which equals the per-worker steps averaged.
    exchange_at: ``None``, or for synchronous algorithms that communicate only
      on some steps (EASGD, EAMSGD, local SGD, DiLoCo) the host-side schedule
      ``exchange_at(t: int) -> bool``: whether the step at clock t communicates.
      Such a ``step`` also takes a keyword ``exchange``: ``None`` (default)
      decides on the device from the clock (``lax.cond``); a Python bool, which
      must equal ``exchange_at(t)``, compiles the step with or without the
      communication and no conditional. :meth:`programs` turns it into two
      programs (``False``, ``True``) picked per step on the host;
      ``easgd.parallel.mapping.map_step`` also evaluates their ``runs_at`` on
      the shared state's int32 counter ``shared.step`` (so such algorithms
      keep one) to check the host's clock on the device.
    async_rules: ``None``, or for the asynchronous methods (async EASGD and
      EAMSGD, the DOWNPOUR family) their ``easgd.asynchrony.simulator.AsyncRules``: the
      pure worker-local computation, master rule and finishing rule that
      ``step`` simulates in SPMD code, exposed so that the explicit-order
      replay (``easgd.asynchrony.log.replay``) and the real runtimes (threads,
      Ray) run exactly these functions.
    phases: ``None`` (one phase: ``step`` at every clock, its exchange
      scheduled by ``exchange_at``), or for an algorithm whose step changes
      with the clock (the synchronous warm-up, ``easgd.core.warmup``) its
      phases by name, each a :class:`Program` whose ``runs_at`` names its
      clocks (exactly one phase per clock). ``step`` still runs every clock
      (deciding the phase on the device); a driver that knows the clock runs
      :meth:`programs` instead, so no gradient sits inside a branch.
    program_communication: ``None`` (the compiled programs send what
      ``communication`` counts), or what the compiled programs send where it
      differs from ``communication``: a simulation of asynchrony in one
      program (``easgd.asynchrony.simulator.simulate``) gathers every
      worker's message every slot. Same signature and units as
      ``communication``; read through :meth:`wire_communication`.

  Programs: :meth:`programs` is the table drivers compile, one program per
  name, and :meth:`program_at` names the one to run at clock t. A program's
  name is the exchange flag the host fixed in it (``False``: the step
  without its communication, ``True``: with it, both without a conditional),
  ``None`` when nothing is fixed (the step decides on the device, or has
  nothing to decide), or the name of a phase without a schedule
  (:data:`WARMUP`). To add an algorithm with phases, declare ``phases``;
  ``easgd.parallel.mapping.map_step`` and ``easgd.sweeps.curves`` read
  nothing else.
  """

  name: str
  init: InitFn
  step: StepFn | ScheduledStepFn
  center: CenterFn
  worker_params: WorkerParamsFn
  communication: CommunicationFn
  hyperparameters: dict
  exchange_at: ExchangeSchedule | None = None
  shared_model: bool = False
  async_rules: Any = None
  phases: Mapping[Hashable, Program] | None = None
  program_communication: CommunicationFn | None = None

  def wire_communication(self, num_steps: int, param_bytes: int) -> Communication:
    """What the compiled programs send per worker over the first ``num_steps`` steps.

    ``program_communication`` where the algorithm declares one (a simulated
    asynchronous method), else ``communication``; same arguments and units
    (``param_bytes``: one copy of the parameters in
    ``easgd.core.elastic.reduction_dtype``, ``elastic.reduced_bytes``). The
    time model of a run across processes counts this
    (``easgd.run.predict.clock_communication``).
    """
    count = self.program_communication or self.communication
    return count(num_steps, param_bytes)

  def programs(self, exchange_on_host: bool = True) -> dict[Hashable, Program]:
    """The algorithm's programs by name: what a driver that knows the clock compiles.

    Each phase (``phases``, or the one phase ``step`` with ``exchange_at``)
    gives one program, or, with ``exchange_on_host`` and a schedule, two:
    ``False`` and ``True``, the phase's step with ``exchange`` fixed (no
    conditional, no all-reduce in the local one), each running where the
    phase runs and the schedule says so. Names: see the class docstring.

    Args:
      exchange_on_host: fix the exchange flag on the host (the trainer's
        mapping); False: leave it to the device, one program per phase (the
        curve engine, whose configurations may trace tau).

    Returns:
      ``{name: Program}``; the programs' ``exchange_at`` is None where the
      flag was fixed. A plain algorithm: ``{None: step}``, or with a schedule
      ``{False: ..., True: ...}``; a warm-up adds :data:`WARMUP`.
    """
    phases = self.phases
    if phases is None:
      phases = {None: Program(self.step, _every_clock, self.exchange_at)}
    table = {}
    for name, phase in phases.items():
      if not exchange_on_host or phase.exchange_at is None:
        table[name] = phase
        continue
      for flag in (False, True):
        table[flag if name is None else (name, flag)] = Program(
            functools.partial(phase.step, exchange=flag),
            _fixed_flag(phase.runs_at, phase.exchange_at, flag),
        )
    return table

  def program_at(self, t: int, exchange_on_host: bool = True) -> Hashable:
    """The name of the program of :meth:`programs` that runs at host clock ``t``.

    Raises:
      ValueError: the table does not name exactly one program for ``t``.
    """
    return select_program(self.programs(exchange_on_host), t)


def _fixed_flag(runs_at, exchange_at, flag: bool):
  """``runs_at`` of a phase's program with the exchange fixed to ``flag``."""
  return lambda t: runs_at(t) & (exchange_at(t) == flag)


def worker_key(key: jax.Array, step, axis_name=WORKER_AXES) -> jax.Array:
  """This worker's key at ``step``: fold_in(fold_in(key, step), worker index).

  Args:
    key: the run's base PRNG key (the same on every worker).
    step: int32 scalar clock (may be traced).
    axis_name: the mapped axis enumerating all workers; must be bound by the
      enclosing mapping.

  Returns:
    A PRNG key of the type of ``key``, distinct per (step, worker).

  Raises:
    easgd.core.elastic.MappingError: ``axis_name`` is not bound.
  """
  return jax.random.fold_in(jax.random.fold_in(key, step), elastic.worker_index(axis_name))


def local_optimizer(
    optimizer: optax.GradientTransformation | None, learning_rate
) -> optax.GradientTransformation:
  """The local optimizer a factory uses: ``optimizer``, else ``optax.sgd(learning_rate)``.

  ``learning_rate`` may be a JAX array (not checked, may be traced) or an
  optax schedule, as ``optax.sgd`` takes.

  Raises:
    TypeError: ``optimizer`` is not an ``optax.GradientTransformation``.
    HyperparameterError: neither is given, or ``learning_rate`` (a Python
      number) is not a finite real > 0.
  """
  if optimizer is not None:
    if not isinstance(optimizer, optax.GradientTransformation):
      raise TypeError(
          f"optimizer must be an optax.GradientTransformation, " f"got {type(optimizer).__name__}"
      )
    return optimizer
  if learning_rate is None:
    raise elastic.HyperparameterError(
        "give an optimizer (optax.GradientTransformation) or a learning_rate " "for plain SGD"
    )
  if not elastic.is_array_hyperparameter(learning_rate):  # arrays: unchecked
    learning_rate = checks.real(
        "learning_rate", learning_rate, 0, open_low=True, error=elastic.HyperparameterError
    )
  return optax.sgd(learning_rate)


def reset_optimizer_state(
    optimizer: optax.GradientTransformation, opt_state, params: Params, reset
):
  """``optimizer.init(params)`` where ``reset`` is True, else ``opt_state``.

  Every part of the state is re-initialised (moments, Adam's bias-correction
  count, momentum traces) except ``optax.ScaleByScheduleState`` nodes, so that
  a learning-rate schedule keeps its position in the run.

  Args:
    optimizer: the local optimizer.
    opt_state: its current state.
    params: the parameters to initialise from (shapes and dtypes only, for
      the optimizers in Optax).
    reset: bool scalar (may be traced or batched).

  Returns:
    A state of the structure of ``opt_state``.
  """
  is_schedule = lambda node: isinstance(node, optax.ScaleByScheduleState)
  fresh = jax.tree.map(
      lambda new, old: old if is_schedule(new) else new,
      optimizer.init(params),
      opt_state,
      is_leaf=is_schedule,
  )
  return jax.tree.map(
      lambda new, old: jnp.where(reset, new, old).astype(old.dtype), fresh, opt_state
  )


def elastic_step_setup(
    optimizer: optax.GradientTransformation,
    params: Params,
    opt_state,
    step,
    key: jax.Array,
    tau,
    reset_opt_state: bool,
    axis_name,
    exchange: bool | None = None,
):
  """The start of an elastic worker step (EASGD, EAMSGD).

  Args:
    optimizer: the local optimizer; params: this worker's parameters x^i;
    opt_state: its optimizer state; step: the int32 worker clock t^i;
    key: the run's base key; tau: communication period (>= 1, an int or an
    int32 array);
    reset_opt_state: re-initialise ``opt_state`` on exchange steps (Python bool);
    axis_name: the mapped axis enumerating all workers;
    exchange: ``None`` to compute the flag from the clock, or the host's
      Python bool for this step (see ``Algorithm.exchange_at``).

  Returns:
    ``(worker_key, exchange, opt_state)``: this worker's key for this step, the
    flag "tau divides t^i" (Algorithms 1-2; a bool array, or the given Python
    bool), and the optimizer state to use.
  """
  check_exchange_flag(exchange)
  key = worker_key(key, step, axis_name)
  if exchange is None:
    exchange = elastic.is_exchange_step(step, tau)
  if reset_opt_state and exchange is not False:
    opt_state = reset_optimizer_state(optimizer, opt_state, params, exchange)
  return key, exchange, opt_state


def every_tau_steps(
    tau: int, offset: int = 0, last_step: int | None = None
) -> Callable[[int], bool]:
  """The host-side schedule ``t -> (t + offset) % tau == 0`` (``Algorithm.exchange_at``).

  EASGD and EAMSGD exchange at t = 0, tau, 2 tau, ... (offset 0, Algorithm 1);
  local SGD and DiLoCo average after steps tau - 1, 2 tau - 1, ... (offset 1)
  and, given ``last_step``, also at the run's last step, so that the run ends
  on an average.

  Args:
    tau: communication period in steps, an integer >= 1, or an int32 JAX
      array (unchecked; the schedule is then for the device only, its value
      at a host int is an array).
    offset: 0 or 1 (see above).
    last_step: the clock of the run's last step (steps - 1), which then
      exchanges too; None: the schedule is periodic only.

  Returns:
    ``exchange_at(t) -> bool`` for the step at clock t (steps taken); given an
    int32 array (the state's counter, traced) it returns a bool array, which
    the steps use to decide the exchange on the device and
    ``easgd.parallel.mapping.map_step`` to check the host's clock there.

  Raises:
    HyperparameterError: tau is not an integer >= 1, offset not 0 or 1, or
      last_step not an integer >= 0.

  References:
    Algorithm 1 of the paper ("if tau divides t^i").
  """
  tau = elastic.check_tau(tau, allow_array=True)
  checks.integer("offset", offset, 0, 1, error=elastic.HyperparameterError)
  if last_step is None:
    return lambda t: (t + offset) % tau == 0
  last_step = checks.integer(
      "last_step",
      last_step,
      0,
      error=elastic.HyperparameterError,
      what="the clock of the run's last step",
  )
  return lambda t: ((t + offset) % tau == 0) | (t == last_step)


def periodic_communication(
    tau: int, offset: int = 0, *, num_workers: int, last_step: int | None = None
) -> Callable[[int, int], Communication]:
  """``Algorithm.communication`` of an algorithm with schedule
  ``every_tau_steps(tau, offset, last_step)``.

  One parameter-sized all-reduce on each step t < num_steps the schedule names:
  ceil(num_steps / tau) exchanges for offset 0 (t = 0 included),
  floor(num_steps / tau) for offset 1, plus the last step's when it is not
  periodic. A single worker has nothing to reduce: 0.

  Args:
    tau: communication period in steps, an integer >= 1; or a JAX array,
      with which nothing can be counted on the host (the function returned
      raises a TypeError when called).
    offset: 0 or 1, as in :func:`every_tau_steps`.
    num_workers: p; with p = 1 nothing is communicated.
    last_step: as in :func:`every_tau_steps`.

  Returns:
    ``communication(num_steps, param_bytes) -> Communication`` per worker
    (bytes = exchanges * param_bytes).
  """
  if elastic.is_array_hyperparameter(tau):

    def not_counted(num_steps, param_bytes):
      raise TypeError(
          "communication is counted on the host from a Python tau; this "
          "algorithm was built with an array tau (count with the "
          "configuration's Python value)"
      )

    return not_counted

  def communication(num_steps, param_bytes):
    n = int(num_steps)
    if num_workers == 1 or n <= 0:
      return Communication(0, 0)
    exchanges = (n - 1 + offset) // tau - (offset - 1) // tau
    if last_step is not None and n > last_step and (last_step + offset) % tau:
      exchanges += 1
    return Communication(exchanges, exchanges * int(param_bytes))

  return communication


def check_exchange_flag(exchange) -> None:
  """``exchange`` of a step: None (decided on the device) or a Python bool.

  Raises:
    TypeError: anything else (a traced flag belongs to ``exchange=None``).
  """
  if exchange is not None and not isinstance(exchange, bool):
    raise TypeError(
        f"exchange must be None or a Python bool (the host's schedule, "
        f"Algorithm.exchange_at), got {exchange!r}"
    )
