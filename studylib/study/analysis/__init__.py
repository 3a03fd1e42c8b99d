"""L3 analysis, what several comparisons share: ``frames`` (the one reader of runs: summaries,
metrics, router records, the pairing by seed), ``stats`` (paired CIs, power, Holm, TOST,
verdicts), ``bootstrap`` (seeds resampled within cells, percentile intervals, an estimate with its
replicates: every fit's), ``position`` (where the MoE sits between its dense matches, worded),
``tables`` / ``text`` / ``plots`` (shared tables, verdict sentences, figures), ``paper`` (the
papers' numbers), ``routing`` (router tables of notebooks 02, 04 and 06) and ``probes``
(measurements on trained models, notebooks 03 and 06). A comparison's own analysis lives in its
package (:mod:`studylib.study.comparisons`). Nothing here trains."""
