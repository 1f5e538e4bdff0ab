"""Sweeps: the one-program engine, grids, learning curves, the quadratic and network problems, reports, the sweep command."""
