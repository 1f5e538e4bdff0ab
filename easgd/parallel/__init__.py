"""Where workers run: device mapping (pmap / shard_map of vmap) and processes."""
