"""Writes the examples' data from local files only (nothing is downloaded).

``text``: a text file for ``examples.transformer_lm``, the concatenation of
local text files (default: Debian's ``/usr/share/common-licenses/GPL-3``, the
GNU GPL version 3, 35,149 bytes, sha256 ``3972dc97...b36986``, installed by
``base-files`` on every Debian system, so the examples' numbers do not move
with this package's own files; ``--sources`` names others)::

  python examples/make_data.py text --out runs/data/gpl3.txt

``images``: an ``.npz`` (``x_train, y_train, x_test, y_test``) for
``examples.resnet_cnn``, a seeded subset of scikit-learn's 8x8 digits or of
Fashion-MNIST from Debian's IDX files (``/usr/share/datasets/fashion-mnist``),
through ``easgd.tasks.datasets.load_dataset``::

  python examples/make_data.py images --source fashion_mnist \\
      --train-examples 4096 --test-examples 1024 --out runs/data/fashion_4k.npz
"""

from __future__ import annotations

import argparse
import glob
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_TEXTS = ("/usr/share/common-licenses/GPL-3",)
"""The default text: the GNU GPL version 3 as Debian's ``base-files`` installs it."""


def write_text(out: str, sources=DEFAULT_TEXTS, root: str = ROOT) -> int:
  """Concatenates the files matching ``sources`` (globs under ``root``) into ``out``.

  Args:
    out: the text file to write (its folder is created).
    sources: glob patterns, relative to ``root`` (or absolute), in order;
      the files of each pattern sorted by name.
    root: the folder relative patterns start from.

  Returns:
    The bytes written.

  Raises:
    FileNotFoundError: a pattern that matches no file.
  """
  parts = []
  for pattern in sources:
    files = sorted(glob.glob(os.path.join(root, pattern)))
    if not files:
      raise FileNotFoundError(f"no file matches {pattern!r} under {root}")
    for name in files:
      with open(name, "rb") as f:
        parts.append(f.read())
  text = b"\n\n".join(parts)
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, "wb") as f:
    f.write(text)
  return len(text)


def write_images(
    out: str, source: str = "digits", train_examples=None, test_examples=None, seed: int = 0
) -> dict:
  """Writes a seeded subset of a built-in image data set as ``.npz``.

  Args:
    out: the ``.npz`` to write: float32 ``x_train [N, H, W, 1]``, int32
      ``y_train [N]``, ``x_test``, ``y_test`` (standardised as the package's
      loaders standardise them).
    source: ``"digits"`` (8x8, 1797 images) or ``"fashion_mnist"`` (28x28).
    train_examples, test_examples: how many of each split, the first of a
      seeded permutation (None: all).
    seed: the permutation's seed (and digits' split seed).

  Returns:
    The arrays' shapes by name.
  """
  from easgd.tasks.datasets import load_dataset  # noqa: PLC0415

  ds = load_dataset(source, seed=seed)
  rng = np.random.default_rng(seed)
  arrays = {}
  for split, n in (("train", train_examples), ("test", test_examples)):
    x, y = getattr(ds, f"{split}_x"), getattr(ds, f"{split}_y")
    idx = rng.permutation(len(x))[: len(x) if n is None else n]
    arrays[f"x_{split}"], arrays[f"y_{split}"] = x[idx], y[idx]
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  np.savez(out, **arrays)
  return {k: list(v.shape) for k, v in arrays.items()}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  sub = parser.add_subparsers(dest="what", required=True)
  t = sub.add_parser("text", help="a text file for examples.transformer_lm")
  t.add_argument("--out", required=True)
  t.add_argument(
      "--sources",
      nargs="+",
      default=list(DEFAULT_TEXTS),
      help="glob patterns, relative to the repository root or absolute "
      "(default: /usr/share/common-licenses/GPL-3)",
  )
  i = sub.add_parser("images", help="an .npz for examples.resnet_cnn")
  i.add_argument("--out", required=True)
  i.add_argument("--source", choices=("digits", "fashion_mnist"), default="digits")
  i.add_argument("--train-examples", type=int, default=None)
  i.add_argument("--test-examples", type=int, default=None)
  i.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  if args.what == "text":
    print(f"wrote {args.out}: {write_text(args.out, args.sources)} bytes")
  else:
    shapes = write_images(args.out, args.source, args.train_examples, args.test_examples, args.seed)
    print(f"wrote {args.out}: {shapes}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
