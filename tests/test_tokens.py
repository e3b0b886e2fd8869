"""Token counting: tiktoken cl100k_base offline, counts stored at write time, other tokenizers."""

import pytest

from memory_app import errors, tokens
from memory_app.services.contexts import context_get_or_create
from memory_app.services.messages import messages_append


def test_default_tokenizer_is_cl100k_base_loaded_offline():
    assert tokens.default_tokenizer_name() == "cl100k_base"
    assert "cl100k_base" in tokens.available_tokenizers()
    # Known cl100k_base encodings: "hello world" -> [15339, 1917].
    assert tokens.get_encoding("cl100k_base").encode("hello world") == [15339, 1917]


def test_batch_counts_equal_one_by_one_counts():
    texts = ["", "hi", "Sunny, 25C in Paris today", "naïve café ☕ " * 20]
    assert tokens.count_tokens(texts) == [tokens.count_tokens([t])[0] for t in texts]
    assert tokens.count_tokens([]) == []


def test_unknown_tokenizer_is_refused_with_the_available_names():
    with pytest.raises(errors.UnknownTokenizer, match="cl100k_base"):
        tokens.count_tokens(["x"], tokenizer="klingon")


def test_other_encodings_are_offered_when_their_files_are_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    assert {"p50k_base", "o200k_base"} <= set(tokens.available_tokenizers())
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR")
    monkeypatch.delenv("DATA_GYM_CACHE_DIR", raising=False)
    assert "p50k_base" not in tokens.available_tokenizers()


@pytest.mark.django_db
def test_counts_are_stored_at_write_time_and_summed_on_the_context():
    context, _ = context_get_or_create(keys={"test": "tokens"})
    texts = ["hello world", "It is sunny", ""]
    messages = messages_append(
        context=context, items=[{"role": "user", "text": t} for t in texts]
    ).messages
    assert [m.token_count for m in messages] == [2, 3, 0]
    assert {m.tokenizer for m in messages} == {"cl100k_base"}
    context.refresh_from_db()
    assert context.token_count == 5


@pytest.mark.django_db
def test_message_counts_use_stored_values_only_for_the_same_tokenizer():
    from memory_app.models import Message

    context, _ = context_get_or_create(keys={"test": "tokens-other"})
    messages_append(context=context, items=[{"role": "user", "text": "hello world"}])
    Message.objects.filter(context=context).update(token_count=99)
    stored = list(Message.objects.filter(context=context))
    assert tokens.message_token_counts(stored) == [99]  # stored count, same tokenizer
    Message.objects.filter(context=context).update(tokenizer="p50k_base")
    other = list(Message.objects.filter(context=context))
    assert tokens.message_token_counts(other, tokenizer="cl100k_base") == [2]  # counted now
