"""L3 orchestration: which runs a study needs and getting them trained. ``plan`` (grids -> run
specs, resolved, checked, counted and ordered once), ``plan_file`` (a comparison's plan on disk,
written by the study, read by its notebook), ``train`` (the plan's missing runs in one queue),
``cluster`` (Dask distributed, the trainer's side), ``worker`` (what runs on a worker), ``watch``
(live progress). Imports no analysis module."""
