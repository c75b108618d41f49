"""A vote: every agent picks one of several options, optionally over rounds in which it hears
last round's distribution. A Populace simulation like any user's (entry point `vote`)."""

from populace_vote.params import BallotConfig, PromptConfig, VoteParams, option_key
from populace_vote.parsing import lookup_of, parse_choice
from populace_vote.simulation import Choice, Heard, LastRound, Vote, VoteEnv, Voter
from populace_vote.tally import VoteCounts, VoteSummary

__all__ = ["BallotConfig", "Choice", "Heard", "LastRound", "PromptConfig", "Vote", "VoteCounts", "VoteEnv",
           "VoteParams", "VoteSummary", "Voter", "lookup_of", "option_key", "parse_choice"]
