"""L0, torch-free configuration: schema, presets (load, overrides, environment), parameter
accounting, budget solvers and run identity."""
