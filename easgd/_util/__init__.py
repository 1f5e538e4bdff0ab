"""Private utilities: one validation vocabulary, atomic files, flags, progress.

Also the one lazy-export mechanism of the package's ``__init__`` files
(:func:`lazy_exports`, PEP 562): ``import easgd`` and ``easgd --help`` import
no module of JAX, Flax, Optax, Orbax or Ray; a name is imported on first use.
"""

from __future__ import annotations

import importlib
import sys
from typing import Callable, Iterable, Mapping


def lazy_exports(
    package: str, modules: Iterable[str], names: Mapping[str, str]
) -> tuple[list[str], Callable, Callable]:
  """The public names of ``package``, imported on first access (PEP 562).

  Args:
    package: the package's ``__name__``, e.g. ``"easgd.core"``.
    modules: its public submodules (namespaces), e.g. ``("algorithms", "elastic")``.
    names: for each module (absolute name, e.g. ``"easgd.core.algorithms"``), the
      names it gives ``package`` (functions, classes, errors, constants), one
      string separated by spaces, as ``collections.namedtuple``'s field names.

  Returns:
    ``(__all__, __getattr__, __dir__)`` for the package's ``__init__``: ``__all__``
    lists the modules, then the names; ``__getattr__`` imports a module or the
    module that holds a name on first access (and keeps the value on the package).

  Raises:
    ValueError: a name is given twice, or a name is also a module's name.
  """
  modules = tuple(modules)
  where: dict[str, str] = {}
  for module, exported in names.items():
    for name in exported.split():
      if name in where or name in modules:
        raise ValueError(f"{package}: '{name}' is exported twice")
      where[name] = module
  public = [*modules, *where]

  def __getattr__(name: str):
    if name in modules:
      return importlib.import_module(f"{package}.{name}")
    if name not in where:
      raise AttributeError(f"module '{package}' has no attribute '{name}'")
    value = getattr(importlib.import_module(where[name]), name)
    setattr(sys.modules[package], name, value)
    return value

  def __dir__() -> list[str]:
    return sorted(set(public) | set(vars(sys.modules[package])))

  return public, __getattr__, __dir__
