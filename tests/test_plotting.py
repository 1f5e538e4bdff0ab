"""The comparison figure shows every error, the first epochs' included."""

import matplotlib.pyplot as plt

from easgd.run.plotting import comparison_figure


def test_the_error_axes_span_the_start_and_the_lowest_error():
  # chance-level start (90%), then the low errors a run ends at (4.5 to 6%)
  errors = {"easgd": [0.90, 0.30, 0.08, 0.05, 0.045], "pmean_sgd": [0.90, 0.25, 0.07, 0.06, 0.06]}
  histories = {
      name: [
          dict(epoch=e, test_error=v, bytes_communicated=1e6 * e, simulated_time=float(e))
          for e, v in enumerate(errs)
      ]
      for name, errs in errors.items()
  }
  fig = comparison_figure(histories)
  try:
    assert len(fig.axes) == 3
    for ax in fig.axes:
      low, high = ax.get_ylim()
      assert low <= 4.5 and high >= 90.0 and high <= 100.0
      assert ax.get_yscale() == "log"  # 4.5% and 6% stay apart under a 90% start
  finally:
    plt.close(fig)
