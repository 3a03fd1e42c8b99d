"""The papers' reference numbers (SPEC sections 2 and 7, and the seed reports), shown next to a
preset's results: Tables 2, 5, 7 and 8, the headline gaps and the soft-MoE granularity deltas."""
from __future__ import annotations

import pandas as pd

#: Table 2: best validation loss (mean ± std over seeds) and parameter counts
PAPER_TABLE2 = pd.DataFrame(
    {"best_val_loss": ["1.6545 ± 0.0012", "1.5788 ± 0.0020", "1.5608 ± 0.0025"],
     "params total / active": ["14.89M / 14.89M", "21.06M / 14.77M", "21.06M / 21.06M"]},
    index=pd.Index(["dense active-match", "MoE top-2 + z-loss", "dense total-match"], name="paper"))
#: matched-active and matched-total gaps: (mean, std over seeds)
PAPER_GAPS = {"active": (0.0758, 0.0021), "total": (0.0180, 0.0020)}
#: Table 5: name in params/paper.yaml -> (embedding, non-FFN, FFN total, total, active) as shown
PAPER_TABLE5 = {
    "dense_active": ("9.60M", "0.99M", "4.30M", "14.89M", "14.89M"),
    "moe_top2_z": ("7.68M", "0.79M", "12.58M", "21.06M", "14.77M"),
    "dense_total": ("11.52M", "1.58M", "7.96M", "21.06M", "21.06M"),
}
#: Table 7: router statistics per layer at the end of training
PAPER_TABLE7 = pd.DataFrame({"entropy": [1.243, 1.127, 0.938, 0.940], "top1": [0.443, 0.533, 0.644, 0.645],
                             "margin": [0.175, 0.289, 0.441, 0.451]},
                            index=pd.Index([0, 1, 2, 3], name="layer"))
#: Table 8: training throughput on an RTX 3060
PAPER_TABLE8 = pd.DataFrame(
    {"tok_per_s": ["58.1k", "54.7k", "59.3k", "42.8-48.4k", "54.4-57.6k", "61.0-61.7k"]},
    index=pd.Index(["dense_active", "moe (grouped)", "dense_total", "moe naive", "moe grouped",
                    "moe stacked"], name="paper (RTX 3060)"))
#: seed 003: soft-MoE best val loss minus K=1, per K
PAPER_GRANULARITY = pd.DataFrame({"delta_vs_K1": [0.0, -0.0048, 0.0053, 0.0197]},
                                 index=pd.Index([1, 2, 4, 6], name="K"))
