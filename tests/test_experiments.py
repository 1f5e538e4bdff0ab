"""Every config file in experiments/ that defines get_config() loads and validates.

validate() never touches the disk, so configs whose data directory is absent
here (CIFAR-10) must validate too; nothing is skipped.
"""

import ast
import runpy
from pathlib import Path

import pytest

from easgd.cli import load_config_file
from easgd.methods.registry import ALGORITHMS
from easgd.settings.config import TrainConfig

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"


def defines_get_config(path: Path) -> bool:
  """A top-level ``def get_config`` (read with ast: scripts are not executed)."""
  tree = ast.parse(path.read_text(), filename=str(path))
  return any(isinstance(node, ast.FunctionDef) and node.name == "get_config" for node in tree.body)


CONFIG_FILES = sorted(p for p in EXPERIMENTS.glob("*.py") if defines_get_config(p))


def test_the_known_config_files_are_found():
  names = {p.stem for p in CONFIG_FILES}
  assert {"default_mnist1d", "fashion_mnist", "cifar10"} <= names


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.name)
def test_config_file_validates(path, monkeypatch):
  monkeypatch.delenv("CIFAR10_DIR", raising=False)  # data directory absent here
  config = load_config_file(path)
  assert isinstance(config, TrainConfig)
  assert config.validate() is config


@pytest.mark.parametrize(
    "path", [p for p in CONFIG_FILES if "def get_grid" in p.read_text()], ids=lambda p: p.name
)
def test_every_config_of_a_grid_validates(path, monkeypatch):
  monkeypatch.delenv("CIFAR10_DIR", raising=False)
  grid = runpy.run_path(str(path))["get_grid"]()
  assert grid
  for name, config in grid.items():
    assert config.validate() == config, name


def test_cifar10_config_and_grid(monkeypatch, tmp_path):
  monkeypatch.setenv("CIFAR10_DIR", str(tmp_path / "not-there"))
  module = runpy.run_path(str(EXPERIMENTS / "cifar10.py"))
  config = module["get_config"]()
  assert config.data_dir == str(tmp_path / "not-there")  # read from the environment
  assert (config.dataset, config.model, config.crop_size) == ("cifar10", "cifar", 28)
  assert (config.algorithm, config.num_workers, config.tau) == ("easgd", 4, 4)
  assert config.per_worker_batch_size == 128 and config.weight_decay == 1e-4
  assert config.beta == 0.9
  grid = module["get_grid"]()
  algorithms = [a for a in ("easgd", "eamsgd", "downpour") if a in ALGORITHMS]
  assert len(grid) == len(algorithms) * 3 * 4
  for name, cfg in grid.items():
    cfg.validate()
    assert name == f"{cfg.algorithm}_p{cfg.num_workers}_tau{cfg.tau}"
    assert cfg.num_workers in (4, 8, 16) and cfg.tau in (1, 4, 16, 64)
    assert cfg.per_worker_batch_size == 128
    assert cfg.resolved_alpha == pytest.approx(0.9 / cfg.num_workers)
    assert cfg.delta == 0.99 and cfg.momentum == 0.0  # eamsgd: the paper's delta
    assert cfg.crop_size == 28 and cfg.data_dir == config.data_dir
