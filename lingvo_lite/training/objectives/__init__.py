"""Training objectives: one module each (lm: the next-token loss; dpo: DPO on preference pairs;
multi_token: the next-token loss with DeepSeek-V3's multi-token modules'),
each a config part that `train.objective` holds (objective.py says what one declares).

A job's eval set is scored by the job's own objective where it reads the set's rows; else by
the first of `SCORERS` that does, with its default settings (a language-modelling job's set of
preference pairs gets DPO's measures against its reference, or against itself).
"""

from __future__ import annotations

from typing import Any

from lingvo_lite.training.objectives.dpo import Dpo
from lingvo_lite.training.objectives.lm import LanguageModelling
from lingvo_lite.training.objectives.multi_token import MultiTokenPrediction
from lingvo_lite.training.objectives.objective import Objective

# The objectives that score an eval set of their rows in a job whose objective reads others.
SCORERS: tuple[type[Objective], ...] = (LanguageModelling, Dpo)
__all__ = ["Dpo", "LanguageModelling", "MultiTokenPrediction", "Objective", "SCORERS", "scorer"]


def scorer(objective: Objective, source: Any) -> Objective:
  """The objective that scores eval set `source` in a job trained with `objective`."""
  if objective.scores(source):
    return objective
  for kind in SCORERS:
    if kind().scores(source):
      return kind()
  return objective  # No other reads it: the job's own, whose sums name what they miss.
