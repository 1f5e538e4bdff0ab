"""The one field of the package's metadata computed at build time: the long description.

Everything else is declared in ``pyproject.toml``. The README's relative links and its
picture point into the source tree, which a package index showing the long description
cannot reach: the long description is the README with each relative link replaced by its
text and each relative picture left out (:func:`long_description`); absolute links stay.
"""

import re
from pathlib import Path

_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")
"""A Markdown link ``[text](target)`` or picture ``![alt](target)``."""
_ABSOLUTE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
"""A target with a scheme (``https:``, ``mailto:``): it resolves anywhere."""


def long_description(readme: str) -> str:
  """The README as a package index shows it: no relative link, no relative picture.

  Args:
    readme: the text of ``README.md`` (Markdown).

  Returns:
    The same text with each ``[text](relative)`` as ``text`` and each
    ``![alt](relative)`` removed (a line that held only the picture, and the blank
    line after it, removed too); links with a scheme are kept.
  """

  def plain(match):
    picture, text, target = match.groups()
    if _ABSOLUTE.match(target):
      return match.group(0)
    return "" if picture else text

  text = _LINK.sub(plain, readme)
  return re.sub(r"\n\n\n+", "\n\n", text)


if __name__ == "__main__":  # as the build backend runs it
  from setuptools import setup

  readme = (Path(__file__).resolve().parent / "README.md").read_text(encoding="utf-8")
  setup(long_description=long_description(readme), long_description_content_type="text/markdown")
