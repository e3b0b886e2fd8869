"""The naive baseline: the same work done the way an in-process agent memory does it.

Frameworks' own memories (smolagents `AgentMemory`, Steamship `ChatHistory`, AgentScope
`InMemoryMemory`) keep a context's whole history as a Python list and select from it in Python.
Backed by a database, that means: load the context's messages into Python, then select there;
write one row per message with the ORM. No HTTP layer here (which favours the baseline).
"""

from __future__ import annotations

import json
import re

import numpy as np
from django.db.models import Max
from django.forms.models import model_to_dict

from memory_app import tokens
from memory_app.models import Context, Embedding, Message, Run, Step, ToolCall

_WORD = re.compile(r"\w+")
RRF_K = 60


def load(context_id: int) -> list[Message]:
    return list(
        Message.objects.filter(context_id=context_id, pruned_at__isnull=True).order_by("seq")
    )


def window(context_id: int, k: int) -> list[Message]:
    return load(context_id)[-k:]


def token_window(context_id: int, max_tokens: int, policy: str) -> list[Message]:
    picked, used = [], 0
    for m in reversed(load(context_id)):
        if used >= max_tokens:
            break
        if m.token_count + used < max_tokens:
            used += m.token_count
            picked.append(m)
        elif policy == "contiguous":
            break
    picked.reverse()
    return picked


def _keyword_scores(messages: list[Message], query: str) -> list[tuple[float, Message]]:
    terms = {t.lower() for t in _WORD.findall(query)}
    scored = []
    for m in messages:
        words = _WORD.findall(m.text.lower())
        hits = sum(1 for w in words if w in terms)
        if hits:
            scored.append((hits / (1 + len(words)) ** 0.5, m))
    scored.sort(key=lambda x: (-x[0], -x[1].seq))
    return scored


def keyword(context_id: int, query: str, k: int) -> list[Message]:
    return [m for _, m in _keyword_scores(load(context_id), query)[:k]]


def _semantic(
    messages: list[Message], context_id: int, model: str, vector: np.ndarray, k: int
) -> list[Message]:
    by_id = {m.pk: m for m in messages}
    rows = Embedding.objects.filter(
        context_id=context_id, model=model, vector__isnull=False
    ).values_list("message_id", "vector")
    ids, vecs = [], []
    for mid, vec in rows:
        if mid in by_id:
            ids.append(mid)
            vecs.append(vec)
    if not ids:
        return []
    matrix = np.asarray(vecs, dtype=np.float32)
    sims = matrix @ vector / (np.linalg.norm(matrix, axis=1) * np.linalg.norm(vector))
    top = np.argsort(-sims)[:k]
    return [by_id[ids[i]] for i in top]


def semantic(context_id: int, model: str, vector: np.ndarray, k: int) -> list[Message]:
    return _semantic(load(context_id), context_id, model, vector, k)


def hybrid(context_id: int, query: str, model: str, vector: np.ndarray, k: int) -> list[Message]:
    messages = load(context_id)
    fetch = max(3 * k, 20)
    kw = [m for _, m in _keyword_scores(messages, query)[:fetch]]
    sem = _semantic(messages, context_id, model, vector, fetch)
    fused: dict[int, float] = {}
    by_id = {}
    for ranking in (kw, sem):
        for rank, m in enumerate(ranking, start=1):
            fused[m.pk] = fused.get(m.pk, 0.0) + 1.0 / (RRF_K + rank)
            by_id[m.pk] = m
    best = sorted(fused, key=lambda i: -fused[i])[:k]
    return sorted((by_id[i] for i in best), key=lambda m: m.seq)


def composite(context_id: int, k_window: int, search_k: int) -> list[Message]:
    """Steamship FunctionsBasedAgent's prompt from a list in memory: system message, keyword hits
    for the last user message, the recent window, the last user message."""
    messages = load(context_id)
    system = next((m for m in messages if m.role == "system"), None)
    last_user = next((m for m in reversed(messages) if m.role == "user"), None)
    chosen: dict[int, Message] = {}
    if last_user is not None:
        others = [m for m in messages if m.pk != last_user.pk]
        for _, m in _keyword_scores(others, last_user.text)[:search_k]:
            chosen[m.pk] = m
    for m in [m for m in messages if m.role in ("user", "assistant")][-2 * k_window - 1 :]:
        chosen.setdefault(m.pk, m)
    excluded = {m.pk for m in (system, last_user) if m}
    middle = sorted((m for pk, m in chosen.items() if pk not in excluded), key=lambda m: m.seq)
    return ([system] if system else []) + middle + ([last_user] if last_user else [])


def transcript(run_id: int) -> list[dict]:
    """The run's steps and tool calls read the ORM's default way (one query per step)."""
    run = Run.objects.get(pk=run_id)
    out = [{"role": "system", "content": run.system_prompt}]
    for step in run.steps.filter(pruned_at__isnull=True).order_by("position"):
        if step.model_output is not None:
            out.append({"role": "assistant", "content": step.model_output})
        calls = list(step.tool_calls.order_by("position"))
        if calls:
            out.append(
                {
                    "role": "tool-call",
                    "content": json.dumps(
                        [{"name": c.name, "arguments": c.arguments} for c in calls]
                    ),
                }
            )
        if step.observations is not None:
            out.append({"role": "tool-response", "content": f"Observation:\n{step.observations}"})
    return out


def export(context_id: int) -> str:
    """Everything loaded at once, then serialised (an in-process memory's `state_dict`)."""
    context = Context.objects.get(pk=context_id)
    data = {
        "context": model_to_dict(context),
        "messages": [
            model_to_dict(m) for m in Message.objects.filter(context=context).order_by("seq")
        ],
    }
    return json.dumps(data, default=str)


def append_loop(context_id: int, texts: list[str]) -> None:
    """One ORM INSERT per message (autocommit), seq from the current maximum."""
    last = Message.objects.filter(context_id=context_id).aggregate(s=Max("seq"))["s"] or 0
    tokenizer = tokens.default_tokenizer_name()
    for i, text in enumerate(texts, start=1):
        [count] = tokens.count_tokens([text], tokenizer=tokenizer)
        Message.objects.create(
            context_id=context_id,
            seq=last + i,
            role="user" if i % 2 else "assistant",
            text=text,
            token_count=count,
            tokenizer=tokenizer,
        )


def append_loop_with_vectors(context_id: int, texts: list[str], model: str, vectors) -> None:
    """One ORM INSERT per message and one per vector (autocommit)."""
    last = Message.objects.filter(context_id=context_id).aggregate(s=Max("seq"))["s"] or 0
    tokenizer = tokens.default_tokenizer_name()
    for i, (text, vector) in enumerate(zip(texts, vectors, strict=True), start=1):
        [count] = tokens.count_tokens([text], tokenizer=tokenizer)
        message = Message.objects.create(
            context_id=context_id,
            seq=last + i,
            role="user" if i % 2 else "assistant",
            text=text,
            token_count=count,
            tokenizer=tokenizer,
        )
        Embedding.objects.create(
            message=message,
            context_id=context_id,
            model=model,
            dimensions=len(vector),
            vector=vector,
        )


def steps_loop(run_id: int, steps: list[dict]) -> None:
    """One ORM INSERT per step and per tool call."""
    context_id = Run.objects.filter(pk=run_id).values_list("context_id", flat=True).get()
    last = Step.objects.filter(run_id=run_id).aggregate(p=Max("position"))["p"] or 0
    for i, item in enumerate(steps, start=1):
        calls = item.get("tool_calls", [])
        fields = {k: v for k, v in item.items() if k != "tool_calls"}
        step = Step.objects.create(
            run_id=run_id, context_id=context_id, position=last + i, **fields
        )
        for pos, call in enumerate(calls, start=1):
            ToolCall.objects.create(step=step, context_id=context_id, position=pos, **call)
