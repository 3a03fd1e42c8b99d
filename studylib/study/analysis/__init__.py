"""L3 analysis: runs -> numbers, sentences and figures. ``frames`` is the one metrics parser,
``stats`` the paired CIs and power, ``tables`` / ``plots`` / ``text`` the shared tables, figures and
verdict sentences, ``paper`` the papers' numbers; one module per notebook's analysis
(``budget_map``, ``lr_sweep``, ``noise``, ``routing``, ``shape``, ``downstream``, ``probes``).
Nothing here trains: the runs come from :mod:`studylib.study.orchestration`."""
