"""The embedded default job: EASGD vs pmean SGD on MNIST-1D (generated locally).

The same as ``TrainConfig()``'s defaults: the README's first command runs it.
"""

from easgd.settings.config import TrainConfig


def get_config() -> TrainConfig:
  return TrainConfig()  # mnist1d, cnn, p=4, tau=4, beta=0.9 (see easgd/config.py)
