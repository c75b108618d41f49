"""An OASIS-style microblog. The world keeps a pool of posts (id, author, round, stance, likes,
reposts, text) and every agent's last stance. Each round only some agents act (each with the
rate of its persona's activity level). An acting agent reads its own feed — the pool's posts
ranked for it by popularity and recency (both decaying), similarity to its last stance, and a
boost for authors it follows (`populace_feed.recommender`), made on its host — and answers
one structured call: its stance, and optionally a post, a like, a repost, a follow and an
unfollow. Follows are the run's edge edits (kind `follow`), on top of the run's `graph:` if it
has one. The environment adds the round's likes and reposts to the pool, puts the new posts in
and keeps the `pool.size` posts the recommender scores highest next round.

Outcomes (table `feed_outcomes`): each acting agent's stance, post text, the post it liked and
reposted, the author it followed and unfollowed. Summary (table `feed_rounds`): engagement,
polarisation of the stances given, the follow graph's growth and the pool."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import numpy as np
from pydantic import Field

from populace.sdk import LLM, Agent, Env, Outcome, RunConfig, Simulation, State, Summary, select
from populace.sdk.edges import follow, unfollow
from populace.sdk.env import Ints, Partial
from populace.sdk.world import World, column
from populace_feed import parsing, prompts
from populace_feed.params import ANSWER_TOKENS, CHARS_PER_TOKEN, FeedParams
from populace_feed.recommender import Ranker, Timeline, Weights, base_scores, best_first, interest_table

POST_SALT = 0x706F7374  # the seeded order of a round's new posts, apart from activation's draws


class Pool(World):
    last_stance = column("int8", "agents")  # each agent's last valid stance (before its first: a seeded draw)
    post_id = column("int64", "posts")  # ascending
    author = column("int32", "posts")
    posted_in = column("int32", "posts")  # the round it was posted in (0: a seed post)
    stance = column("int8", "posts")  # its author's stance when posting
    likes = column("int64", "posts")
    reposts = column("int64", "posts")
    text = column("string", "posts")


class Action(Outcome):
    stance: int | None = None  # None: no valid answer (it did nothing)
    text: str | None = None  # its post (None: it did not post)
    liked: int | None = None  # the id of the post it liked
    reposted: int | None = None
    followed: int | None = None  # the author it started following
    unfollowed: int | None = None  # the author it stopped following
    measure = "stance"


def _none() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


class Tally(Partial):
    agents: int = 0  # acting agents reduced
    answered: int = 0  # valid answers
    stances: Ints = Field(default_factory=_none)  # how many gave each stance (index: stance + scale)
    voters: Ints = Field(default_factory=_none)  # agents with a valid stance …
    votes: Ints = Field(default_factory=_none)  # … and that stance
    post_authors: Ints = Field(default_factory=_none)
    post_stances: Ints = Field(default_factory=_none)
    post_texts: list[str] = Field(default_factory=list)
    liked: Ints = Field(default_factory=_none)  # post ids (distinct) …
    liked_n: Ints = Field(default_factory=_none)  # … and their likes this round
    reposted: Ints = Field(default_factory=_none)
    reposted_n: Ints = Field(default_factory=_none)
    follows: int = 0  # edge edits made
    unfollows: int = 0


class FeedState(State):
    next_post_id: int = 0
    net_follows: int = 0  # follows minus unfollows since round 1


class RoundSummary(Summary):
    active_share: float | None = Field(None, title="active")  # acting agents / agents
    posts: int = Field(0, title="posts")
    likes: int = Field(0, title="likes")
    reposts: int = Field(0, title="reposts")
    follows: int = Field(0, title="follows")
    unfollows: int = Field(0, title="unfollows")
    net_follows: int = Field(0, title="follows since round 1")  # the follow graph's growth (edits applied)
    pool: int = Field(0, title="posts in the pool")
    pool_new: int = Field(0, title="new posts kept")
    # over the round's valid stances, on the scale's [-1, 1] (stance / scale)
    mean_stance: float | None = Field(None, title="mean stance")
    var_stance: float | None = Field(None, title="stance variance")
    extreme_share: float | None = Field(None, title="extreme stances")  # |stance| = scale
    polarization: float | None = Field(None, title="polarization")  # 2·p₊·p₋·(m₊ − m₋)


class User(Agent):
    """Reads its feed and answers one structured call."""

    __slots__ = ()

    async def turn(self, feed: Timeline, llm: LLM) -> Action:
        sim: Microblog = self.sim  # type: ignore[assignment]
        persona = self.persona.text if sim.use_persona and self.persona is not None else None
        prompt = prompts.user_prompt(persona, sim.topic, feed, sim.scale, sim.post_chars)
        raw = await llm.ask(prompt, key=self.id, prefix_chars=len(persona) if persona else 0,
                            schema=sim.schema_for(len(feed)))
        answer = parsing.parse_answer(raw, sim.scale, sim.post_chars, len(feed))
        if answer is None:
            return Action(raw=raw, valid=False)
        return act(feed, answer, raw)


def act(feed: Timeline, answer: parsing.Answer, raw: str) -> Action:
    """What a valid answer does: a follow of an author it already follows, or an unfollow of
    one it does not, does nothing (so the two never name the same author)."""
    edits = []
    followed = unfollowed = None
    if answer.follow and not feed.followed[answer.follow - 1]:
        followed = feed.authors[answer.follow - 1]
        edits.append(follow(followed))
    if answer.unfollow and feed.followed[answer.unfollow - 1]:
        unfollowed = feed.authors[answer.unfollow - 1]
        edits.append(unfollow(unfollowed))
    return Action(stance=answer.stance, text=answer.post,
                  liked=feed.post_ids[answer.like - 1] if answer.like else None,
                  reposted=feed.post_ids[answer.repost - 1] if answer.repost else None,
                  followed=followed, unfollowed=unfollowed, raw=raw, edits=edits or None)


def _counted(ids: Sequence[int] | np.ndarray, counts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(distinct ids ascending, how many times each), from ids (each `counts` times, default once)."""
    ids = np.asarray(ids, dtype=np.int64)
    if not ids.size:
        return _none(), _none()
    distinct, where = np.unique(ids, return_inverse=True)
    n = np.zeros(distinct.size, dtype=np.int64)
    np.add.at(n, where, 1 if counts is None else counts)
    return distinct, n


def _concat(arrays: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays).astype(np.int64, copy=False) if arrays else _none()


class FeedEnv(Env[FeedState, Tally]):
    State = FeedState
    Partial = Tally
    World = Pool
    shown_items = "post_id"  # each reader's feed is recorded in table `shown` (recommender.record_shown)

    def __init__(self, sim: Microblog) -> None:
        super().__init__(sim)
        p = sim.params
        r = p.recommender
        self.scale = p.stance.scale
        self.weights = Weights(r.k, r.half_life, r.popularity, r.repost_weight, r.recency, r.similarity,
                               r.follow_boost, self.scale, r.interest)
        self.record_shown = r.record_shown
        self._ranker: tuple[Pool, int, Ranker] | None = None  # this host's ranking of the round's pool

    def start(self) -> FeedState:
        return FeedState(next_post_id=self.params.pool.seed_posts)

    def start_world(self, state: FeedState) -> Pool:
        n, s, m = self.sim.agents, self.scale, self.params.pool.seed_posts
        rng = np.random.default_rng(self.sim.rng("pool").getrandbits(64))
        last = rng.integers(-s, s + 1, n).astype(np.int8)
        author = rng.integers(0, n, m)
        stance = last[author]
        likes = np.minimum(rng.zipf(2.0, m) - 1, 1000)  # a few popular seed posts, most never liked
        said = {v: prompts.seed_text(v, s, self.params.stance.topic) for v in range(-s, s + 1)}
        return Pool({"agents": n, "posts": m}, last_stance=last, post_id=np.arange(m), author=author,
                    posted_in=np.zeros(m, np.int32), stance=stance, likes=likes, reposts=np.zeros(m, np.int64),
                    text=[said[v] for v in stance.tolist()])

    def select(self, state: FeedState, round: int) -> select.RateBy:
        a = self.params.activity
        return select.rate_by(a.attribute, a.rates, default=a.default)

    def view(self, world: Pool, round: int, agent_id: int) -> Timeline:
        # the round's pool is ranked once per host (per stance, lazily); each agent from that
        cached = self._ranker
        if cached is None or cached[0] is not world or cached[1] != round:
            w = self.weights
            interests = interest_table(self.sim.seed, self.sim.agents, self.params.recommender.interest_dims) \
                if w.interest > 0 else None
            ranker = Ranker(round, world.post_id, world.author, world.posted_in, world.stance, world.likes,
                            world.reposts, world.text, w, interests)
            cached = self._ranker = (world, round, ranker)
        sim = self.sim
        # whom it follows: the run's graph and its own edits, on its host (None: a unit test's bare env)
        following = sim.following(agent_id) if sim.edges is not None else ()
        feed = cached[2].feed(agent_id, int(world.last_stance[agent_id]), following)
        if self.record_shown:
            self.show(agent_id, feed.post_ids)  # who saw what: its posts, best first (ranks 1..k)
        return feed

    def reduce(self, agent_ids: Sequence[int], outcomes: Sequence[Action]) -> Tally:
        voters, votes, authors, stances, texts, liked, reposted = [], [], [], [], [], [], []
        follows = unfollows = 0
        for aid, o in zip(agent_ids, outcomes):
            for e in o.edits or ():
                if e.op == "add":
                    follows += 1
                else:
                    unfollows += 1
            if not o.valid or o.stance is None:
                continue
            voters.append(aid)
            votes.append(o.stance)
            if o.text is not None:
                authors.append(aid)
                stances.append(o.stance)
                texts.append(o.text)
            if o.liked is not None:
                liked.append(o.liked)
            if o.reposted is not None:
                reposted.append(o.reposted)
        hist = np.bincount(np.asarray(votes, dtype=np.int64) + self.scale, minlength=2 * self.scale + 1)
        (liked, liked_n), (reposted, reposted_n) = _counted(liked), _counted(reposted)
        return Tally(agents=len(outcomes), answered=len(voters), stances=hist, voters=np.asarray(voters, np.int64),
                     votes=np.asarray(votes, np.int64), post_authors=np.asarray(authors, np.int64),
                     post_stances=np.asarray(stances, np.int64), post_texts=texts, liked=liked, liked_n=liked_n,
                     reposted=reposted, reposted_n=reposted_n, follows=follows, unfollows=unfollows)

    def merge(self, partials: Sequence[Tally]) -> Tally:
        hist = np.zeros(2 * self.scale + 1, dtype=np.int64)
        for p in partials:
            if p.stances.size:
                hist += p.stances
        liked = _counted(_concat([p.liked for p in partials]), _concat([p.liked_n for p in partials]))
        reposted = _counted(_concat([p.reposted for p in partials]), _concat([p.reposted_n for p in partials]))
        return Tally(agents=sum(p.agents for p in partials), answered=sum(p.answered for p in partials),
                     stances=hist, voters=_concat([p.voters for p in partials]),
                     votes=_concat([p.votes for p in partials]),
                     post_authors=_concat([p.post_authors for p in partials]),
                     post_stances=_concat([p.post_stances for p in partials]),
                     post_texts=[t for p in partials for t in p.post_texts],
                     liked=liked[0], liked_n=liked[1], reposted=reposted[0], reposted_n=reposted[1],
                     follows=sum(p.follows for p in partials), unfollows=sum(p.unfollows for p in partials))

    def decide(self, state: FeedState, round: int, total: Tally, world: Pool) -> tuple[FeedState, RoundSummary, Pool]:
        ids = world.post_id
        likes, reposts = world.likes.copy(), world.reposts.copy()
        for what, posts, counts, column_ in (("liked", total.liked, total.liked_n, likes),
                                              ("reposted", total.reposted, total.reposted_n, reposts)):
            if posts.size:
                at = np.minimum(np.searchsorted(ids, posts), max(ids.size - 1, 0))
                stray = posts[(ids.size == 0) | (ids[at] != posts)] if ids.size else posts
                if stray.size:  # a feed holds only the round's pool: this is a bug, never skipped
                    raise ValueError(f"{what}: post {int(stray[0])} is not in round {round}'s pool")
                column_[at] += counts
        # the round's posts, numbered in a seeded order (not by author: equal scores go to the
        # higher id, and a low agent id must not lose every tie)
        authors = total.post_authors
        order = np.lexsort((authors, select.uniform(self.sim.seed, round, authors, POST_SALT)))
        new = authors.size
        post_id = np.concatenate([ids, state.next_post_id + np.arange(new, dtype=np.int64)])
        author = np.concatenate([world.author, authors[order]])
        posted_in = np.concatenate([world.posted_in, np.full(new, round, np.int32)])
        stance = np.concatenate([world.stance, total.post_stances[order]])
        likes = np.concatenate([likes, np.zeros(new, np.int64)])
        reposts = np.concatenate([reposts, np.zeros(new, np.int64)])
        text = np.concatenate([world.text, np.asarray(total.post_texts, dtype=object)[order]]) if new else world.text
        # the pool keeps the posts the recommender scores highest next round (before stance and follows)
        keep = np.sort(best_first(base_scores(likes, reposts, posted_in, round + 1, self.weights), post_id,
                                  self.params.pool.size))
        last = world.last_stance.copy()
        last[total.voters] = total.votes
        pool = world.replace(sizes={"agents": world.sizes["agents"], "posts": int(keep.size)}, last_stance=last,
                             post_id=post_id[keep], author=author[keep], posted_in=posted_in[keep],
                             stance=stance[keep], likes=likes[keep], reposts=reposts[keep], text=text[keep])
        net = state.net_follows + total.follows - total.unfollows
        summary = RoundSummary(
            active_share=total.agents / self.sim.agents, posts=new, likes=int(total.liked_n.sum()),
            reposts=int(total.reposted_n.sum()), follows=total.follows, unfollows=total.unfollows, net_follows=net,
            pool=int(keep.size), pool_new=int((keep >= ids.size).sum()), **polarisation(total.stances, self.scale))
        return FeedState(next_post_id=state.next_post_id + new, net_follows=net), summary, pool


def polarisation(hist: np.ndarray, scale: int) -> dict[str, float | None]:
    """Mean, variance, extreme share and camp polarisation of the stances counted in `hist`
    (index: stance + scale), on [-1, 1]: exact fractions of integer counts, then floats."""
    counts = [int(c) for c in hist] if hist.size else []
    n = sum(counts)
    if n == 0:
        return {"mean_stance": None, "var_stance": None, "extreme_share": None, "polarization": None}
    values = [Fraction(v - scale, scale) for v in range(len(counts))]
    mean = sum(c * x for c, x in zip(counts, values)) / n
    var = sum(c * x * x for c, x in zip(counts, values)) / n - mean * mean
    extreme = Fraction(counts[0] + counts[-1], n)
    pos = [(c, x) for c, x in zip(counts, values) if x > 0]
    neg = [(c, x) for c, x in zip(counts, values) if x < 0]
    n_pos, n_neg = sum(c for c, _ in pos), sum(c for c, _ in neg)
    polar = Fraction(0)
    if n_pos and n_neg:
        m_pos = sum(c * x for c, x in pos) / n_pos
        m_neg = sum(c * x for c, x in neg) / n_neg
        polar = 2 * Fraction(n_pos, n) * Fraction(n_neg, n) * (m_pos - m_neg)
    return {"mean_stance": float(mean), "var_stance": float(var), "extreme_share": float(extreme),
            "polarization": float(polar)}


class Microblog(Simulation):
    name = "feed"
    Params = FeedParams
    Agent = User
    Env = FeedEnv
    Outcome = Action
    Summary = RoundSummary
    edge_kinds = ("follow",)
    prompt_version = prompts.PROMPT_VERSION
    trend_columns = ("mean_stance", "polarization", "extreme_share")

    def __init__(self, params: FeedParams, **kw) -> None:
        super().__init__(params, **kw)
        self.scale = params.stance.scale
        self.topic = params.stance.topic
        self.post_chars = params.prompt.post_chars
        self.use_persona = params.prompt.persona
        self.k = params.recommender.k
        self.schema = prompts.answer_schema(self.scale, self.post_chars, self.k)
        self._schemas: dict[int, dict] = {self.k: self.schema}

    def schema_for(self, posts: int) -> dict:
        """The answer's schema for a feed of `posts` posts (shorter than k only while the pool is
        small): one object per length, so the model's batches and compiled grammars are shared."""
        schema = self._schemas.get(posts)
        if schema is None:
            schema = self._schemas[posts] = prompts.answer_schema(self.scale, self.post_chars, posts)
        return schema

    def world_sizes(self) -> dict[str, int]:
        """Its world's sizes before the run: the pool keeps at most `pool.size` posts (the memory check)."""
        return {"agents": self.agents, "posts": self.params.pool.size}

    def system_prompt(self) -> str:
        return prompts.system_prompt(self.scale, self.post_chars)

    def answer_schema(self) -> dict:
        return self.schema

    def user_example(self) -> str:
        env = FeedEnv(self)
        feed = env.view(env.start_world(env.start()), 1, 0)
        persona = self.cast.personas[0].text if self.cast is not None and self.use_persona else None
        return prompts.user_prompt(persona, self.topic, feed, self.scale, self.post_chars)

    @classmethod
    def model_defaults(cls, params: FeedParams) -> dict:
        return {"max_tokens": ANSWER_TOKENS + -(-params.prompt.post_chars // CHARS_PER_TOKEN)}

    @classmethod
    def check_run(cls, params: FeedParams, config: RunConfig) -> None:
        if config.agents < 2:
            raise ValueError("agents: feed needs at least 2 agents (someone to follow)")

    @classmethod
    def measure_range(cls, params: FeedParams) -> tuple[float, float]:
        return float(-params.stance.scale), float(params.stance.scale)

    @classmethod
    def describe(cls, params: FeedParams) -> str:
        p, r, a = params.pool, params.recommender, params.activity
        return (f"a microblog on “{params.stance.topic}”: feeds of {r.k} from a pool of {p.size:,} posts, stances "
                f"-{params.stance.scale}..{params.stance.scale}, activity by persona `{a.attribute}` "
                f"(otherwise {a.default:g} a round)")
