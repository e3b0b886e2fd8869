"""`manage.py benchmark --quality`: retrieval quality on a public long-term conversation benchmark.

LoCoMo (Maharana et al., "Evaluating Very Long-Term Conversational Memory of LLM Agents", ACL
2024; github.com/snap-research/locomo, `data/locomo10.json`, released by its authors for
non-commercial use (CC BY-NC 4.0 as we understand it; the snapshot read while writing this had
no licence file): it is fetched when the benchmark runs, never committed). Ten conversations
of up to 35 sessions between two people; each question is annotated with the turns ("evidence",
dialogue ids) that answer it.

Each conversation is stored as one context (a turn is a message: the speaker its name, the text
with the caption of a shared image after it), embedded with the local model, and every question
with evidence (the adversarial category 5 left out: its answers are not in the conversation) is
asked in each mode. Beside them, in-process baselines over the same texts: BM25 (rank-bm25's
BM25Okapi, lower-cased word tokens) and exact dense cosine with the same model. Figures:
recall@5 and recall@10 (the share of a question's evidence turns in the top k, averaged over
questions) and MRR (the reciprocal rank of the first evidence turn in the top 10).
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from memory_app.bench import sections

LOCOMO_URL = "https://raw.githubusercontent.com/snap-research/locomo/main/data/locomo10.json"
K = 10
MODES = ("keyword", "semantic", "hybrid")
LEFT_OUT_CATEGORIES = {5}


@dataclass
class Conversation:
    sample_id: str
    # (dialogue id, speaker, text) in the order spoken.
    turns: list[tuple[str, str, str]]
    # (question, evidence dialogue ids).
    questions: list[tuple[str, frozenset[str]]]


def fetch_dataset(path: Path, url: str = LOCOMO_URL) -> Path:
    """The dataset file at `path`, downloaded from `url` first when it is not there."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(url, timeout=60) as response:  # noqa: S310 - a constant https URL
            body = response.read()
        json.loads(body)  # a JSON document, not an error page
        path.write_bytes(body)
    return path


class DatasetError(Exception):
    """The dataset cannot be read, or holds no question with its evidence among the turns."""


def read_locomo(path: Path) -> list[Conversation]:
    """The conversations of LoCoMo's release file, or of a folder of its per-conversation files
    (the multimodal release's layout); DatasetError when there is nothing to ask."""
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    raw = []
    for file in files:
        try:
            loaded = json.loads(file.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise DatasetError(f"cannot read {file}: {exc}") from exc
        if not isinstance(loaded, list | dict):
            raise DatasetError(f"{file} holds neither a LoCoMo sample nor a list of them")
        raw += loaded if isinstance(loaded, list) else [{"sample_id": file.stem, **loaded}]
    try:
        conversations = parse_locomo(raw)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise DatasetError(f"{path} is not in LoCoMo's format ({exc!r})") from exc
    if not any(c.questions for c in conversations):
        raise DatasetError(
            f"{path} holds no LoCoMo question whose evidence is among its turns "
            f"({len(files)} JSON file(s) read)"
        )
    return conversations


def parse_locomo(raw: Sequence[dict]) -> list[Conversation]:
    """LoCoMo's samples (each `{"sample_id", "conversation": {...}, "qa": [...]}`; the
    multimodal release's files hold the conversation's keys at the top level) as conversations."""
    conversations = []
    for index, sample in enumerate(raw):
        body = sample.get("conversation", sample)
        sessions = sorted(
            (int(m.group(1)), key)
            for key in body
            if (m := re.fullmatch(r"session_(\d+)", key)) and isinstance(body[key], list)
        )
        turns = []
        for _, key in sessions:
            for turn in body[key]:
                text = turn.get("text", "")
                if turn.get("blip_caption"):
                    text += f" [shares {turn['blip_caption']}]"
                turns.append((turn["dia_id"], turn.get("speaker", ""), text))
        known = {t[0] for t in turns}
        questions = [
            (qa["question"], frozenset(e for e in qa.get("evidence", []) if e in known))
            for qa in sample.get("qa", [])
            if qa.get("category") not in LEFT_OUT_CATEGORIES
        ]
        conversations.append(
            Conversation(
                sample_id=str(sample.get("sample_id", index)),
                turns=turns,
                questions=[(q, e) for q, e in questions if e],
            )
        )
    return conversations


def recall_at(ranked: Sequence[str], evidence: frozenset[str], k: int) -> float:
    """The share of the evidence turns among the first `k` ranked."""
    return len(evidence.intersection(ranked[:k])) / len(evidence) if evidence else 0.0


def reciprocal_rank(ranked: Sequence[str], evidence: frozenset[str], k: int = K) -> float:
    """1 / the rank of the first evidence turn within the first `k`, else 0."""
    for rank, item in enumerate(ranked[:k], start=1):
        if item in evidence:
            return 1.0 / rank
    return 0.0


@dataclass
class Scores:
    """recall@5, recall@10 and MRR@10 of one way of ranking, over every question asked."""

    recall5: list[float] = field(default_factory=list)
    recall10: list[float] = field(default_factory=list)
    mrr: list[float] = field(default_factory=list)

    def add(self, ranked: Sequence[str], evidence: frozenset[str]) -> None:
        self.recall5.append(recall_at(ranked, evidence, 5))
        self.recall10.append(recall_at(ranked, evidence, 10))
        self.mrr.append(reciprocal_rank(ranked, evidence))

    def means(self) -> tuple[float, float, float]:
        return tuple(
            float(np.mean(v)) if v else 0.0 for v in (self.recall5, self.recall10, self.mrr)
        )


def tokens(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def bm25_ranker(conversation: Conversation) -> Callable[[str], list[str]]:
    """The plain in-process BM25 baseline (rank-bm25, the `bench` extra)."""
    from rank_bm25 import BM25Okapi

    ids = [t[0] for t in conversation.turns]
    index = BM25Okapi([tokens(t[2]) for t in conversation.turns])

    def rank(question: str) -> list[str]:
        scores = index.get_scores(tokens(question))
        return [ids[i] for i in np.argsort(-scores, kind="stable")[:K]]

    return rank


def dense_ranker(ids: Sequence[str], vectors: np.ndarray) -> Callable[[Sequence[float]], list[str]]:
    """Exact cosine over every turn's vector (the model the server embeds with)."""
    matrix = np.asarray(vectors, dtype=np.float64)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)

    def rank(query_vector: Sequence[float]) -> list[str]:
        q = np.asarray(query_vector, dtype=np.float64)
        scores = matrix @ (q / np.linalg.norm(q))
        return [ids[i] for i in np.argsort(-scores, kind="stable")[:K]]

    return rank


def store(conversation: Conversation, log: Callable[[str], None]) -> tuple[object, dict[int, str]]:
    """The conversation as one context, every vector written; returns it and message id →
    dialogue id."""
    from django.db import connection

    from memory_app.embeddings import providers, worker
    from memory_app.services.contexts import context_get_or_create
    from memory_app.services.messages import messages_append

    context, _ = context_get_or_create(
        keys={"benchmark": "locomo", "sample": conversation.sample_id}
    )
    items = [
        {"role": "user", "name": speaker, "text": text} for _, speaker, text in conversation.turns
    ]
    # Appended in chunks of a session's size, as a chat is: each writes its full-text vectors.
    messages = []
    for start in range(0, len(items), 50):
        messages += messages_append(context=context, items=items[start : start + 50]).messages
    provider = providers.get_provider()
    while worker.embed_batch(provider=provider, batch_size=256).claimed:
        pass
    # As autovacuum would have by now: without statistics the planner joined each stored vector
    # to the context's messages one by one (a semantic query's scan took 99 ms, not 1).
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE memory_app_message, memory_app_embedding, memory_app_messagesearch")
    context.refresh_from_db()
    return context, {m.pk: t[0] for m, t in zip(messages, conversation.turns, strict=True)}


# Timed with the question's text (its embedding included) for this many questions of each
# conversation; the others pass the question's vector, embedded in one batch per conversation.
TIMED_PER_CONVERSATION = 20


def run(conversations: Iterable[Conversation], log: Callable[[str], None]) -> dict:
    """Every question of every conversation in each mode and baseline: the scores, and the
    semantic queries' latencies (embedding the question included)."""
    from memory_app.embeddings import providers
    from memory_app.models import Embedding
    from memory_app.search.messages import search_messages

    provider = providers.get_provider()
    if provider is None:
        raise RuntimeError("the quality benchmark needs the local embedding provider")
    scores = {name: Scores() for name in (*MODES, "bm25 baseline", "dense baseline")}
    latencies: list[float] = []
    # The question's embedding alone, timed before its search, and the load average then.
    embeddings: list[float] = []
    loads: list[float] = []
    provider.embed(["warm-up"])  # the model is loaded before anything is timed
    for conversation in conversations:
        context, dia = store(conversation, log)
        stored = dict(
            Embedding.objects.filter(context=context, model=provider.model).values_list(
                "message_id", "vector"
            )
        )
        by_dia = {d: stored[mid] for mid, d in dia.items()}
        ids = [t[0] for t in conversation.turns]
        dense = dense_ranker(ids, np.asarray([by_dia[i] for i in ids]))
        bm25 = bm25_ranker(conversation)
        vectors = provider.embed([q for q, _ in conversation.questions])
        for n, ((question, evidence), vector) in enumerate(
            zip(conversation.questions, vectors, strict=True)
        ):
            timed = n < TIMED_PER_CONVERSATION
            if timed:
                t = time.perf_counter()
                provider.embed([question])
                embeddings.append(time.perf_counter() - t)
                loads.append(os.getloadavg()[0])
            for mode in MODES:
                given = (
                    {}
                    if timed or mode == "keyword"
                    else {
                        "query_vector": vector,
                        "model": provider.model,
                    }
                )
                t = time.perf_counter()
                found = search_messages(context=context, query=question, k=K, mode=mode, **given)
                hits = found.hits
                if mode == "semantic" and timed:
                    latencies.append(time.perf_counter() - t)
                scores[mode].add([dia[h.message.pk] for h in hits], evidence)
            scores["bm25 baseline"].add(bm25(question), evidence)
            scores["dense baseline"].add(dense(vector), evidence)
        log(
            f"  {conversation.sample_id}: {len(conversation.turns)} turns, "
            f"{len(conversation.questions)} questions"
        )
    return {
        "scores": {k: v.means() for k, v in scores.items()},
        "latencies": latencies,
        "embeddings": embeddings,
        "loads": loads,
    }


def _p50_p95_ms(values: Sequence[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return tuple(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 for q in (0.5, 0.95))


def section(
    result: dict, conversations: Sequence[Conversation], *, command: str, machine: list[str]
) -> list[str]:
    """The report's section of a `--quality` run: what it ran on, then `report`'s figures."""
    turns = sum(len(c.turns) for c in conversations)
    questions = sum(len(c.questions) for c in conversations)
    return [
        *sections.opening(sections.QUALITY, command, quick=False),
        *machine,
        f"- Dataset: LoCoMo ({len(conversations)} conversations, {turns:,} turns, {questions:,}"
        " questions with their evidence turns, category 5 left out), each conversation one"
        f" context; fetched at run time ({LOCOMO_URL}) or read from `--dataset`, never"
        " committed: its authors released it for non-commercial use (CC BY-NC 4.0 as we read"
        " it; the repository's snapshot has no licence file: check it before any other use).",
        f"- Rankings: top {K} per question; keyword is BM25 in PostgreSQL, semantic the local"
        " model (all-MiniLM-L6-v2), hybrid their fusion; beside them BM25 in process (rank-bm25"
        " BM25Okapi, lower-cased word tokens) and exact dense cosine with the same model (numpy).",
        "",
        *report(result),
    ]


def report(result: dict) -> list[str]:
    """The figures as a Markdown table, with the targets checked."""
    s = result["scores"]
    lines = ["| ranking | recall@5 | recall@10 | MRR@10 |", "|---|---|---|---|"]
    for name, (r5, r10, mrr) in s.items():
        lines.append(f"| {name} | {r5:.3f} | {r10:.3f} | {mrr:.3f} |")
    if result["latencies"]:
        p50, p95 = _p50_p95_ms(result["latencies"])
        lines += [
            "",
            f"Semantic query, its embedding included ({len(result['latencies'])} questions):"
            f" p50 {p50:.1f} ms, p95 {p95:.1f} ms (target p95 ≤ 50 ms:"
            f" {'met' if p95 <= 50 else '**missed**'})",
        ]
        if result.get("embeddings"):
            e50, e95 = _p50_p95_ms(result["embeddings"])
            loads = result["loads"]
            lines.append(
                f"- the question's embedding alone: p50 {e50:.1f} ms, p95 {e95:.1f} ms;"
                f" load average {min(loads):.1f}–{max(loads):.1f} while timed"
            )
    keyword, semantic, hybrid = s["keyword"][1], s["semantic"][1], s["hybrid"][1]
    bm25, dense = s["bm25 baseline"][1], s["dense baseline"][1]
    checks = [
        (f"keyword ≥ the BM25 baseline: {keyword:.3f} against {bm25:.3f}", keyword >= bm25),
        (
            f"semantic = exact dense ± 0.01: {semantic:.3f} against {dense:.3f}",
            round(abs(semantic - dense), 9) <= 0.01,  # as printed: 0.312 against 0.302 meets
        ),
        (
            f"hybrid ≥ the better baseline + 0.05: {hybrid:.3f} against"
            f" {max(bm25, dense) + 0.05:.3f}",
            hybrid >= max(bm25, dense) + 0.05,
        ),
    ]
    lines += ["", "Targets (recall@10):"]
    lines += [f"- {text}: {'met' if ok else '**missed**'}" for text, ok in checks]
    return lines
