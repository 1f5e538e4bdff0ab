"""The comparators and the one algorithm table (registry)."""
