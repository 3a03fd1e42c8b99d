"""L3 notebook runner: the notebooks' shared context and the ``study`` command (``notebooks``),
papermill execution (``execute``), the parameters cell (``parameters``) and the HTML report
(``report``)."""
