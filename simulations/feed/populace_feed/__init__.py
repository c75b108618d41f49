"""An OASIS-style microblog as a Populace simulation: agents read a feed ranked for them from
the world's pool of posts, take a stance, and post, like, repost, follow and unfollow; only
some agents act each round, by their persona's activity level."""

from populace_feed.recommender import Ranker, Timeline
from populace_feed.simulation import Action, FeedEnv, Microblog, Pool, User

__all__ = ["Action", "FeedEnv", "Microblog", "Pool", "Ranker", "Timeline", "User"]
