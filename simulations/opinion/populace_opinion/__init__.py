"""Opinion dynamics on a social graph: every agent takes a stance on a statement, in [-1, 1],
and posts one sentence; in a run with a `graph:` it hears its in-neighbours' posts of the
round before. A Populace simulation like any user's (entry point `opinion`)."""

from populace_opinion.hearing import BROADCAST, Listened, Reading
from populace_opinion.measures import OpinionSummary, StanceSums
from populace_opinion.params import OpinionParams, PromptConfig
from populace_opinion.parsing import Answer, parse_answer
from populace_opinion.simulation import Discussant, Opinion, OpinionEnv, Say, Stance

__all__ = ["BROADCAST", "Answer", "Discussant", "Listened", "Opinion", "OpinionEnv", "OpinionParams",
           "OpinionSummary", "PromptConfig", "Reading", "Say", "Stance", "StanceSums", "parse_answer"]
