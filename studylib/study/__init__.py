"""L3, many runs: sweeps, metric frames, statistics, tables, probes, verdict text, plots and the
notebook runner."""
