"""The wheel is complete: ``python -m build`` makes a wheel and an sdist, and the
wheel, installed into a fresh virtual environment, runs ``easgd --help`` and the
main job's smallest variant with no file of the checkout importable. Both carry the
license; the wheel the ``py.typed`` marker and a long description whose links resolve
on a package index; the sdist the package and no tests (they read the whole checkout)."""

import email
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(argv, **kw):
  done = subprocess.run(argv, capture_output=True, text=True, **kw)
  assert (
      done.returncode == 0
  ), f"{argv}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
  return done.stdout


def third_party_paths() -> list:
  """The site-packages folders of this interpreter (where the dependencies are),
  never the checkout: a plain path line of a ``.pth`` file adds a folder without
  running the ``.pth`` files inside it, so an editable install stays out."""
  paths = [sysconfig.get_paths()["purelib"]]
  paths += [p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))]
  return [p for p in dict.fromkeys(paths) if Path(p).resolve() != ROOT]


def clean_copy(dest: Path) -> Path:
  """The checkout's tracked files only, as a fresh clone has them (no build
  folder or ``*.egg-info`` left by an earlier build, whose file lists setuptools
  would reuse)."""
  files = run(["git", "-C", str(ROOT), "ls-files", "-z"]).split("\0")
  for name in filter(None, files):
    source, target = ROOT / name, dest / name
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_symlink():
      os.symlink(os.readlink(source), target)
    elif source.is_file():
      shutil.copy2(source, target)
  return dest


def check_license_marker_and_description(wheel: zipfile.ZipFile) -> None:
  names = wheel.namelist()
  assert "easgd/py.typed" in names
  licenses = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
  assert [wheel.read(n) for n in licenses] == [(ROOT / "LICENSE").read_bytes()], licenses
  assert (ROOT / "LICENSE").read_text().split()[:3] == ["Apache", "License", "Version"]
  metadata = email.message_from_bytes(wheel.read(next(n for n in names if n.endswith("/METADATA"))))
  assert metadata["License-Expression"] == "Apache-2.0"
  assert "Paper, https://arxiv.org/abs/1412.6651" in metadata.get_all("Project-URL")
  assert metadata["Description-Content-Type"] == "text/markdown"
  description = metadata.get_payload()
  targets = re.findall(r"\]\(([^)\s]*)\)", description)  # links and pictures
  assert all(re.match(r"https?://", t) for t in targets), targets
  lines = set(description.splitlines())
  readme = (ROOT / "README.md").read_text()
  missing = [l for l in readme.splitlines() if "](" not in l and l not in lines]
  assert not missing, missing  # the README's other lines as written
  for text, target in re.findall(r"(?<!!)\[([^\]]*)\]\(([^)\s]*)\)", readme):
    assert text in description, (text, target)  # a relative link's text stays


def check_sdist(sdist: tarfile.TarFile) -> None:
  top = sdist.getnames()[0].split("/")[0]
  names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
  assert {"LICENSE", "README.md", "pyproject.toml", "setup.py", "easgd/py.typed"} <= names
  assert sdist.extractfile(f"{top}/LICENSE").read() == (ROOT / "LICENSE").read_bytes()
  tracked = run(["git", "-C", str(ROOT), "ls-files", "easgd"]).split()
  assert set(tracked) <= names, sorted(set(tracked) - names)
  assert not [n for n in names if n.startswith("tests/")]  # no tests without what they read


@pytest.mark.slow
def test_the_wheel_installs_and_runs_the_main_job(tmp_path):
  dist = tmp_path / "dist"
  source = clean_copy(tmp_path / "src")
  run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)])
  wheels, sdists = list(dist.glob("easgd-*.whl")), list(dist.glob("easgd-*.tar.gz"))
  assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in dist.iterdir())
  packaged = {Path(n).parent.as_posix() for n in zipfile.ZipFile(wheels[0]).namelist()}
  for init in ROOT.glob("easgd/**/__init__.py"):  # every subpackage is in the wheel
    assert init.parent.relative_to(ROOT).as_posix() in packaged, init
  check_license_marker_and_description(zipfile.ZipFile(wheels[0]))
  check_sdist(tarfile.open(sdists[0]))

  fresh = tmp_path / "fresh"
  run([sys.executable, "-m", "venv", "--without-pip", str(fresh)])
  python = fresh / "bin" / "python"
  site = Path(
      run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip()
  )
  (site / "zz_dependencies.pth").write_text("".join(f"{p}\n" for p in third_party_paths()))
  run(
      [
          sys.executable,
          "-m",
          "pip",
          "--python",
          str(python),
          "install",
          "--no-deps",
          "--no-index",
          str(wheels[0]),
      ]
  )

  where = run([str(python), "-c", "import easgd; print(easgd.__file__)"], cwd=tmp_path).strip()
  assert Path(where).resolve().is_relative_to(fresh.resolve()), where  # not the checkout
  assert "usage: easgd" in run([str(fresh / "bin" / "easgd"), "--help"], cwd=tmp_path)
  work = tmp_path / "main"
  env = {"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu", "HOME": str(tmp_path)}
  run(
      [
          str(fresh / "bin" / "easgd"),
          "compare",
          "--workdir",
          str(work),
          "--num-epochs",
          "1",
          "--no-progress",
      ],
      cwd=tmp_path,
      env=env,
  )
  for name in ("comparison.png", "results.md", "results.json"):
    assert (work / name).is_file(), name
  for algorithm in ("easgd", "pmean_sgd"):
    assert (work / algorithm / "summary.json").is_file(), algorithm
