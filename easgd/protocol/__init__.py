"""The comparison protocol: config, runs, statistics, report."""
