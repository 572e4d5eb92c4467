"""Hybrid search over one user's memories: the one pipeline behind chat recall and the search API.

Score convention (what ``MEMPROXY_RELEVANCE_THRESHOLD`` and the API's ``min_score`` compare with):
``score = w * max(dense, 0) + (1 - w) * lexical``, in [0, 1], with ``w`` = ``MEMPROXY_DENSE_WEIGHT``
(0.5):

- ``dense`` is the cosine similarity of the query with the memory's best-matching part, the
  whole text or one of its sentences (:mod:`app.memory.search.parts`,
  :mod:`app.memory.search.dense`);
- ``lexical`` is ``(bm25(query) + λ * bm25(feedback)) / (1 + λ)``, each BM25 normalised by its
  ceiling (:mod:`app.memory.search.lexical`), ``λ`` = :data:`FEEDBACK_WEIGHT`. The feedback terms
  are those shared by at least two of the first search's best :data:`FEEDBACK_DOCS` memories
  (pseudo-relevance feedback, RM3-style): they find memories that say the same thing in the
  words the user's memories use rather than the words of the question;
- when the query names a time ("last May", "in 2023": :mod:`app.memory.search.when`), a memory
  said then (``observed_at``) or whose text names a day then gets ``+ TIME_BONUS`` (0.1), the
  sum capped at 1. A query that names no time is scored by the formula alone.

Both parts are on absolute scales (not rescaled per query), so a score is comparable across
queries and users: a memory restating the query scores 0.5 and up; one that answers it in other
words 0.15-0.4 (all-MiniLM-L6-v2 gives related sentences cosines of 0.3-0.5); a question about
something else entirely ~0.1 against a store of personal facts.

Measured on the LoCoMo dev conversations (``bench/recall_eval.py``, recall@5/@10): BM25 alone
.541/.613, whole-text MiniLM alone .385/.468, both fused .555/.650, with sentence parts
.583/.688, with feedback .607/.725 (.594/.726 on the current index; with the time bonus
.600/.730, and .598/.739 -> .645/.774 on the 39 questions naming a time; with BM25's ceiling
over every query word, :mod:`app.memory.search.lexical`, .593/.734 against .600/.729 in the same
session). Reciprocal rank fusion ranks below BM25 alone there: fusing the scores keeps how much
better one candidate is than the next.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
import numpy.ma  # else np.unique imports it in the first search: 47 ms on the loop

from app.memory.search.beside import beside
from app.memory.search.bm25_scores import Scores
from app.memory.search.cache import IndexCache
from app.memory.search.dense import Cosines
from app.memory.search.embedder import TextEmbedder
from app.memory.search.profile import Standing, standing
from app.memory.search.ranked import Hit, Ranked
from app.memory.search.selection import choose
from app.memory.search.timing import Laps
from app.memory.search.user_index import UserIndex
from app.memory.search.when import TIME_BONUS, asked_times, in_time
from app.memory.search.windows import Window, utc_day

Judge = Callable[[str, Sequence["Hit"]], Awaitable[list["Hit"] | None]]
"""The relevance judge (:mod:`app.memory.chat.judge`): given a chat's query and its
:data:`JUDGED` best candidates (whatever their score), those that help answer it, most helpful
first, or None when it could not say (the fused order then stands); it never raises."""
JUDGED = 8
"""Candidates a chat's relevance judge is shown: the best fused, above the threshold or not
(a message that implies a memory shares few words with it)."""

OFFLOAD_ABOVE = 200_000
"""Dense searches over more vectors than this (~14 ms and up) run in a thread, not on the event
loop, BM25 scoring the query meanwhile (:mod:`app.memory.search.beside`). Below it they run
inline: measured at 100k vectors, the hand-off to a thread raised search p99 from 18 ms to
26 ms, while the inline scan holds other requests for ~7 ms at most."""
FEEDBACK_DOCS = 5
FEEDBACK_TERMS = 10
FEEDBACK_WEIGHT = 0.3


@dataclass(frozen=True, slots=True)
class Shares:
    """A chat's token budgets: the profile's, the found memories', and the part of the latter
    episodes may take (``MEMPROXY_PROFILE_TOKEN_BUDGET``, ``MEMPROXY_MEMORY_TOKEN_BUDGET``,
    ``MEMPROXY_EPISODE_SHARE``)."""

    profile_tokens: int
    memory_tokens: int
    episode_share: float


@dataclass(frozen=True, slots=True)
class Recalled:
    """What a chat is shown: the profile (:mod:`app.memory.search.profile`) first, then the
    memories its question found (:mod:`app.memory.search.selection`: facts, then episodes),
    none of them in the profile or linked to one shown."""

    profile: list[Standing]
    hits: list[Hit]
    relevant: int = 0
    """How many memories the search found relevant, not in the profile nor linked to it, before
    the choice: when it keeps none of them, the budget (or the limit) left them all out."""
    timing: dict[str, float] = field(default_factory=dict)
    """Milliseconds by phase (:mod:`app.memory.search.timing`)."""


class Searcher:
    def __init__(
        self,
        cache: IndexCache,
        embedder: TextEmbedder,
        *,
        dense_weight: float = 0.5,
        candidates: int = 100,
    ) -> None:
        self._cache = cache
        self._embedder = embedder
        self._weight = dense_weight
        self._candidates = candidates

    async def search(
        self,
        user_id: str,
        query: str,
        *,
        limit: int,
        min_score: float = 0.0,
        types: Sequence[str] = (),
        background: bool = False,
        now: datetime | None = None,
    ) -> list[Hit]:
        """The user's best memories for `query`, best first, at most `limit`, none below
        `min_score`, only of `types` when given. `background` searches (the Manager's) embed
        the query on the memories' embedder, leaving the query embedder to chats. `now`: when
        the query is asked (a time it names, "last May", is read from that day; default now)."""
        # The query is embedded (on the loop when short, else on the model's thread: its
        # embedder's promise) while the index is checked and BM25 scores it: neither needs the
        # other.
        embedding = asyncio.ensure_future(
            self._embed_background(query) if background else self._embedder.embed_query(query)
        )
        found = await self._find(
            user_id, query, embedding, limit, min_score, types, None, now, held_only=background
        )
        return found.hits

    async def recall(
        self,
        user_id: str,
        query: str | None,
        *,
        limit: int,
        min_score: float,
        shown: Shares,
        now: datetime | None = None,
        judge: Judge | None = None,
    ) -> Recalled:
        """What a chat is shown: the profile within `shown.profile_tokens`, then what
        :meth:`search` finds for `query` (none without one) that is not in it, at most
        `limit`, chosen within `shown`'s budgets (:func:`~app.memory.search.selection.choose`),
        from the candidates as `judge` picks them when given (:data:`Judge`; asked outside the
        index's lock).
        One check that the index is current serves both."""
        embedding = asyncio.ensure_future(self._embedder.embed_query(query)) if query else None
        return await self._find(
            user_id, query or "", embedding, limit, min_score, (), shown, now, judge=judge
        )

    async def _find(
        self,
        user_id: str,
        query: str,
        embedding: asyncio.Future[np.ndarray] | None,
        limit: int,
        min_score: float,
        types: Sequence[str],
        shares: Shares | None,
        now: datetime | None,
        *,
        held_only: bool = False,
        judge: Judge | None = None,
    ) -> Recalled:
        """`held_only`: BM25's ceiling over the query words the memories hold only (the
        Manager's search, whose query is a whole exchange and whose order its measurements
        were made with), not over every word (:mod:`app.memory.search.lexical`)."""
        laps = Laps()
        try:
            entry = await self._cache.get(user_id)
        except BaseException:
            if embedding is not None:
                embedding.cancel()
            raise
        laps.lap("index")
        if embedding is None or not len(entry):
            if embedding is not None:
                embedding.cancel()
            async with entry.lock:
                profile = standing(entry, shares.profile_tokens if shares else 0)
                return Recalled(profile, [], timing=laps.ms)
        async with entry.lock:
            profile = standing(entry, shares.profile_tokens if shares else 0)
            shown = {s.key for s in profile}
            terms = entry.lexical.analyzer.query_terms(query)
            wanted = max(self._candidates, limit * 4 if types else limit)
            if entry.vectors.vectors > OFFLOAD_ABOVE:  # the scan in a thread, BM25 meanwhile
                laps.lap("lexical")  # (the lock and the profile: BM25 is in `dense` here)
                vector = await embedding
                laps.lap("embedding")
                dense, by_query = await beside(
                    lambda: entry.vectors.search(vector, wanted),
                    lambda: entry.lexical.score_terms(terms, held_only=held_only),
                )
                laps.lap("dense")
            else:  # BM25 while the query's embedding may still be under way
                by_query = entry.lexical.score_terms(terms, held_only=held_only)
                laps.lap("lexical")
                vector = await embedding
                laps.lap("embedding")
                dense = entry.vectors.search(vector, wanted)
                laps.lap("dense")
            when = asked_times(query, utc_day(now or datetime.now(UTC)))
            ranked = self._rank(entry, terms, by_query, vector, dense, wanted, when)
            at = ranked.positions(shown, types)
            passing = at[ranked.scores[at].astype(np.float64) >= min_score]  # as a Hit's
            # what the profile hides is not "relevant but left out": the budget warning's count
            hidden = {k for key in shown for k in entry.links.get(key, ())}
            relevant = len(passing)
            if hidden:
                relevant -= int(np.isin(ranked.keys[passing], list(hidden)).sum())
            chosen = ranked.hits(passing[:limit] if shares is None else passing)
            laps.lap("rank")
            if shares is None:
                return Recalled(profile, chosen, relevant, laps.ms)  # cut to `limit` above
            if judge is None:
                found = self._choose(entry, chosen, limit, shares, shown)
                laps.lap("choice")
                return Recalled(profile, found, relevant, laps.ms)
            judged = ranked.hits(at[:JUDGED])
        picked = await judge(query, judged)  # a model's answer: never under the lock
        if picked is not None and picked:  # those it passed over of what it saw go
            seen = {h.key for h in judged}
            chosen = [*picked, *(h for h in chosen if h.key not in seen)]
        laps.lap("judge")
        async with entry.lock:
            found = self._choose(entry, chosen, limit, shares, shown)
        laps.lap("choice")
        return Recalled(profile, found, relevant, laps.ms)

    @staticmethod
    def _choose(
        entry: UserIndex, hits: list[Hit], limit: int, shares: Shares, shown: set[int]
    ) -> list[Hit]:
        """A chat's choice: budgets, links (read under the lock, as the index holds them)."""
        return choose(
            hits, entry.links, limit=limit, budget_tokens=shares.memory_tokens,
            episode_share=shares.episode_share, shown=shown,
        )  # fmt: skip

    async def _embed_background(self, query: str) -> np.ndarray:
        vector: np.ndarray = (await self._embedder.embed([query]))[0]
        return vector

    def _rank(
        self,
        entry: UserIndex,
        terms: list[str],
        by_query: Scores,
        vector: np.ndarray,
        dense: tuple[np.ndarray, np.ndarray],
        wanted: int,
        when: Sequence[Window] = (),
    ) -> Ranked:
        """The candidates, best first. `when`: the times the query names
        (:func:`app.memory.search.when.times`); none: scores are the fused score alone."""
        lexical = entry.lexical
        candidates = np.union1d(dense[0], by_query.top(wanted))
        cosine = Cosines(entry.vectors, vector, dense)
        w = self._weight

        # first pass: which memories the feedback terms come from
        first = w * np.maximum(cosine.of(candidates), 0) + (1 - w) * by_query.of(candidates)
        best = candidates[np.argsort(-first, kind="stable")[:FEEDBACK_DOCS]]
        feedback_terms = lexical.feedback_terms(best.tolist(), terms, limit=FEEDBACK_TERMS)
        by_feedback = lexical.score_terms(feedback_terms)
        candidates = np.union1d(candidates, by_feedback.top(wanted))

        from_query = by_query.of(candidates)
        from_feedback = by_feedback.of(candidates)
        lex = (from_query + FEEDBACK_WEIGHT * from_feedback) / (1 + FEEDBACK_WEIGHT)
        cos = cosine.of(candidates)
        scores = w * np.maximum(cos, 0) + (1 - w) * lex
        if when:  # the query names a time: what was said, or is dated, then is favoured
            timely = [in_time(when, entry.briefs[k].observed_at, entry.briefs[k].content)
                      for k in candidates.tolist()]  # fmt: skip
            scores = np.minimum(scores + TIME_BONUS * np.array(timely, dtype=np.float64), 1.0)
        order = np.lexsort((-candidates, -scores))
        return Ranked(entry, candidates[order], scores[order], cos[order], lex[order])
