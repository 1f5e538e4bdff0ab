"""Simulated asynchrony: the time model, the simulated methods, the exchange log and its replay."""
