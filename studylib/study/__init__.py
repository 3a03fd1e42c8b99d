"""L3, many runs, in three parts that import one way (analysis < orchestration < runner):
:mod:`.analysis` (runs -> tables, figures, verdicts), :mod:`.orchestration` (plan and train the
runs: one queue on Dask distributed) and :mod:`.runner` (execute the notebooks, the report)."""
