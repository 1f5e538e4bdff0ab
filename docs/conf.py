"""Sphinx configuration of easgd's documentation (built offline, from the code).

    .venv/bin/python -m sphinx -W --keep-going -b html docs docs/_build/html

The API reference (``docs/api/``) is written here, at every build, from the
``__all__`` of ``easgd`` and of each subpackage (:func:`write_api_pages`), so
it lists exactly the public names; autodoc fills it from the docstrings
(napoleon: Google style). The guides are Markdown (myst-parser); the notebooks
(``docs/notebooks`` links to ``notebooks/``) are rendered with their committed
outputs by myst-nb, never executed. The equations are rendered by a MathJax copied into
the site (:func:`copy_mathjax`, from Debian's ``libjs-mathjax``): the site loads no script
from elsewhere and shows its mathematics offline.
"""

import importlib
import os
import re
import shutil
import sys
import types
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))

import easgd  # noqa: E402

project = "easgd"
author = "easgd authors"
copyright = "easgd authors, Apache-2.0"
release = version = easgd.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "myst_nb",  # Markdown (myst-parser) and notebooks
]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
nb_execution_mode = "off"  # the notebooks' committed outputs are what is shown
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3
suppress_warnings = ["myst.header"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True  # Attributes: as fields (autodoc documents the members)

html_theme = "furo"
html_title = f"easgd {release}"

MATHJAX_DIRS = (os.environ.get("EASGD_MATHJAX_DIR", ""), "/usr/share/javascript/mathjax")
"""Where a MathJax 2 tree is looked for: ``$EASGD_MATHJAX_DIR``, then Debian's
``libjs-mathjax`` (``apt-get install libjs-mathjax``)."""
MATHJAX_FILES = (
    "MathJax.js",
    "config/TeX-AMS_CHTML.js",
    "extensions",
    "jax/element",
    "jax/input/TeX",
    "jax/output/CommonHTML",
    "fonts/HTML-CSS/TeX/woff",
    "localization/en",
)
"""The part of the tree the TeX input and the CommonHTML output load (about 1.5 MB)."""
MATHJAX = next(
    (Path(d) for d in MATHJAX_DIRS if d and (Path(d) / MATHJAX_FILES[1]).is_file()), None
)
if MATHJAX is not None:
  mathjax_path = "mathjax/MathJax.js?config=TeX-AMS_CHTML"  # under _static/ (copy_mathjax)
  mathjax2_config = {"tex2jax": {"inlineMath": [[r"\(", r"\)"]], "displayMath": [[r"\[", r"\]"]]}}
  myst_update_mathjax = False  # the config above is MathJax 2's; myst writes MathJax 4's

SUBPACKAGES = [n for n in easgd.__all__ if isinstance(getattr(easgd, n), types.ModuleType)]
"""The subpackages named in ``easgd.__all__``: one reference page each."""


def _is_module(value) -> bool:
  return isinstance(value, types.ModuleType)


def _title(text: str) -> str:
  return f"{text}\n{'=' * len(text)}\n"


def api_pages() -> dict:
  """The reference pages: file name -> reStructuredText.

  ``easgd`` documents every name of ``easgd.__all__`` under ``easgd.NAME``; a
  subpackage page documents the names of its ``__all__`` that the top level
  does not already export (those it lists as links), and each of its modules'
  docstrings.
  """
  top = {id(getattr(easgd, n)): n for n in easgd.__all__ if not _is_module(getattr(easgd, n))}
  names = [n for n in easgd.__all__ if not _is_module(getattr(easgd, n)) and n != "__version__"]
  pages = {}
  index = [_title("API reference"), ""]
  index.append(
      "Every public name: ``easgd.__all__`` (:doc:`easgd`) and each subpackage's"
      " ``__all__``, generated from the docstrings.\n"
  )
  index.append(".. toctree::\n   :maxdepth: 1\n\n   easgd")
  index += [f"   {s}" for s in SUBPACKAGES]
  pages["index"] = "\n".join(index) + "\n"
  page = [
      _title("easgd"),
      ".. automodule:: easgd",
      "   :no-members:",
      "",
      ".. py:data:: __version__",
      f"   :value: {easgd.__version__!r}",
      "",
      "   The package's version.",
      "",
      "The subpackages: " + ", ".join(f":mod:`easgd.{s}`" for s in SUBPACKAGES) + ".",
      "",
  ]
  for n in names:
    page += _entry(easgd, n)
  pages["easgd"] = "\n".join(page)
  for sub in SUBPACKAGES:
    module = importlib.import_module(f"easgd.{sub}")
    modules = [n for n in module.__all__ if _is_module(getattr(module, n))]
    aliases = [n for n in module.__all__ if id(getattr(module, n)) in top and n not in modules]
    own = [n for n in module.__all__ if n not in modules and n not in aliases]
    page = [_title(f"easgd.{sub}"), f".. automodule:: easgd.{sub}", "   :no-members:", ""]
    if aliases:
      page += [
          "Also exported by the top level (documented there): "
          + ", ".join(f":obj:`{n} <easgd.{top[id(getattr(module, n))]}>`" for n in aliases)
          + ".",
          "",
      ]
    if own:
      page += [f".. currentmodule:: easgd.{sub}", ""]
      for n in own:
        page += _entry(module, n)
    for n in modules:
      page += [
          _section(f"easgd.{sub}.{n}"),
          f".. automodule:: easgd.{sub}.{n}",
          "   :no-members:",
          "",
      ]
    pages[sub] = "\n".join(page)
  return pages


def _entry(module, name: str) -> list:
  """The directive documenting ``module.name``: autodoc for functions and
  classes; for a constant, its docstring from the module that defines it (an
  imported constant would otherwise show its type's docstring)."""
  value = getattr(module, name)
  if _kind(value) != "data":
    return [f".. auto{_kind(value)}:: {name}", ""]
  from sphinx.pycode import ModuleAnalyzer

  for source in sorted(m for m in sys.modules if m.startswith("easgd")):
    if sys.modules[source].__dict__.get(name) is value:
      docs = ModuleAnalyzer.for_module(source).find_attr_docs()
      if ("", name) in docs:
        lines = list(docs[("", name)])
        plain_text_docstring(None, "data", name, value, {}, lines)
        return (
            [f".. py:data:: {name}", f"   :value: {value!r}"[:200], ""]
            + [f"   {l}".rstrip() for l in lines]
            + [""]
        )
  return [f".. py:data:: {name}", f"   :value: {value!r}"[:200], ""]  # no docstring of its own


def _section(text: str) -> str:
  return f"{text}\n{'-' * len(text)}\n"


def _kind(value) -> str:
  if isinstance(value, type):
    return "exception" if issubclass(value, BaseException) else "class"
  if callable(value):
    return "function"
  return "data"


def write_api_pages() -> None:
  """Writes ``docs/api/*.rst`` (ignored by git), each only when it changed."""
  out = DOCS / "api"
  out.mkdir(exist_ok=True)
  for name, text in api_pages().items():
    path = out / f"{name}.rst"
    if not path.exists() or path.read_text() != text:
      path.write_text(text)


SECTIONS = {
    "Args:",
    "Arguments:",
    "Attributes:",
    "Example:",
    "Examples:",
    "Note:",
    "Notes:",
    "Raises:",
    "References:",
    "Returns:",
    "Warning:",
    "Yields:",
}
"""The Google-style section headers napoleon reads (left to it)."""
_LIST_ITEM = re.compile(r"^\s*([-*+]|\d+[.)]|\([a-z0-9]+\))\s")


_DIRECTIVE = re.compile(r"^\s*\.\. [\w:-]+::")
"""A directive's first line (``.. math::``); its indented body is left to it."""


def _indent(line: str) -> int:
  return len(line) - len(line.lstrip())


_LONE_STAR = re.compile(r"(?<![\w*`\\])\*(?=\w)(?![^*]*\*)")
"""A ``*`` that opens no emphasis: ``[d, *shape]``."""


_LITERAL_OR_MATH = re.compile(r"(``.*?``|:math:`[^`]*`)")
"""An inline literal or an inline equation (``:math:`x^i```): kept as written."""


def _escape_bars(line: str) -> str:
  """``|x|`` (an absolute value, a norm) and a lone ``*`` as text, not markup;
  not inside inline literals nor inline equations."""
  parts = _LITERAL_OR_MATH.split(line)
  return "".join(
      _LONE_STAR.sub(r"\*", p.replace("|", r"\|")) if i % 2 == 0 else p for i, p in enumerate(parts)
  )


def plain_text_docstring(app, what, name, obj, options, lines) -> None:
  """Reads the docstrings' plain-text conventions as reStructuredText.

  The docstrings are written to be read as text (``help()``): a table is an
  indented block, and ``|x|`` is an absolute value; the paper's equations are
  ``.. math::`` blocks and ``:math:`` roles (LaTeX, rendered by MathJax).
  Before napoleon reads the sections, each indented block that is not a list,
  a section's body or a directive's body (``.. math::``, kept as written)
  becomes a literal block (shown as written), and each ``|`` outside literals
  and equations is escaped. The text itself is unchanged.
  """
  out = []
  section = None  # indent of the napoleon section being read
  literal = None  # indent of the paragraph that opened a literal block
  directive = None  # indent of the ``.. name::`` line whose body is being read
  previous = ""  # the previous non-blank line
  blank_before = True
  for line in lines:
    if not line.strip():
      out.append(line)
      blank_before = True
      continue
    indent = _indent(line)
    if directive is not None:
      if indent > directive:  # the directive's body (an equation): as written
        out.append(line)
        previous, blank_before = line, False
        continue
      directive = None
    if literal is not None:
      if indent > literal:
        out.append(line)
        previous, blank_before = line, False
        continue
      literal = None
      if not blank_before:  # a literal block ends at a blank line
        out.append("")
    if _DIRECTIVE.match(line):
      directive = indent
      out.append(line)
      previous, blank_before = line, False
      continue
    if line.strip() in SECTIONS:
      section = indent
    elif section is not None and indent <= section:
      section = None
    deeper = previous and indent > _indent(previous)
    if (
        section is None
        and deeper
        and not _LIST_ITEM.match(line)
        and not _LIST_ITEM.match(previous)
        and not previous.rstrip().endswith("::")
        and not previous.strip().startswith(("..", ">>>", "..."))
    ):
      base = _indent(previous)
      if not blank_before:
        out.append("")
      out += [" " * base + "::", ""]
      literal = base
      out.append(line)
      previous, blank_before = line, False
      continue
    if section is None and previous and not blank_before:
      nested = deeper and _LIST_ITEM.match(line)  # a list right under a line
      ends = indent < _indent(previous) and not _LIST_ITEM.match(line)  # text after one
      if nested or ends:
        out.append("")
    if line.rstrip().endswith("::"):
      literal = indent
      out.append(line)
    elif line.lstrip().startswith((">>>", "...")):
      out.append(line)
    else:
      out.append(_escape_bars(line))
    previous, blank_before = line, False
  lines[:] = out


def check_mathjax(app) -> None:
  """Without a MathJax tree (:data:`MATHJAX`), warns (an error under ``-W``): the
  equations would then load MathJax from Sphinx's default address on the internet."""
  if MATHJAX is None:
    from sphinx.util import logging

    logging.getLogger(__name__).warning(
        "no MathJax 2 found (%s): the equations would need the internet; install Debian's "
        "libjs-mathjax (apt-get install libjs-mathjax) or set EASGD_MATHJAX_DIR",
        ", ".join(d for d in MATHJAX_DIRS if d),
    )


def copy_mathjax(app, exception) -> None:
  """Copies :data:`MATHJAX_FILES` of :data:`MATHJAX` into the site's ``_static/mathjax``."""
  if exception is not None or app.builder.format != "html" or MATHJAX is None:
    return
  out = Path(app.outdir) / "_static" / "mathjax"
  for name in MATHJAX_FILES:
    source, target = MATHJAX / name, out / name
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
      shutil.copytree(source, target, dirs_exist_ok=True)
    else:
      shutil.copyfile(source, target)


def setup(app):
  app.connect("autodoc-process-docstring", plain_text_docstring, priority=100)
  app.connect("builder-inited", check_mathjax)
  app.connect("build-finished", copy_mathjax)


write_api_pages()
