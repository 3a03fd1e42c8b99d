"""The map's part of the answer at a glance: which point is the best-supported one, where the MoE
starts to win (from the family's verdicts), and the joint law's sentence."""
import math

import pandas as pd

from studylib.study.comparisons.token_budget import glance as G


def _table():
    return pd.DataFrame([
        {"size": "a", "size_label": "a (90k active)", "moe_active": 9e4, "tokens_per_param": 3.5, "active_n": 3,
         "data_passes": 0.2, "active_verdict": "inconclusive", "total_verdict": "A better"},
        {"size": "a", "size_label": "a (90k active)", "moe_active": 9e4, "tokens_per_param": 28.9, "active_n": 3,
         "data_passes": 1.9, "active_verdict": "B better", "total_verdict": "inconclusive"},
        {"size": "b", "size_label": "b (230k active)", "moe_active": 2.3e5, "tokens_per_param": 28.9, "active_n": 3,
         "data_passes": 4.8, "active_verdict": "B better", "total_verdict": "inconclusive"},
        {"size": "b", "size_label": "b (230k active)", "moe_active": 2.3e5, "tokens_per_param": 10.0, "active_n": 5,
         "data_passes": 1.6, "active_verdict": "B better", "total_verdict": "B better"},
    ])


def test_the_best_supported_point_is_nearest_the_papers_budget_then_most_seeds_then_largest():
    t = _table()
    assert G.best_point(t)["size"] == "b" and G.best_point(t)["tokens_per_param"] == 28.9  # a tie: the larger
    t.loc[1, "active_n"] = 5
    assert G.best_point(t)["size"] == "a"  # more seeds win the tie
    assert G.best_point(t.iloc[0:0]) is None


def test_where_the_moe_starts_to_win_is_the_smallest_budget_the_family_resolves():
    s = G.win_clause(_table())
    assert s == ("On the map, the MoE beats its active match from 10 tokens per parameter and its total match "
                 "from 10 tokens per parameter.")
    none = _table().assign(total_verdict="inconclusive")
    assert G.win_clause(none).endswith("and its total match nowhere up to 28.9.")
    neither = _table().assign(active_verdict="inconclusive", total_verdict="A better")
    assert G.win_clause(neither) == "Up to 28.9 tokens per parameter, the MoE beats neither dense model on the map."


def test_the_law_clause_says_where_the_paper_lies_or_that_nothing_is_said():
    rows = [{"quantity": "position", "estimate": 0.62, "ci_low": 0.55, "ci_high": 0.66, "identified": True,
             "paper_inside": False, "reason": ""},
            {"quantity": "decades", "estimate": 1.63, "ci_low": math.nan, "ci_high": math.nan, "identified": True,
             "paper_inside": None, "reason": ""}]
    assert G.law_clause(pd.DataFrame(rows)) == (
        "carried 1.6 decades, the joint law puts the MoE at p = 0.62 [0.55, 0.66] at the paper's scale, excluding "
        "the paper's 0.81")
    rows[0]["paper_inside"] = True
    assert G.law_clause(pd.DataFrame(rows)).endswith("at the paper's scale, which holds the paper's 0.81")
    rows[0].update(identified=False, reason="lambda not identified by this map")
    assert G.law_clause(pd.DataFrame(rows), "one λ: p = 0.10") == (
        "the joint law does not identify p at the paper's scale, 1.6 decades beyond the map (one λ: p = 0.10)")


def _forms(size_identified: bool, chosen: str = "lambda"):
    """token_budget_law_forms_paper.csv's position rows of the two named forms (and another form's)."""
    rows = [{"form": "lambda", "quantity": "position", "estimate": 0.05, "ci_low": -0.02, "ci_high": 0.13,
             "identified": True},
            {"form": "lambda_size", "quantity": "position", "estimate": 0.31 if size_identified else math.nan,
             "ci_low": 0.10 if size_identified else math.nan, "ci_high": 0.52 if size_identified else math.nan,
             "identified": size_identified},
            {"form": "multiplier", "quantity": "position", "estimate": 0.5, "ci_low": 0.4, "ci_high": 0.6,
             "identified": True}]
    return pd.DataFrame(rows).assign(chosen=lambda t: t["form"] == chosen)


def test_the_maps_sentence_adds_what_the_other_law_form_puts_at_the_papers_point():
    rows = [{"quantity": "position", "estimate": 0.05, "ci_low": -0.02, "ci_high": 0.13, "identified": True,
             "paper_inside": False, "reason": ""},
            {"quantity": "decades", "estimate": 1.8, "ci_low": math.nan, "ci_high": math.nan, "identified": True,
             "paper_inside": None, "reason": ""}]
    paper, neither = pd.DataFrame(rows), _table().assign(active_verdict="inconclusive", total_verdict="A better")
    head = ("Up to 28.9 tokens per parameter, the MoE beats neither dense model on the map. Carried "
            "1.8 decades, the joint law puts the MoE at p = 0.05 [-0.02, 0.13] at the paper's scale, excluding the "
            "paper's 0.81")
    assert G.map_sentence(neither, paper, _forms(True)) == head + " (λ varying with size: p = 0.31 [0.10, 0.52])."
    assert G.map_sentence(neither, paper, _forms(False)) == head + " (λ varying with size: not identified)."
    assert G.map_sentence(neither, paper, _forms(True, chosen="lambda_size")).endswith(" (one λ: p = 0.05 [-0.02, 0.13]).")
    assert G.map_sentence(neither, paper, None) == head + "."
    choice = pd.DataFrame({"form": ["lambda", "multiplier", "multiplier"], "chosen": [False, True, False]})
    assert G.map_sentence(neither, paper, None, choice) == head.replace("the joint law puts",
                                                                        "the joint law (λ as a multiplier, chosen) puts") + "."
    assert G.chosen_form(choice.assign(chosen=False)) == "" and G.chosen_form(None) == ""
    rows[0].update(identified=True, ci_low=math.nan, ci_high=math.nan,
                   reason="lambda held at its bound 0 by the fit" + G.ON_BOUND)
    assert G.map_sentence(neither, pd.DataFrame(rows), _forms(False)).endswith(
        "p = 0.05 at the paper's scale (on the bound, no interval; λ varying with size: not identified).")


def test_the_first_screen_says_the_map_and_the_law_in_plain_sentences():
    rows = [{"quantity": "position", "estimate": 0.05, "ci_low": -0.02, "ci_high": 0.13, "identified": True,
             "paper_inside": False, "reason": ""},
            {"quantity": "decades", "estimate": 1.8, "ci_low": math.nan, "ci_high": math.nan, "identified": True,
             "paper_inside": None, "reason": ""}]
    neither = _table().assign(active_verdict="inconclusive", total_verdict="A better", active_n=math.nan)  # no row
    said = G.law_sentence(pd.DataFrame(rows))
    assert said == ("Carried 1.8 decades to the paper's size, the law fitted to the map puts p at 0.05 [-0.02, 0.13]; "
                    "that excludes the paper's 0.81.")
    assert "λ" not in said and "Holm" not in G.win_clause(neither)  # the methods' names stay folded
    rows[0].update(identified=False)
    assert G.law_sentence(pd.DataFrame(rows)) == ("The law fitted to the map does not pin down p at the paper's size, "
                                                  "1.8 decades beyond it.")
    lead = G.map_glance(neither, None, None)[1]
    assert lead[0] == G.win_clause(neither) and lead[1].startswith("The joint law's answer is missing")
