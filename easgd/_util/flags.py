"""Command-line flags from a frozen dataclass: one ``--field-name`` per field (argparse only).

Fields declared with :func:`option` become flags with :func:`add_flags`, typed by their
annotations (int/float/str; bool as ``--x``/``--no-x``; ``X | None`` with ``none``;
tuples comma-separated); every flag defaults to ``argparse.SUPPRESS``, so
:func:`overrides` returns only the flags given.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import types
import typing
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

HELP = "help"
"""``dataclasses.field`` metadata key of a field's help text."""
CHOICES = "choices"
"""``dataclasses.field`` metadata key of a field's allowed values (argparse's ``choices``)."""
ALLOWED = "allowed"
"""``dataclasses.field`` metadata key of a field's declared check (an object
with ``check(name, value, values, error)``, e.g. ``easgd._util.checks.Integer``),
run by ``easgd._util.checks.check_fields``."""


REQUIRED = dataclasses.MISSING
"""``option(REQUIRED, help)``: a field without a default (the caller gives it)."""


def option(
    default: Any,
    help: str,
    *,
    choices: Sequence[Any] | None = None,
    factory: Callable[[], Any] | None = None,
    allowed: Any = None,
) -> Any:
  """A dataclass field with a default, its help text, optional choices and its
  declared check.

  Args:
    default: the field's default (immutable: tuples, not lists), or
      :data:`REQUIRED` for a field without one.
    help: one line for ``--help`` and the guides' tables: what the value is
      and its unit.
    choices: the allowed values, or None.
    factory: instead of ``default`` (then pass ``REQUIRED``), a function
      called for each instance's default (e.g. ``dict``).
    allowed: the values the field allows, declared once
      (``easgd._util.checks.Integer(1, 1024, what="pixels")``, ``Real``,
      ``OneOf``, ``Flag``, ``Satisfies``, ``Entries``), checked by
      ``easgd._util.checks.check_fields``; None: no declared check. Unlike
      ``choices`` it gives the flag no argparse ``choices`` (the config's own
      validation words the message).

  Returns:
    ``dataclasses.field(default=default, metadata={"help": ..., ["choices": ...],
    ["allowed": ...]})`` (``default_factory=factory`` with a factory).

  Raises:
    TypeError: both ``default`` and ``factory`` given.
  """
  metadata = {HELP: help}
  if choices is not None:
    metadata[CHOICES] = tuple(choices)
  if allowed is not None:
    metadata[ALLOWED] = allowed
  if factory is not None:
    if default is not REQUIRED:
      raise TypeError("option: give a default or a factory, not both")
    return dataclasses.field(default_factory=factory, metadata=metadata)
  return dataclasses.field(default=default, metadata=metadata)


def list_parser(element: type) -> Callable[[str], tuple]:
  """The argparse ``type`` of a comma-separated list of ``element``.

  ``""`` (or blanks) is the empty tuple; an empty entry (``"1,,2"``, a
  trailing comma) is refused rather than dropped, so the count typed is the
  count read.

  Raises:
    argparse.ArgumentTypeError: an empty entry (argparse shows it as
      ``argument --x: ...``); ValueError from ``element`` on a bad entry.
  """

  def parse(text: str) -> tuple:
    if not text.strip():
      return ()
    items = [t.strip() for t in text.split(",")]
    if not all(items):
      raise argparse.ArgumentTypeError(
          f"empty entry in {text!r}; give values separated by single commas"
      )
    return tuple(element(t) for t in items)

  parse.__name__ = f"{element.__name__}_list"
  return parse


def _optional_parser(parse: Callable[[str], Any]) -> Callable[[str], Any]:
  def parse_optional(text: str):
    return None if text.strip().lower() == "none" else parse(text)

  parse_optional.__name__ = getattr(parse, "__name__", "value")
  return parse_optional


def flag_type(hint: Any) -> Callable[[str], Any] | None:
  """The argparse ``type`` of a field annotated ``hint`` (None for bool).

  Raises:
    TypeError: an annotation this module does not turn into a flag (a union
      other than ``X | None``, ``bool | None``, a tuple that is not
      ``tuple[X, ...]``, a type other than int, float, str, bool).
  """
  args = typing.get_args(hint)
  if typing.get_origin(hint) in (typing.Union, types.UnionType):
    rest = [a for a in args if a is not type(None)]
    if len(rest) != 1 or len(args) != 2 or rest[0] is bool:
      raise TypeError(
          f"cannot make a flag of the annotation {hint!r} "
          "(unions other than 'X | None', or 'bool | None')"
      )
    return _optional_parser(flag_type(rest[0]))
  if typing.get_origin(hint) is tuple:
    if len(args) != 2 or args[1] is not Ellipsis or args[0] not in (int, float, str):
      raise TypeError(
          f"cannot make a flag of the annotation {hint!r} "
          "(tuples must be tuple[int | float | str, ...])"
      )
    return list_parser(args[0])
  if hint is bool:
    return None
  if hint in (int, float, str):
    return hint
  raise TypeError(f"cannot make a flag of the annotation {hint!r}")


def _shown(value: Any) -> str:
  if value is None:
    return "none"
  if isinstance(value, tuple):
    return ",".join(_shown(v) for v in value) if value else '""'
  if isinstance(value, float):
    return format(value, "g")
  return str(value)


def field_default(field: dataclasses.Field) -> Any:
  """A dataclass field's default (its factory called), or ``dataclasses.MISSING``."""
  if field.default is not dataclasses.MISSING:
    return field.default
  if field.default_factory is not dataclasses.MISSING:
    return field.default_factory()
  return dataclasses.MISSING


def add_flags(
    parser: argparse.ArgumentParser,
    cls: type,
    *,
    title: str | None = None,
    exclude: Iterable[str] = (),
) -> argparse._ArgumentGroup:
  """Adds one flag per field of the dataclass ``cls`` to ``parser``.

  ``--field-name`` (underscores become dashes), ``dest`` the field name,
  ``metavar`` the name in capitals, help ``metadata["help"]`` plus the default,
  choices ``metadata["choices"]``, ``default=argparse.SUPPRESS``; the type from
  the annotation:

    int, float, str      ``--x 3`` (argparse's ``int``/``float``/``str``)
    bool                 ``--x`` / ``--no-x`` (``argparse.BooleanOptionalAction``)
    X | None             as X, and ``none`` (any case) for None
    tuple[X, ...]        comma-separated, ``--x 1,2,4`` (``""``: the empty tuple),
                         parsed by ``int_list``/``float_list``/``str_list``

  Args:
    parser: the parser (or sub-command parser) to add to.
    cls: a dataclass (usually frozen).
    title: the title of the argument group holding the flags; default
      ``"<cls name> fields"``.
    exclude: names of fields that get no flag.

  Returns:
    The argument group.

  Raises:
    TypeError: ``cls`` is not a dataclass, or a field's annotation has no
      flag type (:func:`flag_type`).
  """
  if not dataclasses.is_dataclass(cls):
    raise TypeError(f"add_flags needs a dataclass, got {cls!r}")
  hints = typing.get_type_hints(cls)
  group = parser.add_argument_group(title or f"{cls.__name__} fields")
  skip = set(exclude)
  for field in dataclasses.fields(cls):
    if field.name in skip:
      continue
    kind = flag_type(hints[field.name])
    default = field_default(field)
    text = field.metadata.get(HELP, "")
    if default is not dataclasses.MISSING:
      text = f"{text} (default: {_shown(default)})" if text else f"default: {_shown(default)}"
    kwargs = dict(dest=field.name, default=argparse.SUPPRESS, help=text.replace("%", "%%"))
    if CHOICES in field.metadata:
      kwargs["choices"] = field.metadata[CHOICES]
    flag = "--" + field.name.replace("_", "-")
    if kind is None:
      group.add_argument(flag, action=argparse.BooleanOptionalAction, **kwargs)
    else:
      group.add_argument(flag, type=kind, metavar=field.name.upper(), **kwargs)
  return group


def add_task_arg(group) -> None:
  """Adds ``--task-arg KEY=VALUE`` (repeatable, into ``task_args``) to an argparse group."""
  group.add_argument(
      "--task-arg",
      dest="task_args",
      action="append",
      metavar="KEY=VALUE",
      default=argparse.SUPPRESS,
      help="a keyword argument of the --task factory (repeat for more; VALUE is JSON "
      "if it parses, else text).",
  )


def overrides(args: argparse.Namespace, cls: type) -> dict[str, Any]:
  """The fields of ``cls`` given on the command line: ``{name: value}``, for
  ``cls(**overrides(args, cls))`` or ``dataclasses.replace(config, **...)``."""
  return {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}


def call_config_file(path, function: str, returns: type, what: str, error: type[Exception]) -> Any:
  """``function()`` of a Python file given as ``--config FILE.py``.

  The one loader of the command line's config files (``easgd train --config``:
  ``get_config``; ``easgd protocol --config``: ``get_protocol``). The file is
  executed as a module of its own; whatever it raises (``SystemExit``
  included) becomes one line.

  Args:
    path: the file (str or path-like), a ``.py`` file.
    function: the name of the function the file defines, called with no
      arguments.
    returns: the type the function must return.
    what: how messages name the file, e.g. ``"config file"``.
    error: the exception class raised.

  Returns:
    The function's value, an instance of ``returns``.

  Raises:
    error: the path is blank, missing, a directory or not a regular file, not
      a ``.py`` file, the file fails to load or its function raises (one line:
      the exception's type and message), or it does not define ``function``
      returning ``returns``.
  """
  if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
    raise error(f"the {what} must be a path to a .py file, got {path!r}")
  path = Path(path)
  defining = f"defining {function}()"
  if path.is_dir():
    raise error(f"{what} '{path}' is a directory; give a .py file {defining}")
  if not path.exists():
    raise error(f"{what} '{path}' does not exist")
  if not path.is_file():
    raise error(f"{what} '{path}' is not a regular file; give a .py file {defining}")
  spec = importlib.util.spec_from_file_location(f"_easgd_{function}_{path.stem}", path)
  if spec is None or path.suffix != ".py":
    raise error(f"{what} '{path}' must be a Python file (.py) {defining}")
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
    value = getattr(module, function, lambda: None)()
  except (Exception, SystemExit) as e:  # a user's file: one line
    text = "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
    raise error(f"{what} '{path}' failed to load: {type(e).__name__}: {text}") from None
  if not isinstance(value, returns):
    raise error(
        f"{what} '{path}' must define {function}() returning "
        f"{returns.__module__}.{returns.__name__}"
    )
  return value
