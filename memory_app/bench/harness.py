"""What every measurement shares: the `Bench` it runs with, `BenchError`, the sizes it reads
with, and the naive baseline's size limit.

Requests go through Django's full stack in-process (`django.test.Client`: WSGI handler,
middleware, API-key authentication, JSON parsing and rendering) with a real API key; dashboard
pages with a logged-in superuser. Server time is the time until the response is complete.
Each area's module (selectors, recall, transcript, export, dashboard, storage, ingest) adds
rows (or "not measured" lines) to the report.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from django.test import Client
from django.urls import Resolver404, resolve

from memory_app.bench.dataset import Dataset, Generator
from memory_app.bench.measure import Latency, Report, time_calls, time_each
from memory_app.models import Context

API = "/api/v1"
# A dataset whose largest context holds this many messages is a scale run: it has a large context
# that is a small part of the store (the filtered-HNSW case) and bounded-read targets.
SCALE_MESSAGES = 500_000
WINDOW_K = 20
MAX_TOKENS = 2000
SEARCH_K = 10


@dataclass
class Bench:
    data: Dataset
    report: Report
    api: Client
    web: Client
    log: Callable[[str], None]
    samples: int
    quick: bool
    api_secret: str = ""

    def gen(self, seed_offset: int = 1) -> Generator:
        """Same vocabulary and topic vectors as the dataset, fresh random draws for queries."""
        gen = Generator(self.data.sizes)
        gen.rng = np.random.default_rng(self.data.sizes.seed + 1000 + seed_offset)
        return gen

    def post(self, path: str, body: dict, expect: tuple[int, ...] = (200, 201)):
        response = self.api.post(path, data=json.dumps(body), content_type="application/json")
        if response.status_code not in expect:
            raise BenchError(
                f"POST {path} answered {response.status_code}: {response.content[:300]!r}"
            )
        return response

    def post_raw(self, path: str, body: str, expect: tuple[int, ...] = (200, 201)):
        """POST an already encoded JSON body (the client's encoding is not server time)."""
        response = self.api.post(path, data=body, content_type="application/json")
        if response.status_code not in expect:
            raise BenchError(
                f"POST {path} answered {response.status_code}: {response.content[:300]!r}"
            )
        return response

    def get(self, path: str, client: Client | None = None, expect: tuple[int, ...] = (200,)):
        response = (client or self.api).get(path)
        if response.status_code not in expect:
            raise BenchError(
                f"GET {path} answered {response.status_code}: {response.content[:300]!r}"
            )
        return response


class BenchError(Exception):
    pass


def route_exists(path: str) -> bool:
    try:
        resolve(path)
    except Resolver404:
        return False
    return True


def module_available(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


# The naive baseline loads a whole context into Python: above this it would take minutes per
# call and gigabytes, so larger contexts are measured without it (the peers mode compares there).
BASELINE_MAX_MESSAGES = 200_000


def context_size(cid: int) -> int:
    return Context.objects.only("message_count").get(pk=cid).message_count


def contexts_label(b: Bench) -> dict[str, int]:
    """The contexts read from: a typical small one, the largest, and at scale also a large one
    that is a small part of the store (the filtered-HNSW case)."""
    labels = {
        f"small context ({context_size(b.data.small_context_id):,} msgs)": b.data.small_context_id
    }
    if b.data.sizes.largest_messages >= SCALE_MESSAGES:
        # Context 3 holds 1/40 of the messages (30,000 of 1,200,000): see dataset.context_sizes.
        labels[f"large context in the store ({context_size(3):,} msgs)"] = 3
    labels[f"largest context ({context_size(b.data.largest_context_id):,} msgs)"] = (
        b.data.largest_context_id
    )
    return labels


def naive_calls(cid: int, fn: Callable[[], object], n: int) -> Latency | None:
    return time_calls(fn, n=n, warmup=0) if context_size(cid) <= BASELINE_MAX_MESSAGES else None


def naive_each(cid: int, fns: list[Callable[[], object]]) -> Latency | None:
    return time_each(fns, warmup=0) if context_size(cid) <= BASELINE_MAX_MESSAGES else None
