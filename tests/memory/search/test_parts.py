"""What of a memory is embedded (app/memory/search/parts.py): the whole text, its sentences with
its label, an enriched key's context last; each different part embedded once."""

from __future__ import annotations

import numpy as np

from app.memory.search.dense import VectorIndex
from app.memory.search.parts import (
    CONTEXT_MARK,
    MAX_PARTS,
    PART_BITS,
    embed_memories,
    key_of,
    parts_ids,
    parts_of,
    plain_key,
    with_context,
)
from tests.fakes import FakeEmbedder


def test_a_memory_is_embedded_whole_and_sentence_by_sentence_with_its_label() -> None:
    assert parts_of("Likes tea.") == ["Likes tea."]
    said = "[8 May 2023] Caroline: I went to a support group. It was really powerful for me."
    assert parts_of(said) == [said, "[8 May 2023] Caroline: I went to a support group.",
                              "[8 May 2023] Caroline: It was really powerful for me."]  # fmt: skip
    many = " ".join(f"Sentence number {n} is here." for n in range(93))  # 31 runs of 3
    assert len(parts_of(many)) == MAX_PARTS and parts_of(many)[0] == many


def test_an_enriched_key_is_embedded_as_its_words_then_its_context() -> None:
    words = "I went to a support group. It was really powerful for me."
    key = with_context(words, "On 8 May the user talked about a support group.")
    assert plain_key(key) == words and CONTEXT_MARK in key
    assert with_context(key, "Newer.") == f"{words}{CONTEXT_MARK}Newer."
    assert parts_of(key) == [*parts_of(words), "On 8 May the user talked about a support group."]
    many = " ".join(f"Sentence number {n} is here." for n in range(93))
    long = parts_of(with_context(many, "Context."))  # in fewer runs: every sentence in one
    assert len(long) <= MAX_PARTS and long[0] == many and long[-1] == "Context."
    assert " ".join(long[1:-1]) == " ".join(parts_of(many)[1:])
    mine = "Task: fix the bug.\nContext: the user's own words, not a context."
    assert CONTEXT_MARK not in mine and parts_of(mine)[0] == mine


async def test_each_different_part_is_embedded_once_shortest_first() -> None:
    embedder = FakeEmbedder()
    context = "On 8 May the user talked about a support group."
    texts = [with_context("Went to a support group.", context),
             with_context("Found it powerful.", context), "Went to a support group."]  # fmt: skip
    vectors = await embed_memories(embedder, texts)
    asked = [t for call in embedder.calls for t in call]
    assert sorted(asked) == sorted({"Went to a support group.", "Found it powerful.", context})
    assert [len(t) for t in asked] == sorted(len(t) for t in asked)
    assert [v.shape for v in vectors] == [(2, 64), (2, 64), (1, 64)]
    assert np.allclose(vectors[1][0], embedder.vector("Found it powerful."))
    assert np.allclose(vectors[0][1], embedder.vector(context))
    assert np.allclose(vectors[2][0], vectors[0][0])


def test_the_ids_of_parts_are_each_keys_in_turn() -> None:
    keys = np.array([9, 2, 1 << 40, 5], dtype=np.int64)
    parts = np.array([3, 1, 2, 0])
    expected = [(k << PART_BITS) + p
                for k, n in zip(keys.tolist(), parts.tolist(), strict=True) for p in range(n)]  # fmt: skip
    assert parts_ids(keys, parts).tolist() == expected
    assert parts_ids(keys, parts).dtype == np.int64
    assert key_of(parts_ids(keys, parts)).tolist() == [9, 9, 9, 2, 1 << 40, 1 << 40]


def test_a_vector_index_adds_removes_and_scores_by_the_best_part() -> None:
    index = VectorIndex(4)
    eye = np.eye(4, dtype=np.float32)
    index.add([7, 3], [eye[[0, 1]], eye[[2]]])
    assert len(index) == 2 and index.vectors == 3
    assert index.similarity(eye[1], np.array([3, 7])).tolist() == [0.0, 1.0]
    index.remove([7])
    assert len(index) == 1 and index.vectors == 1
    keys, scores = index.search(eye[2], 5)
    assert keys.tolist() == [3] and scores.tolist() == [1.0]
