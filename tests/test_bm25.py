"""BM25's pure parts (query splitting, fusion) and the quality benchmark's scoring, on tiny
hand-made inputs (the benchmark's dataset is fetched at its run time only, never in the test
suite). The scores the server computes are checked in tests/test_search_bounds.py."""

from __future__ import annotations

import pytest

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


def test_a_dataset_with_nothing_to_ask_is_refused_with_its_path(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(quality.DatasetError, match="no LoCoMo question"):
        quality.read_locomo(empty)
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(quality.DatasetError, match="broken.json"):
        quality.read_locomo(tmp_path / "broken.json")
    (tmp_path / "odd.json").write_text('[{"conversation": {"session_1": [{"text": "hi"}]}}]')
    with pytest.raises(quality.DatasetError, match="LoCoMo's format"):
        quality.read_locomo(tmp_path / "odd.json")
    with pytest.raises(quality.DatasetError, match="cannot read"):
        quality.read_locomo(tmp_path / "absent.json")
    (tmp_path / "one.json").write_text(
        '{"conversation": {"session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "hi"}]},'
        ' "qa": [{"question": "Who said hi?", "evidence": ["D1:1"], "category": 1}]}'
    )
    [conv] = quality.read_locomo(tmp_path / "one.json")
    assert conv.sample_id == "one" and conv.questions == [("Who said hi?", frozenset({"D1:1"}))]


def test_a_term_s_plan_follows_its_weight_and_bounds_its_rows():
    plan = bm25.plan_term
    big = {"window": 2000, "n": 1_000_000, "last_seq": 1_000_000, "cap": 200, "limit": 10}
    # Nothing of the term in the latest seqs: the planner chooses, for up to the cap.
    assert plan(window_matches=0, budget=10_000, **big) == bm25.TermPlan(200, None)
    # A context no longer than the window: every count exact, every match up to the cap read.
    small = {**big, "n": 700, "last_seq": 700}
    assert plan(window_matches=650, budget=10_000, **small) == bm25.TermPlan(200, None)
    # Four matches in the latest 2,000 of 100,000 messages (about 200): its matches through the
    # GIN index cost less than walking back to them, so all are read, up to the cap.
    hundred_k = {**big, "n": 100_000, "last_seq": 100_000}
    assert plan(window_matches=4, budget=10_000, **hundred_k) == bm25.TermPlan(200, True)
    # The same in a million (about 2,000): still through the index, but a word that common
    # keeps candidates in proportion to its weight, ÷ the weight of a word one message holds.
    weight = bm25.idf(2_000, 1_000_000) / bm25.idf(1, 1_000_000)
    assert plan(window_matches=4, budget=10_000, **big) == bm25.TermPlan(round(200 * weight), True)
    # A common word (one message in ten): fewer candidates still, by walking back.
    common = plan(window_matches=200, budget=100_000, **big)
    weight = bm25.idf(100_000, 1_000_000) / bm25.idf(1, 1_000_000)
    assert common == bm25.TermPlan(round(200 * weight), False)
    # A very common word keeps at least the limit; a tighter budget bounds the walk's rows.
    assert plan(window_matches=1900, budget=100_000, **big) == bm25.TermPlan(10, False)
    bounded = plan(window_matches=20, budget=2_000, **big)
    assert bounded == bm25.TermPlan(20, False)
    assert bounded.need * 1_000_000 / 10_000 <= 2_000


def test_the_quality_report_gives_the_semantic_row_with_its_embedding_and_the_load():
    means = (0.5, 0.6, 0.4)
    result = {
        "scores": {
            name: means
            for name in ("keyword", "semantic", "hybrid", "bm25 baseline", "dense baseline")
        },
        "latencies": [0.010 * i for i in range(1, 21)],
        "embeddings": [0.005 * i for i in range(1, 21)],
        "loads": [1.5, 2.25, 3.0],
    }
    lines = quality.report(result)
    assert (
        "Semantic query, its embedding included (20 questions): p50 110.0 ms, p95 200.0 ms"
        " (target p95 ≤ 50 ms: **missed**)" in lines
    )
    assert (
        "- the question's embedding alone: p50 55.0 ms, p95 100.0 ms;"
        " load average 1.5–3.0 while timed" in lines
    )


def test_the_quality_and_keyword_scale_sections_sit_in_the_report_and_outlive_a_full_run(tmp_path):
    """`--quality` and `--keyword-messages` write their figures into docs/benchmarks.md as
    sections of their own, with the machine's lines and what they ran on; a full run, which
    does not measure them, carries them over."""
    from memory_app.bench import keyword_scale, sections

    report = tmp_path / "benchmarks.md"
    full = "# Benchmarks\n\n- Command: `{}`\n\n## Results\n\n{}\n\n## Where the time goes\n\nP.\n"
    report.write_text(full.format("python manage.py benchmark --peers", "old rows"))
    conversation = quality.Conversation(
        "c1", [("D1:1", "Ann", "hello"), ("D1:2", "Bob", "hi")], [("who?", frozenset({"D1:1"}))]
    )
    result = {
        "scores": {
            name: (0.5, 0.6, 0.4)
            for name in ("keyword", "semantic", "hybrid", "bm25 baseline", "dense baseline")
        },
        "latencies": [],
    }
    machine = ["- Date: 2026-11-29 01:00 UTC", "- Load average (1/5/15 min) …: 1.00 / 1.00 / 1.00"]
    lines = quality.section(
        result, [conversation], command="python manage.py benchmark --quality", machine=machine
    )
    sections.write_section(report, sections.QUALITY, lines)
    scale = {
        "questions": 200,
        **{key: 20.0 for key in ("p50", "p95", "server_p50", "server_p95")},
        **{key: 3000 for key in ("buffers_p50", "buffers_p95", "statements")},
    }
    lines = keyword_scale.section(scale, 1_000_000, load="1.00", command="c", machine=machine)
    sections.write_section(report, sections.KEYWORD_SCALE, lines)

    text = report.read_text()
    assert "## Results\n\nold rows\n" in text
    quality_at = text.index(sections.QUALITY + "\n")
    assert quality_at < text.index(sections.KEYWORD_SCALE + "\n") < text.index("## Where the")
    assert machine[1] in text[quality_at:]
    assert "LoCoMo (1 conversations, 2 turns, 1 questions" in text
    assert "| keyword | 0.500 | 0.600 | 0.400 |" in text
    assert "one context of 1,000,000 messages" in text
    assert "p50 20.0 ms, p95 20.0 ms (target p50 ≤ 30 ms: met)" in text

    rewritten = full.format("python manage.py benchmark", "new rows")
    sections.write_report(report, rewritten, None, "", None, "c", False, [])
    kept = report.read_text()
    assert "new rows" in kept and "old rows" not in kept
    assert kept.count(sections.QUALITY + "\n") == 1 and "| keyword | 0.500 |" in kept
    assert kept.count(sections.KEYWORD_SCALE + "\n") == 1


def test_the_quality_targets_say_met_or_missed_with_the_figures_they_compare():
    scores = {"bm25 baseline": (0, 0.483, 0), "dense baseline": (0, 0.302, 0)}
    scores |= {"keyword": (0, 0.584, 0), "semantic": (0, 0.315, 0), "hybrid": (0, 0.532, 0)}
    lines = quality.report({"scores": scores, "latencies": []})
    assert "- keyword ≥ the BM25 baseline: 0.584 against 0.483: met" in lines
    assert "- semantic = exact dense ± 0.01: 0.315 against 0.302: **missed**" in lines
    assert "- hybrid ≥ the better baseline + 0.05: 0.532 against 0.533: **missed**" in lines
    scores["semantic"] = (0, 0.312, 0)  # 0.010000000000000009 apart in floats
    lines = quality.report({"scores": scores, "latencies": []})
    assert "- semantic = exact dense ± 0.01: 0.312 against 0.302: met" in lines
