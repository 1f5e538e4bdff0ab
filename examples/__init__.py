"""Examples of a user's own problem trained by easgd: a model and data the
package does not ship, written as a :class:`easgd.tasks.task.Task` factory.

* ``examples.transformer_lm:make_task``: a small decoder-only Transformer
  language model on the bytes of a text file (windows from a
  ``__len__``/``__getitem__`` source).
* ``examples.resnet_cnn:make_task``: a small ResNet with BatchNorm on images
  from an ``.npz`` file (the package's BatchNorm policy: the center evaluated
  with statistics recomputed from the center).
* ``examples/make_data.py``: writes their data from local files only.

Run them from the repository root (``easgd train --task`` searches the working
directory first); ``examples/README.md`` gives the commands and results.
"""
