"""A small recommender toolkit: the parts of a feed's ranking — random, recency, hot score,
interest similarity on vectors, a boost for followed authors — as pure numpy functions, and a
`Ranker` that mixes them for one round's items and ranks them for any reader. Use it, mix the
parts yourself, or replace it: a view only has to return what the agent reads (and `show` it).

    ranker = Ranker(post_ids, round=round, mix=Mix(hot=1.0, interest=2.0, follow=1.0), seed=self.sim.seed,
                    authors=authors, posted_in=posted_in, likes=likes, vectors=post_vectors)   # once a round
    best = ranker.top(agent_id, k=10, vector=my_vector, following=self.sim.following(agent_id))

Every part is exact and the same on every host, whatever else that host ranks, so a run gives
identical feeds on one host or many:

- `random_scores`: a seeded uniform draw per (run seed, round, reader, item) — not per arrival;
- `recency`: 2^(−age / half_life), 1 for an item of the round itself;
- `hot`: Reddit's hot score as OASIS ranks by it, in rounds: sign(s)·log10(max(|s|, 1)) +
  posted_in / period, s = likes − dislikes (an item `period` rounds newer counts as ten times the votes);
- `similarity`: cosine similarity of a reader's interest vector to each item's. Vectors are int8
  (−127..127; `quantize` turns float embeddings into them, `interests` draws seeded ones): their
  dot products are whole numbers a float computes exactly in any order, so one reader at a time
  or a matrix of them (`similarity_rows`) give the very same scores;
- `Ranker.top`: the `k` best items, best first, equal scores to the higher id, never the reader's
  own items (by default).

Cost: a reader's ranking is a few vector operations over the items that can make its top k
(`Ranker.top`: those whose own part is near the best, and those of authors it follows; every
item at worst, ~50 µs for 10,000 items of 16 dimensions). Compute what depends only on the items
once per round (the `Ranker`), never per reader.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields

import numpy as np

from populace.sdk.select import uniform

RANDOM_SALT = 0x72616E64  # the random recommender's draws, apart from activation's
INTEREST_SALT = 0x696E7472  # seeded interest vectors
# float32 adds whole numbers below 2^24 exactly: int8 vectors of up to this many dimensions
EXACT_F32_DIMS = (1 << 24) // (127 * 127)
_NONE = np.zeros(0, dtype=np.int64)
# A Ranker scores only the items that can make a reader's top k once it has this many times k items
_PRUNE_FROM = 8


class RecommendError(ValueError):
    """Input the toolkit cannot rank (the message names the argument)."""


# -- scores: one value per item, higher is better ------------------------------------------------
def random_scores(seed: int, round_: int, reader: int, ids: np.ndarray) -> np.ndarray:
    """A uniform draw in [0, 1) per item, seeded by (seed, round, reader, item id)."""
    return uniform(seed, round_, np.asarray(ids, dtype=np.int64), RANDOM_SALT + int(reader) * 0x9E3779B1)


def recency(posted_in: np.ndarray, now: int, half_life: float) -> np.ndarray:
    """2^(−age / half_life), age = now − the round an item was posted in (1: posted this round)."""
    if not half_life > 0:
        raise RecommendError(f"half_life: {half_life!r} must be > 0 (rounds for a score to halve)")
    return np.exp2(-(now - np.asarray(posted_in, dtype=np.float64)) / half_life)


def hot(likes: np.ndarray, posted_in: np.ndarray, period: float = 1.0, dislikes: np.ndarray | None = None
        ) -> np.ndarray:
    """Reddit's hot score (OASIS's): sign(s)·log10(max(|s|, 1)) + posted_in / period, s = likes −
    dislikes; an item `period` rounds newer counts as ten times the net votes."""
    if not period > 0:
        raise RecommendError(f"period: {period!r} must be > 0 (rounds worth a tenfold score)")
    s = np.asarray(likes, dtype=np.float64)
    if dislikes is not None:
        s = s - np.asarray(dislikes, dtype=np.float64)
    return np.sign(s) * np.log10(np.maximum(np.abs(s), 1.0)) + np.asarray(posted_in, dtype=np.float64) / period


def _int8(where: str, vectors: np.ndarray, ndim: int) -> np.ndarray:
    v = np.asarray(vectors)
    if v.ndim != ndim:
        raise RecommendError(f"{where}: {'a vector' if ndim == 1 else 'a matrix of vectors'} of int8, "
                             f"not an array of shape {v.shape}")
    if v.dtype != np.int8:
        if v.size and (v.dtype.kind not in "iu" or v.min() < -127 or v.max() > 127):
            raise RecommendError(f"{where}: int8 values (-127..127; quantize() turns floats into them), "
                                 f"not {v.dtype}")
        v = v.astype(np.int8)
    return v


def norms(vectors: np.ndarray) -> np.ndarray:
    """Each int8 vector's length (exact: the square root of a whole number)."""
    v = _int8("vectors", vectors, 2).astype(np.int64)
    return np.sqrt((v * v).sum(axis=1).astype(np.float64))


def _float(v: np.ndarray) -> np.ndarray:
    """int8 vectors as floats whose products and sums stay exact whole numbers: float32 (its
    matrix-vector product stays on one core and is twice float64's speed) while they can."""
    return v.astype(np.float32 if v.shape[-1] <= EXACT_F32_DIMS else np.float64)


def _denominators(item_norms: np.ndarray) -> np.ndarray:
    """Item norms with a zero vector's as inf, so its cosine is 0 (0 / inf) with no branch."""
    return np.where(item_norms > 0, item_norms, np.inf)


def _cosines(r: np.ndarray, floats: np.ndarray, denominators: np.ndarray) -> np.ndarray:
    """One reader's cosines, (dot / |v|) / |r| — the one formula `similarity_rows` uses too —
    as a new array (the caller may change it in place)."""
    r64 = r.astype(np.int64)
    rn = float(np.sqrt(float(r64 @ r64)))
    if rn == 0.0:
        return np.zeros(floats.shape[0], dtype=np.float64)
    out = (floats @ r.astype(floats.dtype)).astype(np.float64)
    out /= denominators
    out /= rn
    return out


def similarity(vector: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """Cosine similarity of one reader's int8 vector to each item's (0 where either is all
    zeros). For many readers of one round's items, a `Ranker` keeps what depends on the items."""
    r = _int8("vector", vector, 1)
    m = _int8("vectors", vectors, 2)
    if m.shape[1] != r.size:
        raise RecommendError(f"vector: {r.size} dimensions, but the items have {m.shape[1]}")
    return _cosines(r, _float(m), _denominators(norms(m)))


def similarity_rows(readers: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """`similarity` for many readers at once: a (readers × items) matrix, each row exactly the
    one `similarity` gives that reader."""
    r = _int8("readers", readers, 2)
    m = _int8("vectors", vectors, 2)
    if m.shape[1] != r.shape[1]:
        raise RecommendError(f"readers: {r.shape[1]} dimensions, but the items have {m.shape[1]}")
    floats = _float(m)
    rn = norms(r)
    dots = (r.astype(floats.dtype) @ floats.T).astype(np.float64)
    out = dots / _denominators(norms(m))[None, :]
    with np.errstate(invalid="ignore", divide="ignore"):  # a zero reader's row (0 / 0): set to 0 below
        out /= rn[:, None]
    out[rn == 0.0] = 0.0
    return out


def quantize(vectors: np.ndarray) -> np.ndarray:
    """Float vectors (embeddings) as int8 vectors of nearly the same direction: each row scaled
    so its largest magnitude is 127, then rounded (an all-zero row stays zero)."""
    v = np.asarray(vectors, dtype=np.float64)
    if v.ndim not in (1, 2) or not np.isfinite(v).all():
        raise RecommendError("vectors: a vector or a matrix of finite numbers")
    top = np.abs(v).max(axis=-1, keepdims=True) if v.size else np.ones(v.shape[:-1] + (1,))
    scale = np.divide(127.0, top, out=np.zeros_like(top), where=top > 0)
    return np.rint(v * scale).astype(np.int8)


def interests(seed: int, ids: Sequence[int] | np.ndarray, dims: int) -> np.ndarray:
    """A seeded int8 interest vector per id ((ids × dims), each value uniform on -127..127): the
    same for an agent on every host, drawn without per-agent state."""
    if not 1 <= dims <= 4096:
        raise RecommendError(f"dims: {dims!r} must be 1 to 4096")
    a = np.asarray(ids, dtype=np.int64).reshape(-1)
    out = np.empty((a.size, dims), dtype=np.int8)
    step = max(1, (1 << 20) // dims)  # ~1M draws at a time: a million agents' vectors without a GB of temporaries
    for at in range(0, a.size, step):
        part = a[at:at + step]
        flat = (part[:, None] * dims + np.arange(dims, dtype=np.int64)).reshape(-1)
        u = uniform(seed, 0, flat, INTEREST_SALT)
        out[at:at + step] = (np.floor(u * 255.0) - 127.0).astype(np.int8).reshape(part.size, dims)
    return out


# -- picking ---------------------------------------------------------------------------------------
def top_k(scores: np.ndarray, ids: np.ndarray, k: int) -> np.ndarray:
    """Indices of the `k` highest scores, best first, equal scores to the higher id; an item
    scored -inf (excluded) is never picked, so fewer than `k` may come back."""
    n = scores.size
    if k <= 0 or n == 0:
        return _NONE
    if k < n:
        threshold = np.partition(scores, n - k)[n - k]  # the k-th highest
        idx = np.flatnonzero(scores >= threshold)  # ties at the threshold all stay, then cut in order
    else:
        idx = np.arange(n)
    picked = scores[idx]
    if picked.min() == -np.inf:  # fewer than k items may be picked
        idx, picked = idx[picked > -np.inf], picked[picked > -np.inf]
    return idx[np.lexsort((-ids[idx], -picked))][:k]


# -- a ready mix ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Mix:
    """Weights of the parts of a score (each >= 0; 0: left out):

        score = random·U + recency·2^(−age/half_life) + hot·hot(likes, posted_in, period)
              + interest·cos(reader, item) + follow·[the reader follows its author] (+ the caller's own)

    `Mix.of("hot")` (or "random", "recency", "interest"): that part alone, as OASIS's selectable
    recommenders are."""

    random: float = 0.0
    recency: float = 0.0
    hot: float = 0.0
    interest: float = 0.0
    follow: float = 0.0
    half_life: float = 2.0  # rounds for recency to halve
    period: float = 1.0  # rounds for hot's recency to be worth tenfold votes

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or value < 0:
                raise RecommendError(f"mix.{f.name}: {value!r} must be a finite number >= 0")
        for name in ("half_life", "period"):
            if not getattr(self, name) > 0:
                raise RecommendError(f"mix.{name}: must be > 0")

    @classmethod
    def of(cls, name: str, **weights: float) -> Mix:
        parts = ("random", "recency", "hot", "interest")
        if name not in parts:
            raise RecommendError(f"recommender {name!r}: one of {', '.join(parts)}")
        return cls(**{name: 1.0, **weights})


class Ranker:
    """One round's items, ranked for any reader (see the module's docstring). Item-only parts
    (recency, hot, the caller's `base`) are summed once; a reader adds its own (random draws,
    interest similarity, the follow boost, the caller's `extra`) over the items, then `top_k`.

    Arrays are per item, in one order: `ids` (whole numbers, distinct), `authors` (for the
    follow boost and to leave out a reader's own items), `posted_in` (recency, hot), `likes` and
    `dislikes` (hot), `vectors` (int8, items × dims: interest), `base` (any item-only score)."""

    def __init__(self, ids: Sequence[int] | np.ndarray, *, round: int, mix: Mix, seed: int = 0,
                 authors: Sequence[int] | np.ndarray | None = None,
                 posted_in: Sequence[int] | np.ndarray | None = None,
                 likes: Sequence[int] | np.ndarray | None = None, dislikes: Sequence[int] | np.ndarray | None = None,
                 vectors: np.ndarray | None = None, base: np.ndarray | None = None) -> None:
        self.ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        n = self.ids.size
        self.round, self.mix, self.seed = round, mix, seed

        def per_item(name: str, value, dtype) -> np.ndarray | None:
            if value is None:
                return None
            arr = np.asarray(value, dtype=dtype)
            if arr.shape[:1] != (n,):
                raise RecommendError(f"{name}: {arr.shape[0] if arr.ndim else 0} values for {n} items")
            return arr

        self.authors = per_item("authors", authors, np.int64)
        posted = per_item("posted_in", posted_in, np.float64)
        for need, arr, what in (("recency", posted, "posted_in"), ("hot", posted, "posted_in"),
                                ("hot", likes, "likes"), ("interest", vectors, "vectors"),
                                ("follow", authors, "authors")):
            if getattr(mix, need) and arr is None:
                raise RecommendError(f"{what}: the mix weighs {need}, which needs it")
        total = np.zeros(n, dtype=np.float64)
        if base is not None:
            total += per_item("base", base, np.float64)
        if mix.recency:
            total += mix.recency * recency(posted, round, mix.half_life)
        if mix.hot:
            total += mix.hot * hot(per_item("likes", likes, np.float64), posted, mix.period,
                                   per_item("dislikes", dislikes, np.float64))
        if np.isnan(total).any() or (total == np.inf).any():
            raise RecommendError("base: every item's own score must be a number (-inf leaves an item out)")
        self.base = total
        self._no_base = base is None and not mix.recency and not mix.hot  # every item's own part is 0
        self._sorted: _ByBase | None = None  # the items by their own part, made when first needed
        self.vectors = _int8("vectors", vectors, 2) if vectors is not None else None
        if self.vectors is not None and self.vectors.shape[0] != n:
            raise RecommendError(f"vectors: {self.vectors.shape[0]} vectors for {n} items")
        if self.vectors is not None and mix.interest:  # what a reader's cosines need of the items, once
            self._floats, self._denominators = _float(self.vectors), _denominators(norms(self.vectors))
        self._by_author: dict[int, list[int]] | None = None

    def __len__(self) -> int:
        return int(self.ids.size)

    def of_authors(self, authors: Iterable[int]) -> list[int]:
        """Indices of the items by these authors (an index of authors is built once a round)."""
        by = self._by_author
        if by is None:
            if self.authors is None:
                raise RecommendError("authors: the items' authors are not given")
            by = self._by_author = {}
            for i, a in enumerate(self.authors.tolist()):
                by.setdefault(a, []).append(i)
        return [i for a in authors for i in by.get(a, ())]

    def scores(self, reader: int, *, vector: np.ndarray | None = None, following: Iterable[int] = (),
               extra: np.ndarray | None = None) -> np.ndarray:
        """Every item's score for `reader` (its interest `vector`, the authors it follows, and any
        per-reader `extra` of the caller's, added first). Do not change it in place: it may be
        the ranker's own array, or `extra`."""
        return self._scores(reader, vector, following, extra)[0]

    def _scores(self, reader: int, vector: np.ndarray | None, following: Iterable[int],
                extra: np.ndarray | None) -> tuple[np.ndarray, bool]:
        """(the scores, whether they are a new array). Each part is added as `s + w·part`, in this
        order, computed in place on the part's own new array (IEEE addition commutes exactly)."""
        mix = self.mix
        if extra is None:
            s, fresh = self.base, False
        elif self._no_base:
            s, fresh = extra, False  # 0 + extra is extra
        else:
            s, fresh = self.base + extra, True
        if mix.random:
            part = random_scores(self.seed, self.round, reader, self.ids)
            part *= mix.random
            part += s
            s, fresh = part, True
        if mix.interest:
            if vector is None:
                raise RecommendError("vector: the mix weighs interest, which needs the reader's vector")
            r = _int8("vector", vector, 1)
            if r.size != self._floats.shape[1]:
                raise RecommendError(f"vector: {r.size} dimensions, but the items have {self._floats.shape[1]}")
            part = _cosines(r, self._floats, self._denominators)
            part *= mix.interest
            part += s
            s, fresh = part, True
        if mix.follow:
            at = self.of_authors(following)
            if at:
                if not fresh:
                    s, fresh = s.copy(), True
                s[at] += mix.follow
        return s, fresh

    def top(self, reader: int, k: int, *, vector: np.ndarray | None = None, following: Iterable[int] = (),
            extra: np.ndarray | None = None, own: bool = False) -> np.ndarray:
        """Indices of the `k` best items for `reader`, best first (equal scores: the higher id);
        its own items left out unless `own`.

        Without `extra`, only the items that can make the top `k` are scored: a reader's own parts
        add at most `random + interest` (follow apart), so an item whose own part is more than that
        below a lower bound of the k-th best score (the exact scores of the items best by their own
        part) cannot; the items of the authors it follows are always scored. The same result as
        scoring every item (`top_k` of `scores`), for a fraction of the work when the items' own
        parts spread wider than a reader's."""
        if extra is None and k > 0 and self.ids.size > _PRUNE_FROM * k:
            picked = self._top_pruned(reader, k, vector, following, own)
            if picked is not None:
                return picked
        s, fresh = self._scores(reader, vector, following, extra)
        if not own and self.authors is not None:
            mine = self.of_authors((reader,))
            if mine:
                if not fresh:
                    s = s.copy()
                s[mine] = -np.inf
        return top_k(s, self.ids, k)

    def _reader(self, vector: np.ndarray | None) -> np.ndarray | None:
        if not self.mix.interest:
            return None
        if vector is None:
            raise RecommendError("vector: the mix weighs interest, which needs the reader's vector")
        r = _int8("vector", vector, 1)
        if r.size != self._floats.shape[1]:
            raise RecommendError(f"vector: {r.size} dimensions, but the items have {self._floats.shape[1]}")
        return r

    def _exact(self, reader: int, r: np.ndarray | None, base: np.ndarray, ids: np.ndarray,
               floats: np.ndarray | None, denominators: np.ndarray | None) -> np.ndarray:
        """Some items' scores before the follow boost, each exactly the float `_scores` gives it
        (every operation is per item, in the same order)."""
        mix = self.mix
        s = base
        if mix.random:
            part = random_scores(self.seed, self.round, reader, ids)
            part *= mix.random
            part += s
            s = part
        if r is not None:
            part = _cosines(r, floats, denominators)  # type: ignore[arg-type]
            part *= mix.interest
            part += s
            s = part
        return s if s is not base else base.copy()

    def _top_pruned(self, reader: int, k: int, vector: np.ndarray | None, following: Iterable[int],
                    own: bool) -> np.ndarray | None:
        """`top` scoring only the items that can make it (see `top`); None: no bound found (fewer
        than k items among the first ones it scores), so every item is scored."""
        mix = self.mix
        r = self._reader(vector)
        srt = self._by_base()
        n = self.ids.size
        followed = np.unique(np.asarray(self.of_authors(following) if mix.follow else [], dtype=np.int64))
        mine = np.asarray(self.of_authors((reader,)) if not own and self.authors is not None else [], dtype=np.int64)

        def scored(m: int) -> np.ndarray:
            """The exact scores of the first m items by their own part (follow boost and own items included)."""
            s = self._exact(reader, r, srt.base[:m], srt.ids[:m], srt.floats[:m] if r is not None else None,
                            srt.denominators[:m] if r is not None else None)
            if followed.size:
                at = srt.position[followed]
                at = at[at < m]
                s[at] += mix.follow
            if mine.size:
                at = srt.position[mine]
                s[at[at < m]] = -np.inf
            return s

        head = scored(min(n, 2 * k + 8 + mine.size))
        if int(np.count_nonzero(head > -np.inf)) < k:
            return None
        bound = float(np.partition(head, head.size - k)[head.size - k])  # the k-th best of these: <= the true one
        up = mix.random + mix.interest * (1 + 1e-9)  # the most a reader's own parts add (follow apart)
        margin = 1e-9 * max(1.0, abs(bound), abs(float(srt.base[0])))  # floats' rounding, generously
        # the items whose own part is at least bound − up: a prefix of the order (srt.negated ascends)
        m = int(np.searchsorted(srt.negated, -(bound - up - margin), side="right"))
        s = scored(max(m, head.size))
        m = s.size
        ids, index = srt.ids[:m], srt.order[:m]
        if followed.size:  # the followed beyond the prefix: scored apart, boost included
            out = followed[srt.position[followed] >= m]
            if mine.size and out.size:
                out = out[~np.isin(out, mine)]
            if out.size:
                extra = self._exact(reader, r, self.base[out], self.ids[out],
                                    self._floats[out] if r is not None else None,
                                    self._denominators[out] if r is not None else None)
                extra += mix.follow
                s, ids, index = np.concatenate([s, extra]), np.concatenate([ids, self.ids[out]]), \
                    np.concatenate([index, out])
        return index[top_k(s, ids, k)]

    def _by_base(self) -> _ByBase:
        if self._sorted is None:
            order = np.argsort(-self.base, kind="stable")
            interest = self.mix.interest and self.vectors is not None
            position = np.empty(order.size, dtype=np.int64)
            position[order] = np.arange(order.size)
            self._sorted = _ByBase(order, position, self.base[order], -self.base[order], self.ids[order],
                                   self._floats[order] if interest else None,
                                   self._denominators[order] if interest else None)
        return self._sorted


@dataclass(frozen=True, slots=True)
class _ByBase:
    """A round's items in the order of their own part, best first, with what scoring needs."""

    order: np.ndarray  # sorted position -> item index
    position: np.ndarray  # item index -> sorted position
    base: np.ndarray
    negated: np.ndarray  # -base: ascending, for searchsorted
    ids: np.ndarray
    floats: np.ndarray | None
    denominators: np.ndarray | None
