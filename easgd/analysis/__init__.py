"""Theory: analytic stability and the largest Hessian eigenvalue.

Public: the spectral radii and stable regions of Section 4 (synchronous and
round-robin EASGD, ADMM) and the curvature estimate; the modules ``stability``,
``round_robin`` and ``hessian`` for the rest.
"""

from easgd._util import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    modules=("stability", "round_robin", "hessian"),
    names={
        "easgd.analysis.stability": (
            "sync_easgd_spectral_radius sync_easgd_stable sync_easgd_stable_region "
            "sync_easgd_stable_region_tau_alpha sync_easgd_stationary_covariance "
            "stable_eta_h_interval"
        ),
        "easgd.analysis.round_robin": (
            "round_robin_easgd_spectral_radius round_robin_easgd_condition "
            "admm_spectral_radius admm_simulate"
        ),
        "easgd.analysis.hessian": (
            "HessianEigen top_hessian_eigenvalue curvature_estimate certified_curvature "
            "CurvatureWarning"
        ),
    },
)
