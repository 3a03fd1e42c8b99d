"""L3, many runs, in four parts that import one way (analysis < orchestration < comparisons <
runner): :mod:`.analysis` (what several comparisons share: frames, statistics, tables, text,
plots, the papers' numbers), :mod:`.orchestration` (plan the runs, train them: one queue on Dask
distributed), :mod:`.comparisons` (one package per notebook: its knobs, plan, tables, figures and
words; the registry) and :mod:`.runner` (execute the notebooks, the report)."""
