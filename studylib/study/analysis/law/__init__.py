"""The fitted law every comparison shares: :mod:`.form` (each form's named parameters and bounds,
the loss and its Jacobian), :mod:`.fit` (one Huber fitter, :class:`~.fit.JointLaw` with its seed and
cell bootstraps), :mod:`.bound` (what rests on a bound carries no interval), :mod:`.checks` (the form
chosen by leaving cells out, the held-out size and budget, the paper's point, the runs that move it),
:mod:`.size` (lambda(N) at the paper's point, the span of sizes that would pin it) and :mod:`.words`
(its tables in sentences). Its input is one documented frame, one row per run (:data:`~.fit.COLUMNS`)."""
