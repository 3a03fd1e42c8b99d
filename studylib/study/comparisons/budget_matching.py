"""Notebook 01, budget matching: the preset's models counted and their budgets laid out; it
trains nothing."""
from studylib.study.comparisons.base import Comparison

COMPARISON = Comparison("budget_matching", "01_budget_matching")
