"""BM25's pure parts (query splitting, term frequencies, document frequency estimates, scores)
and the quality benchmark's scoring, on tiny hand-made inputs (the benchmark's dataset is
fetched at its run time only, never in the test suite)."""

from __future__ import annotations

import math

import pytest
from rank_bm25 import BM25Okapi

from memory_app.bench import quality
from memory_app.search import bm25, fusion


def test_a_web_search_splits_into_words_phrases_and_exclusions():
    split = bm25.split_websearch('weather in "New York" -rain or snow -"cold front" "open')
    assert split.words == ("weather", "in", "snow")
    assert split.phrases == ("New York", "open")
    assert split.excluded == ("rain", "cold front")
    assert split.exclusion_text == '-rain -"cold front"'
    assert bm25.split_websearch('- "" --x').excluded == ("x",)
    assert bm25.split_websearch('- "" --x').words == ()


def test_term_frequencies_count_positions_of_each_lexeme():
    tfs = bm25.term_frequencies("'it''s':1A,5A,9A 'alpha':3A 'bare'")
    assert tfs == {"it's": 3, "alpha": 1, "bare": 1}
    phrase = bm25.Term("'new' <-> 'york'", ("new", "york"))
    assert bm25.term_frequency(phrase, {"new": 3, "york": 2}) == 2
    assert bm25.term_frequency(phrase, {"new": 3}) == 0


def test_document_frequency_is_exact_below_the_cap_and_estimated_above_it():
    assert bm25.estimated_df(matches=7, cap=10, oldest_seq=3, last_seq=1000, n=1000) == 7
    # The newest 10 matches reach back 100 seqs of 1,000: about 100 in the context.
    assert bm25.estimated_df(matches=10, cap=10, oldest_seq=901, last_seq=1000, n=1000) == 100
    # Never below what was seen nor above the context.
    assert bm25.estimated_df(matches=10, cap=10, oldest_seq=995, last_seq=1000, n=1000) == 1000
    assert bm25.estimated_df(matches=10, cap=10, oldest_seq=1, last_seq=1000, n=1000) == 10


def test_scores_equal_rank_bm25_on_the_same_counts():
    """Okapi BM25 with Lucene's IDF: rank-bm25's BM25Plus-free formula differs only in its IDF,
    so the term part is compared with it on a corpus where every document has the same IDFs."""
    corpus = [["a", "b", "b"], ["a", "c"], ["b", "c", "c", "d"]]
    n, avgdl = len(corpus), sum(map(len, corpus)) / len(corpus)
    terms = [bm25.Term("'b'", ("b",)), bm25.Term("'c'", ("c",))]
    idfs = [bm25.idf(2, n), bm25.idf(2, n)]
    assert idfs[0] == pytest.approx(math.log(1 + (3 - 2 + 0.5) / 2.5))
    okapi = BM25Okapi(corpus, k1=bm25.K1, b=bm25.B)
    expected = okapi.get_scores(["b", "c"]) / okapi.idf["b"] * idfs[0]
    for doc, want in zip(corpus, expected, strict=True):
        tfs = {t: doc.count(t) for t in set(doc)}
        got = bm25.score(terms=terms, idfs=idfs, tfs=tfs, length=len(doc), avgdl=avgdl)
        assert got == pytest.approx(want)


def test_rank_scores_each_candidate_once_best_first_ties_newest_first():
    terms = [bm25.Term("'x'", ("x",))]
    rows = [(1, 1, 2, "'x':1A"), (2, 2, 2, "'x':1A"), (2, 2, 2, "'x':1A"), (3, 3, 2, "'x':1A,2A")]
    ranked = bm25.rank(rows, terms=terms, idfs=[1.0], avgdl=2.0)
    assert [mid for mid, _, _ in ranked] == [3, 2, 1]


def test_hybrid_weighs_a_clear_keyword_winner_above_a_flat_cosine_list():
    keyword = [(1, 9.0), (2, 3.0)]
    # Message 3 is the nearest by cosine, barely: the scaled similarity still gives it the
    # semantic part in full, but not the keyword part.
    semantic = [(3, 0.50), (1, 0.51), (2, 0.60)]
    kw = {mid: (rank, s) for rank, (mid, s) in enumerate(keyword, start=1)}
    sem = {mid: (rank, d) for rank, (mid, d) in enumerate(semantic, start=1)}
    order = fusion.ranked_order("hybrid", keyword, semantic, kw=kw, sem=sem)
    assert [mid for mid, _ in order] == [1, 2, 3]
    scores = dict(order)
    assert scores[1] == pytest.approx(0.8 + 0.2 * (0.49 - 0.40) / 0.10)
    assert scores[2] == pytest.approx(0.8 * 3 / 9)
    assert scores[3] == pytest.approx(0.2)
    # One list alone ranks as it is.
    assert fusion.ranked_order("hybrid", keyword, [], kw=kw, sem={}) == keyword


# --- the quality benchmark's scoring -------------------------------------------------------------


def test_recall_and_reciprocal_rank_on_a_hand_made_ranking():
    evidence = frozenset({"D1:3", "D2:1"})
    ranked = ["D9:9", "D1:3", "D4:4", "D5:5", "D6:6", "D2:1"]
    assert quality.recall_at(ranked, evidence, 5) == 0.5
    assert quality.recall_at(ranked, evidence, 10) == 1.0
    assert quality.reciprocal_rank(ranked, evidence) == 0.5
    assert quality.reciprocal_rank(["a"] * 10 + ["D1:3"], evidence) == 0.0
    scores = quality.Scores()
    scores.add(ranked, evidence)
    scores.add(["D1:3"], frozenset({"D1:3"}))
    assert scores.means() == pytest.approx((0.75, 1.0, 0.75))


def test_locomo_samples_parse_into_turns_and_questions_with_evidence():
    raw = [
        {
            "sample_id": "conv-1",
            "conversation": {
                "speaker_a": "Ann",
                "session_2": [{"speaker": "Bob", "dia_id": "D2:1", "text": "Back from Kyoto"}],
                "session_2_date_time": "1 May",
                "session_1": [
                    {"speaker": "Ann", "dia_id": "D1:1", "text": "Hi"},
                    {
                        "speaker": "Bob",
                        "dia_id": "D1:2",
                        "text": "Look",
                        "blip_caption": "a photo of a cat",
                    },
                ],
            },
            "qa": [
                {"question": "Where was Bob?", "evidence": ["D2:1"], "category": 1},
                {"question": "Unanswerable?", "evidence": ["D1:1"], "category": 5},
                {"question": "No evidence?", "evidence": ["D7:7"], "category": 2},
            ],
        }
    ]
    [conv] = quality.parse_locomo(raw)
    assert [t[0] for t in conv.turns] == ["D1:1", "D1:2", "D2:1"]
    assert conv.turns[1][2] == "Look [shares a photo of a cat]"
    assert conv.questions == [("Where was Bob?", frozenset({"D2:1"}))]
    rank = quality.bm25_ranker(conv)
    assert rank("where is kyoto")[0] == "D2:1"
