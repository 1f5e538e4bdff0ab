"""The paper's synchronous rules as pure per-worker (init, step) pairs; no devices."""
