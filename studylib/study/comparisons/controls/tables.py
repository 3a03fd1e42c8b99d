"""The tables notebook 13 writes, each read back by name (Clark et al.'s: ``clark_tables.TABLES``)."""
CONTROLS, POSITIONS, GAPS, TWIN = "controls", "controls_positions", "controls_gaps", "controls_twin"
ROUTER_RUNS, ROUTERS = "controls_router_runs", "controls_routers"
RECIPE_LRS, RECIPE = "controls_recipe_lrs", "controls_recipe"
