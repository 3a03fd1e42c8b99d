"""L3 analysis, what several comparisons share: ``frames`` (the one reader of runs: summaries,
metrics, router records, the pairing by seed), ``stats`` (paired CIs, power, Holm, TOST,
verdicts), ``tables`` / ``text`` / ``plots`` (shared tables, verdict sentences, figures), ``paper``
(the papers' numbers), ``routing`` (router tables of notebooks 02, 04 and 06), ``probes``
(measurements on trained models, notebooks 03 and 06), ``position`` (where the MoE sits between
its matches) and ``bootstrap`` (the one bootstrap type: a point estimate with its draws, its
intervals and predictions). A comparison's own analysis lives in its
package (:mod:`studylib.study.comparisons`). Nothing here trains."""
