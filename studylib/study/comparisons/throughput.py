"""Notebook 05, throughput: the headline trio benchmarked (``study.bench``); it trains nothing."""
from studylib.study.comparisons.base import Comparison

COMPARISON = Comparison("throughput", "05_throughput", section="throughput")
