"""The documentation builds from the code with warnings as errors, and its API
reference lists every public name (README: the build command)."""

import importlib
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
  """The site built once, as the README's command builds it, into a temporary folder."""
  out = tmp_path_factory.mktemp("docs") / "html"
  run = subprocess.run([*BUILD, "docs", str(out)], cwd=ROOT, capture_output=True, text=True)
  assert run.returncode == 0, f"the documentation build warns or fails:\n{run.stderr[-6000:]}"
  return out


def inventory(site) -> dict:
  """The names of ``objects.inv``: full name -> its role (``py:function``, ...)."""
  from sphinx.util.inventory import InventoryFile

  with open(site / "objects.inv", "rb") as f:
    inv = InventoryFile.load(f, "", lambda base, uri: uri)
  inv = getattr(inv, "data", inv)
  return {name: role for role, items in inv.items() for name in items}


def the_readme_build_command() -> str:
  readme = (ROOT / "README.md").read_text()
  return next(l.strip() for l in readme.splitlines() if "-m sphinx" in l)


def test_the_readme_gives_the_build_command():
  assert the_readme_build_command() == (
      ".venv/bin/python -m sphinx -W --keep-going -b html docs docs/_build/html"
  )
  ignored = (ROOT / ".gitignore").read_text().splitlines()
  assert "docs/_build/" in ignored and "docs/api/" in ignored  # built, never committed


@pytest.mark.slow
def test_the_documentation_builds_without_a_warning(site):
  for page in ("index", "api/index", "api/easgd", "guides/quickstart", "guides/results"):
    assert (site / f"{page}.html").is_file(), page
  for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):  # rendered with outputs
    html = (site / "notebooks" / f"{notebook.stem}.html").read_text()
    assert "cell_output" in html, notebook.name


@pytest.mark.slow
def test_the_guides_pictures_are_copied_into_the_site(site):
  """A picture a guide shows by a relative path is in the built site, byte for byte."""
  html = (site / "guides" / "multi_device.html").read_text()
  assert 'src="../_images/two_levels.png"' in html
  source = ROOT / "docs" / "guides" / "images" / "two_levels.png"
  assert (site / "_images" / "two_levels.png").read_bytes() == source.read_bytes()


@pytest.mark.slow
def test_every_public_name_is_in_the_reference(site):
  import easgd

  names = inventory(site)
  missing = []
  for name in easgd.__all__:
    value = getattr(easgd, name)
    role = "py:module" if isinstance(value, types.ModuleType) else None
    if f"easgd.{name}" not in names or (role and names[f"easgd.{name}"] != role):
      missing.append(f"easgd.{name}")
  top = {id(getattr(easgd, n)) for n in easgd.__all__}
  for sub in (n for n in easgd.__all__ if isinstance(getattr(easgd, n), types.ModuleType)):
    module = importlib.import_module(f"easgd.{sub}")
    for name in module.__all__:  # its own page, or the top level's entry of the same object
      if f"easgd.{sub}.{name}" not in names and id(getattr(module, name)) not in top:
        missing.append(f"easgd.{sub}.{name}")
  assert not missing, f"public names missing from the API reference: {missing}"


def entry_html(site, name: str) -> str:
  """The HTML of the entry documenting ``name`` (``easgd.core.X`` or, for a
  name the top level also exports, ``easgd.X``): from its anchor to the next."""
  from sphinx.util.inventory import InventoryFile

  with open(site / "objects.inv", "rb") as f:
    inv = InventoryFile.load(f, "", lambda base, uri: uri)
  inv = getattr(inv, "data", inv)
  uris = {
      n: getattr(item, "uri", None) or item[2]
      for items in inv.values()
      for n, item in items.items()
  }
  short = name.rsplit(".", 1)[1]
  uri = uris.get(name) or uris[f"easgd.{short}"]
  page, anchor = uri.split("#")
  html = (site / page).read_text()
  start = html.index(f'id="{anchor}"')
  end = html.find('<dt class="sig', start + 1)
  return html[start : end if end > 0 else None]


@pytest.mark.slow
def test_the_elastic_update_is_rendered_as_mathematics(site):
  """Eq. (5)-(6) in the reference are MathJax equations, not preformatted text."""
  import re

  for name in ("easgd.core.easgd_update", "easgd.core.elastic_exchange", "easgd.core.easgd"):
    entry = entry_html(site, name)
    maths = re.findall(r'<div class="math notranslate nohighlight">\s*\\\[(.*?)\\\]', entry, re.S)
    assert any(r"\alpha (x^i" in m and r"\tilde x" in m for m in maths), (name, maths)


@pytest.mark.slow
def test_the_site_loads_no_script_from_outside(site):
  """Every script and stylesheet a page loads is a file of the site: MathJax included
  (copied in by docs/conf.py), so the equations render offline."""
  import re

  outside, mathjax = [], set()
  for page in site.rglob("*.html"):
    html = page.read_text()
    tags = re.findall(r"<script\b[^>]*\bsrc=\"([^\"]*)\"", html)
    tags += re.findall(r"<link\b[^>]*\brel=\"stylesheet\"[^>]*\bhref=\"([^\"]*)\"", html)
    for src in tags:
      if re.match(r"([a-z]+:)?//", src, re.I):
        outside.append((page.relative_to(site).as_posix(), src))
      elif "MathJax" in src:
        mathjax.add((page.parent / src.split("?")[0]).resolve())
  assert not outside, outside[:5]
  assert mathjax == {(site / "_static" / "mathjax" / "MathJax.js").resolve()}
  assert (site / "_static" / "mathjax" / "MathJax.js").is_file()
  assert (site / "_static" / "mathjax" / "config" / "TeX-AMS_CHTML.js").is_file()
  html = (site / "api" / "easgd.html").read_text()  # eq. (5)-(6) is there, MathJax with it
  assert "easgd.easgd_update" in html and "_static/mathjax/MathJax.js" in html
