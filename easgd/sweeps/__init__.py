"""Sweeps: the one-program engine, grids, learning curves, the quadratic and network problems, reports, the sweep command.

Public: ``SweepConfig`` and ``run_sweep`` (``easgd sweep``), the engine's
program and error, the grid and its result, the quadratic and network sweeps;
the modules for the rest.
"""

from easgd._util import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    modules=("engine", "grid", "curves", "network", "quadratic", "report", "config", "command"),
    names={
        "easgd.sweeps.config": "SweepConfig",
        "easgd.sweeps.command": "run_sweep",
        "easgd.sweeps.engine": "SweepError make_sweep_fn",
        "easgd.sweeps.grid": "SweepGrid SweepResult run_grid",
        "easgd.sweeps.curves": "make_curve_fn",
        "easgd.sweeps.quadratic": "quadratic_loss simulate_sync_easgd sweep_quadratic",
        "easgd.sweeps.network": "sweep_network",
        "easgd.sweeps.report": "write_result plot_result plot_tau_alpha_heatmap",
    },
)
