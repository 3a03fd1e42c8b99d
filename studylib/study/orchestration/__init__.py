"""L3 orchestration: which runs a study needs (``plan``: preset -> grids -> run specs) and getting
them trained (``sweep``: the one queue; ``cluster``: Dask distributed, the sweep's side;
``worker``: what runs on a worker; ``watch``: live progress). May read runs through
:mod:`studylib.study.analysis`, never the other way round."""
