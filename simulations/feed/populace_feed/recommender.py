"""The recommender: each acting agent's feed, the `k` posts of the world's pool that score
highest for it, best first:

    score = (popularity·ln(1 + likes + repost_weight·reposts) + recency) · 2^(−age / half_life)
          + similarity · (1 − |its stance − the post's stance| / (2·scale))
          + interest · cos(its interest vector, the post author's)
          + follow_boost · [it follows the post's author]

never its own posts; equal scores go to the newer post (the higher id). Pure numpy.

With `interest` > 0 every reader's scores are its own (its interest vector): each feed is ranked
over the whole pool with the SDK's toolkit (`populace.sdk.recommend.Ranker`, the stance part as
its per-reader `extra`), a few vector operations per reader. Without it (the default) the rest
of this docstring holds.

A host ranks a round's pool once (`Ranker`) and every acting agent from it. The first two terms
depend only on the post and on the agent's stance, which takes 2·scale + 1 values: each stance's
top `k + EXTRA` posts are ranked once. An agent's feed is then taken from those and from the
posts of the authors it follows (the only ones the boost can raise), which gives exactly the
feed a ranking of the whole pool gives (`rank_whole`, the reference the tests compare with):
a post that is neither its own nor by an author it follows and makes its feed is among the
first `k` of the others in its stance's ranking. An agent with more than EXTRA own posts in
its stance's top list is ranked over the whole pool. An agent that follows no author of the
pool and has no post in that list gets its stance's feed, one object shared by all of them."""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from populace.sdk import recommend

EXTRA = 16  # posts kept per stance beyond k: room for an agent's own posts among them
_NONE = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class Weights:
    k: int
    half_life: float
    popularity: float
    repost_weight: float
    recency: float
    similarity: float
    follow_boost: float
    scale: int
    interest: float = 0.0  # weight of the interest similarity (0: left out)


@dataclass(frozen=True, slots=True)
class Timeline:
    """One agent's feed in one round (its view): its posts, best first, as parallel tuples."""

    round: int
    stance: int  # the agent's last stance, which the similarity is measured from
    post_ids: tuple[int, ...] = ()
    authors: tuple[int, ...] = ()
    stances: tuple[int, ...] = ()
    likes: tuple[int, ...] = ()
    reposts: tuple[int, ...] = ()
    texts: tuple[str, ...] = ()
    followed: tuple[bool, ...] = ()  # whether the agent follows each post's author

    def __len__(self) -> int:
        return len(self.post_ids)


def base_scores(likes: np.ndarray, reposts: np.ndarray, post_round: np.ndarray, now: int, w: Weights) -> np.ndarray:
    """Popularity and recency, decayed with age: the part of a score that is the post's own
    (also what the pool keeps posts by)."""
    age = now - post_round.astype(np.float64)
    engaged = likes.astype(np.float64) + w.repost_weight * reposts.astype(np.float64)
    return (w.popularity * np.log1p(engaged) + w.recency) * np.exp2(-age / w.half_life)


def best_first(scores: np.ndarray, post_ids: np.ndarray, m: int) -> np.ndarray:
    """Indices of the `m` highest scores, best first, equal scores to the higher post id."""
    return recommend.top_k(scores, post_ids, m)


@lru_cache(maxsize=2)  # a host plays a run at a time, mostly: two runs' tables at most (dims bytes an agent each)
def interest_table(seed: int, agents: int, dims: int) -> np.ndarray:
    """Every agent's seeded interest vector (agents × dims, int8), once per process: a reader's
    own and, for a post, its author's (16 bytes an agent at 16 dimensions)."""
    table = recommend.interests(seed, np.arange(agents), dims)
    table.flags.writeable = False
    return table


class _Stance:
    """One stance's ranking of the pool (before follows)."""

    __slots__ = ("authors", "scores", "shared", "top", "values")

    def __init__(self, scores: np.ndarray, top: list[int], authors: Counter, shared: Timeline) -> None:
        self.scores = scores
        self.values: list[float] | None = None  # the scores as Python floats, made when a follow needs them
        self.top, self.authors, self.shared = top, authors, shared


class Ranker:
    """One round's pool, ranked for any agent (see the module's docstring). An agent's own part
    works on a few dozen posts in plain Python: numpy's cost per call is more than the work
    there, and Python's float addition is numpy's float64 addition, so the scores are the same."""

    def __init__(self, round_: int, post_ids: np.ndarray, authors: np.ndarray, post_rounds: np.ndarray,
                 stances: np.ndarray, likes: np.ndarray, reposts: np.ndarray, texts: np.ndarray,
                 weights: Weights, interests: np.ndarray | None = None) -> None:
        """`interests`: every agent's interest vector (`interest_table`), with `weights.interest` > 0."""
        self.round = round_
        self.w = weights
        self.post_ids = np.asarray(post_ids, dtype=np.int64)
        self.authors = np.asarray(authors, dtype=np.int64)
        self.stances = np.asarray(stances, dtype=np.int64)
        self.likes = np.asarray(likes, dtype=np.int64)
        self.reposts = np.asarray(reposts, dtype=np.int64)
        self.texts = texts
        self.base = base_scores(self.likes, self.reposts, np.asarray(post_rounds), round_, weights)
        self._ids, self._authors = self.post_ids.tolist(), self.authors.tolist()
        self._columns = (self._ids, self._authors, self.stances.tolist(), self.likes.tolist(), self.reposts.tolist(),
                         list(texts))
        self.by_author: dict[int, list[int]] = {}  # author -> its posts (indices, ascending)
        for i, a in enumerate(self._authors):
            self.by_author.setdefault(a, []).append(i)
        self._ranked: dict[int, _Stance] = {}
        self.interests = interests
        # with interest, every reader is ranked on its own: by the toolkit's Ranker of its stance
        # (the stance's scores its items' own part, the interest similarity and follow boost its own)
        self._personal: dict[int, recommend.Ranker] | None = None
        if weights.interest > 0:
            if interests is None:
                raise ValueError("interest > 0: the agents' interest vectors are needed (interest_table)")
            self._personal = {}
            self._post_vectors = interests[self.authors]  # a post carries its author's interests

    def scores(self, stance: int) -> np.ndarray:
        """Every post's score for an agent of this stance that follows none of their authors."""
        w = self.w
        return self.base + w.similarity * (1.0 - np.abs(stance - self.stances) / (2.0 * w.scale))

    def _stance(self, stance: int) -> _Stance:
        ranked = self._ranked.get(stance)
        if ranked is None:
            scores = self.scores(stance)
            top = best_first(scores, self.post_ids, self.w.k + EXTRA).tolist()
            shared = self._timeline(stance, top[:self.w.k], [False] * min(self.w.k, len(top)))
            ranked = self._ranked[stance] = _Stance(scores, top, Counter(self._authors[i] for i in top), shared)
        return ranked

    def feed(self, agent: int, stance: int, following: Sequence[int] = ()) -> Timeline:
        """Agent `agent`'s feed: its stance, whom it follows (author ids)."""
        if self._personal is not None:
            return self._ranked_for(agent, stance, following)
        ranked = self._stance(stance)
        by_author = self.by_author
        followed = [i for a in following if a in by_author for i in by_author[a]] if following else ()
        own = ranked.authors.get(agent, 0)
        if not followed and not own:
            return ranked.shared
        k, top, authors, ids = self.w.k, ranked.top, self._authors, self._ids
        if len(top) - own < k and len(top) < len(ids):
            return self._whole(agent, stance, followed)  # its own posts crowd its stance's list
        lifted = set(followed)
        # the stance's order without its own posts and the followed ones, which come back lifted
        rest = [i for i in top if authors[i] != agent and i not in lifted][:k]
        if not followed:
            best = rest
        else:
            values = ranked.values
            if values is None:
                values = ranked.values = ranked.scores.tolist()
            boost = self.w.follow_boost
            keyed = [(values[i], ids[i], i) for i in rest]
            keyed += [(values[i] + boost, ids[i], i) for i in followed if authors[i] != agent]
            keyed.sort(reverse=True)  # score, then the newer post, first
            best = [i for _, _, i in keyed[:k]]
        return self._timeline(stance, best, [i in lifted for i in best])

    def _ranked_for(self, agent: int, stance: int, following: Sequence[int]) -> Timeline:
        """The feed of a reader with its own interests: the whole pool, ranked by the toolkit (which
        scores only the posts that can make the feed: those near the top of its stance's ranking,
        and those of the authors it follows)."""
        assert self._personal is not None and self.interests is not None
        ranker = self._personal.get(stance)
        if ranker is None:
            w = self.w
            ranker = self._personal[stance] = recommend.Ranker(
                self.post_ids, round=self.round, authors=self.authors, vectors=self._post_vectors,
                base=self.scores(stance), mix=recommend.Mix(interest=w.interest, follow=w.follow_boost))
        best = ranker.top(agent, self.w.k, vector=self.interests[agent], following=following).tolist()
        follows = set(following)
        authors = self._authors
        return self._timeline(stance, best, [authors[i] in follows for i in best])

    def _whole(self, agent: int, stance: int, followed: Sequence[int]) -> Timeline:
        """The feed ranked over the whole pool (an agent with many posts of its own)."""
        boosted = np.zeros(self.post_ids.size, dtype=bool)
        boosted[list(followed)] = True
        idx = np.flatnonzero(self.authors != agent)
        scores = self._stance(stance).scores[idx] + self.w.follow_boost * boosted[idx]
        best = idx[np.lexsort((-self.post_ids[idx], -scores))[:self.w.k]].tolist()
        return self._timeline(stance, best, [bool(boosted[i]) for i in best])

    def _timeline(self, stance: int, idx: list[int], followed: list[bool]) -> Timeline:
        if len(idx) >= 2:
            take = operator.itemgetter(*idx)  # each column's posts in one C call
            return Timeline(self.round, stance, *map(take, self._columns), tuple(followed))
        # (itemgetter of one index gives the item, not a tuple)
        return Timeline(self.round, stance, *(tuple(c[i] for i in idx) for c in self._columns), tuple(followed))


def rank_whole(ranker: Ranker, agent: int, stance: int, following: Sequence[int] = ()) -> tuple[int, ...]:
    """The feed's post ids by scoring every post of the pool: the definition `Ranker.feed` keeps
    (slow: for tests)."""
    follows = np.isin(ranker.authors, np.asarray(following, dtype=np.int64))
    scores = ranker.scores(stance)
    if ranker.w.interest > 0:
        assert ranker.interests is not None
        scores = scores + ranker.w.interest * recommend.similarity(ranker.interests[agent],
                                                                   ranker.interests[ranker.authors])
    scores = scores + ranker.w.follow_boost * follows
    mine = ranker.authors == agent
    idx = np.flatnonzero(~mine)
    order = np.lexsort((-ranker.post_ids[idx], -scores[idx]))[:ranker.w.k]
    return tuple(ranker.post_ids[idx[order]].tolist())
