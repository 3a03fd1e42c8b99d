"""L4, optional tools, never imported from below: benchmarks and the routing explorer."""
