"""The paper's Figure 1 (round-robin ADMM instability) and its divergence example.

Writes, under --out:
  figure1_admm.png      largest |eigenvalue| of the ADMM round map F = F^p o ... o F^1
                        over eta in (0, 1e-2), rho in (0, 10), for p = 3 and p = 8,
                        with the contour radius = 1;
  admm_divergence.png   |center| against rounds from lambda = 0, x^i = x~ = 1000 at
                        eta = 0.001, rho = 2.5 (p = 3): ADMM against EASGD with
                        alpha = eta * rho (round-robin and synchronous),
and prints the numbers it plots.

Run:  python experiments/figure1_admm.py --out paper_notes/figures

References: Zhang, Choromanska, LeCun (2015), Section 4, eq. (9)-(13), Figure 1.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from easgd.analysis import round_robin, stability
from easgd.sweeps import quadratic

ETA_MAX, RHO_MAX = 1e-2, 10.0
DIVERGENCE = dict(eta=0.001, rho=2.5, num_workers=3, x0=1000.0)


def figure1(out: Path, grid: int) -> dict:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  eta = np.linspace(0.0, ETA_MAX, grid + 1)[1:]
  rho = np.linspace(0.0, RHO_MAX, grid + 1)[1:]
  fig, axes = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
  results = {}
  for ax, p in zip(axes, (3, 8)):
    radius = round_robin.admm_spectral_radius(eta[None, :], rho[:, None], p)
    j, i = np.unravel_index(np.argmax(radius), radius.shape)
    results[p] = dict(
        max_radius=float(radius.max()),
        at_eta=float(eta[i]),
        at_rho=float(rho[j]),
        fraction_unstable=float((radius > 1).mean()),
        min_radius=float(radius.min()),
    )
    print(
        f"p={p}: max |eigenvalue| = {radius.max():.6f} at eta={eta[i]:.5g}, "
        f"rho={rho[j]:.4g}; min = {radius.min():.6f}; radius > 1 on "
        f"{100 * (radius > 1).mean():.1f}% of the {grid}x{grid} grid "
        f"(eta in (0, {ETA_MAX:g}], rho in (0, {RHO_MAX:g}])"
    )
    im = ax.imshow(
        radius, origin="lower", aspect="auto", extent=(0, ETA_MAX, 0, RHO_MAX), cmap="viridis"
    )
    ax.contour(eta, rho, radius, levels=[1.0], colors="w", linewidths=1)
    ax.plot(DIVERGENCE["eta"], DIVERGENCE["rho"], "r+", ms=10)
    ax.set(xlabel="eta", ylabel="rho", title=f"ADMM round map, p = {p}: max |eig| (white: = 1)")
    fig.colorbar(im, ax=ax)
  fig.savefig(out / "figure1_admm.png", dpi=100)
  plt.close(fig)
  return results


def divergence(out: Path, num_rounds: int) -> dict:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  eta, rho, p, x0 = (DIVERGENCE[k] for k in ("eta", "rho", "num_workers", "x0"))
  alpha = eta * rho
  worker_radii = [
      float(np.max(np.abs(np.linalg.eigvals(round_robin.admm_worker_map(eta, rho, i, p)))))
      for i in range(p)
  ]
  admm_radius = float(round_robin.admm_spectral_radius(eta, rho, p))
  rr_radius = float(round_robin.round_robin_easgd_round_spectral_radius(eta, alpha, p))
  sync_radius = float(stability.sync_easgd_spectral_radius(eta, alpha, 1, p))
  print(
      f"divergence example p={p}, eta={eta}, rho={rho} (EASGD alpha = eta*rho = "
      f"{alpha:g}), start lambda=0, x^i = center = {x0:g}:"
  )
  print(f"  ADMM single-worker maps F^i: spectral radii {worker_radii}")
  print(f"  ADMM round map F^p o ... o F^1: spectral radius {admm_radius:.8f}")
  print(
      f"  EASGD round-robin round map: spectral radius {rr_radius:.8f}; "
      f"2x2 map {float(round_robin.round_robin_easgd_spectral_radius(eta, alpha)):.8f}"
      f"; condition holds: {bool(round_robin.round_robin_easgd_condition(eta, alpha))}"
  )
  print(f"  EASGD synchronous (tau = 1) step: spectral radius {sync_radius:.8f}")

  admm = round_robin.admm_simulate(eta, rho, p, num_rounds, x0=x0)
  round_map = round_robin.round_robin_easgd_round_map(eta, alpha, p)
  state = np.full(p + 1, x0)
  rr = [x0]
  for _ in range(num_rounds):
    state = round_map @ state
    rr.append(state[-1])
  rr = np.asarray(rr)
  sync = np.asarray(
      quadratic.simulate_sync_easgd(eta, alpha, 1, p, num_rounds, x0=x0).center, np.float64
  )
  marks = np.linspace(0, num_rounds, 5).astype(int)
  print("  round  ADMM center   ADMM ||state||   EASGD-RR center  EASGD-sync center")
  for k in marks:
    print(
        f"  {k:5d}  {admm.center[k]: .4e}  {admm.norm[k]: .4e}   {rr[k]: .4e}     "
        f"{sync[k]: .4e}"
    )

  fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
  rounds = np.arange(num_rounds + 1)
  ax.semilogy(rounds, np.abs(admm.center), label="ADMM |center|")
  ax.semilogy(rounds, admm.norm, "--", label="ADMM ||state||")
  ax.semilogy(rounds, np.abs(rr), label="EASGD round-robin |center|")
  ax.semilogy(rounds, np.abs(sync), ":", label="EASGD synchronous |center|")
  ax.set(
      xlabel="round (p single-worker updates; sync: one step)",
      ylabel="magnitude",
      title=f"eta={eta}, rho={rho}, p={p}, alpha=eta*rho={alpha:g}",
  )
  ax.grid(alpha=0.3)
  ax.legend()
  fig.savefig(out / "admm_divergence.png", dpi=100)
  plt.close(fig)
  return dict(
      worker_radii=worker_radii,
      admm_radius=admm_radius,
      easgd_round_robin_radius=rr_radius,
      easgd_sync_radius=sync_radius,
      admm_center_end=float(admm.center[-1]),
      admm_norm_end=float(admm.norm[-1]),
      easgd_rr_center_end=float(rr[-1]),
      easgd_sync_center_end=float(sync[-1]),
  )


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, type=Path, help="directory for the PNG files")
  parser.add_argument(
      "--grid", type=int, default=150, help="grid points per axis of Figure 1 (default 150)"
  )
  parser.add_argument(
      "--rounds", type=int, default=20000, help="rounds of the divergence example (default 20000)"
  )
  args = parser.parse_args(argv)
  args.out.mkdir(parents=True, exist_ok=True)
  figure1(args.out, args.grid)
  divergence(args.out, args.rounds)
  print(f"wrote {args.out / 'figure1_admm.png'} and {args.out / 'admm_divergence.png'}")


if __name__ == "__main__":
  main()
