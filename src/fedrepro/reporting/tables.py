"""Conventions every paper's tables share: the two scales, metric labels and the rank marks.

A paper's own tables and figures are built in ``fedrepro.papers.<paper>.report``; the paper's
numbers always come from the packaged reference CSV (:mod:`fedrepro.reporting.reference`).
"""

from __future__ import annotations

SCALES = ("demo", "paper")
"""``demo``: tiny models on generated samples (never comparable to the paper); ``paper``."""

ROUGE_KEYS = ("rouge1", "rouge2", "rougeL")
METRIC_LABELS = {"rouge1": "R-1", "rouge2": "R-2", "rougeL": "R-L"}
"""Reference-CSV metric name -> column label used in the tables."""

DAGGER = "†"
DOUBLE_DAGGER = "††"
"""Marks of the best and second-best value in a column, as the papers print them."""
RANK_DECIMALS = 2
"""Means are ranked after rounding to the precision the tables display."""
