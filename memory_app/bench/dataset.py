"""A synthetic but realistic dataset: its sizes, its texts and vectors (`Generator`), and what
the measurements need to know of it (`Dataset`); `memory_app.bench.load` loads it with COPY.

Shape (default sizes): 200,000 messages over 1,000 contexts, one of them holding half of all
messages (100,000) and a few more large ones; the rest follow a long-tailed distribution. 2,000
runs, one of `max_steps` steps and one of `transcript_steps` in the largest context, the others
short; action steps carry one or two tool calls, a few carry errors. Texts come from a fixed
pseudo-word vocabulary grouped in topics (so keyword queries match a realistic share of rows);
every message with text has a 384-dimension vector built from the same topic (topic centre +
subtopic + a spread, normalised), as real embeddings cluster by subject. The spread lies mostly
in a few directions of its subtopic's own (`local_dims`) plus a little isotropic noise, so the
vectors' local intrinsic dimension is that of real sentence embeddings (see `Generator`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

BENCH_MODEL = "bench-minilm-384"
N_TOPICS = 40
N_SUBTOPICS = 12
# Calibrated on all-MiniLM-L6-v2 vectors of real sentences (Generator's docstring).
LOCAL_DIMS = 24
LOCAL_SPREAD = 0.6
ISOTROPIC_NOISE = 0.1
TOOLS = [
    "web_search",
    "visit_webpage",
    "python_interpreter",
    "calculator",
    "weather",
    "sql_query",
    "read_file",
]


@dataclass(frozen=True)
class Sizes:
    messages: int = 200_000
    contexts: int = 1_000
    runs: int = 2_000
    max_steps: int = 2_000
    transcript_steps: int = 1_000
    dims: int = 384
    seed: int = 7
    # Messages of the largest context; 0: half of all messages.
    largest: int = 0
    # Directions of each subtopic's spread (see Generator.vectors); 0: isotropic noise in every
    # dimension, the vectors of the reports before 2026-11-23 (a stress case for the index).
    local_dims: int = LOCAL_DIMS

    @classmethod
    def quick(cls) -> Sizes:
        return cls(messages=3_000, contexts=12, runs=12, max_steps=120, transcript_steps=60)

    @classmethod
    def scale(cls) -> Sizes:
        """The scale the targets are set at: 1,000,000 messages in one context, 1,200,000
        vectors in the store (the other large contexts hold 60,000, 30,000 and 15,000 messages)."""
        return cls(messages=1_200_000, largest=1_000_000)

    @property
    def largest_messages(self) -> int:
        return self.largest or self.messages // 2

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class Dataset:
    """What the measurements need to know about the loaded data."""

    sizes: Sizes
    largest_context_id: int
    small_context_id: int
    long_run_id: int
    transcript_run_id: int
    model: str = BENCH_MODEL
    topic_words: list[list[str]] = field(default_factory=list)
    context_topics: dict[int, list[int]] = field(default_factory=dict)
    build_seconds: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> str:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "sizes"}
        data["sizes"] = self.sizes.as_dict()
        data["context_topics"] = {str(k): v for k, v in self.context_topics.items()}
        # jsonb does not keep key order: the build steps are stored as pairs.
        data["build_seconds"] = list(self.build_seconds.items())
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> Dataset:
        data = json.loads(text)
        # A dataset stored before a field existed was built as that field's 0 describes.
        data["sizes"] = Sizes(**{"largest": 0, "local_dims": 0, **data["sizes"]})
        data["context_topics"] = {int(k): v for k, v in data["context_topics"].items()}
        steps = data.get("build_seconds") or []
        data["build_seconds"] = dict(steps) if isinstance(steps, list) else steps
        return cls(**data)


# --- vocabulary and vectors -------------------------------------------------------------------

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


def _words(rng: np.random.Generator, count: int, taken: set[str]) -> list[str]:
    out = []
    while len(out) < count:
        syllables = rng.integers(2, 5)
        word = "".join(
            rng.choice(list(_CONSONANTS)) + rng.choice(list(_VOWELS)) for _ in range(syllables)
        )
        if word not in taken:
            taken.add(word)
            out.append(word)
    return out


class Generator:
    """Deterministic texts and vectors for a seed.

    Vectors: topic centre + subtopic direction + a spread. Real sentence embeddings vary
    around a subject along a few directions, not in all 384: the local intrinsic dimension (LID,
    Levina-Bickel MLE over 20 neighbours) of all-MiniLM-L6-v2 vectors of real English sentences
    (docstrings of installed packages, embedded offline) is 19.4 over 20,000 of them and 22.7
    over 5,000. A large context's nearest neighbours lie within one subtopic, so that is where
    the generator is calibrated: over 3,000 vectors of one subtopic, isotropic noise in every
    dimension (`local_dims` 0, the generator of the reports before 2026-11-23) gives an LID of
    96: near-equidistant neighbours that no real model produces, which make an approximate
    index look far worse than it is on real data. LOCAL_SPREAD along `local_dims` (24) random
    directions of each subtopic plus ISOTROPIC_NOISE in every dimension gives 20.0 there (and
    10.5 over 20,000 vectors of all topics). tests/test_benchmark.py keeps this calibration.
    """

    def __init__(self, sizes: Sizes):
        self.sizes = sizes
        self.rng = np.random.default_rng(sizes.seed)
        taken: set[str] = set()
        self.common = np.array(_words(self.rng, 800, taken), dtype=object)
        self.topic_words = [_words(self.rng, 30, taken) for _ in range(N_TOPICS)]
        self._topic_arr = [np.array(t, dtype=object) for t in self.topic_words]
        dims = sizes.dims
        self.centres = self._unit(self.rng.normal(size=(N_TOPICS, dims)))
        self.subs = self._unit(self.rng.normal(size=(N_TOPICS, N_SUBTOPICS, dims)))
        local = sizes.local_dims
        # Orthonormal spread directions per subtopic, as rows: (topics * subtopics, local, dims).
        self.bases = (
            np.stack(
                [
                    np.linalg.qr(self.rng.normal(size=(dims, local)))[0].T
                    for _ in range(N_TOPICS * N_SUBTOPICS)
                ]
            )
            if local
            else None
        )

    @staticmethod
    def _unit(a: np.ndarray) -> np.ndarray:
        return a / np.linalg.norm(a, axis=-1, keepdims=True)

    def texts(self, topics: np.ndarray) -> list[str]:
        """One text per message; lengths are long-tailed (a few very long messages)."""
        n = len(topics)
        lengths = np.clip(
            self.rng.lognormal(mean=math.log(28), sigma=0.85, size=n), 3, 1200
        ).astype(int)
        out = []
        for topic, length in zip(topics, lengths, strict=True):
            n_topic = max(1, int(length * 0.3))
            words = np.concatenate(
                [
                    self.rng.choice(self._topic_arr[topic], size=n_topic),
                    self.rng.choice(self.common, size=length - n_topic),
                ]
            )
            self.rng.shuffle(words)
            out.append(" ".join(words))
        return out

    def vectors(self, topics: np.ndarray, subtopics: np.ndarray | None = None) -> np.ndarray:
        n = len(topics)
        if subtopics is None:
            subtopics = self.rng.integers(0, N_SUBTOPICS, size=n)
        dims, local = self.sizes.dims, self.sizes.local_dims
        v = self.centres[topics] + 0.7 * self.subs[topics, subtopics]
        if not local:
            v += 0.6 * self.rng.normal(size=(n, dims)) / math.sqrt(dims)
            return self._unit(v).astype(np.float32)
        z = self.rng.normal(size=(n, local)) / math.sqrt(local)
        group = topics * N_SUBTOPICS + subtopics
        for g in np.unique(group):
            rows = np.nonzero(group == g)[0]
            v[rows] += LOCAL_SPREAD * (z[rows] @ self.bases[g])
        v += ISOTROPIC_NOISE * self.rng.normal(size=(n, dims)) / math.sqrt(dims)
        return self._unit(v).astype(np.float32)

    def query(self, topic: int) -> tuple[str, np.ndarray]:
        """A keyword query (two words of the topic) and a query vector of the same topic."""
        words = self.rng.choice(self._topic_arr[topic], size=2, replace=False)
        return " ".join(words), self.vectors(np.array([topic]))[0]


# --- sizes ------------------------------------------------------------------------------------


def context_sizes(sizes: Sizes, rng: np.random.Generator) -> list[int]:
    """Message count per context: one holding half of everything, a few large, a long tail."""
    total, n = sizes.messages, sizes.contexts
    big = [sizes.largest_messages]
    for share in (20, 40, 80):
        if n > len(big) + 4 and total // share >= 10:
            big.append(total // share)
    rest_contexts = n - len(big)
    rest = total - sum(big)
    if rest_contexts <= 0 or rest < 2 * rest_contexts:
        raise ValueError("too few messages for that many contexts")
    weights = rng.lognormal(mean=0.0, sigma=1.0, size=rest_contexts)
    tail = rng.multinomial(rest - 2 * rest_contexts, weights / weights.sum()) + 2
    return big + [int(x) for x in tail]


def run_sizes(sizes: Sizes, rng: np.random.Generator) -> list[int]:
    """Steps per run: the long one, the transcript one, and short ones (1..60)."""
    n = sizes.runs
    firsts = [sizes.max_steps, sizes.transcript_steps][:n]
    tail = np.clip(
        rng.lognormal(mean=math.log(8), sigma=0.8, size=max(n - len(firsts), 0)), 2, 60
    ).astype(int)
    return firsts + [int(x) for x in tail]
