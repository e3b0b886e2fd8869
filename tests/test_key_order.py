"""memory_app.interop.key_order: a JSON value's key order survives a jsonb round trip."""

import json

import pytest
from django.db import connection
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_app.interop import key_order

# What PostgreSQL can store: no NUL, no lone surrogate.
text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=6)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(text, children, max_size=5),
    max_leaves=20,
)


def _through_jsonb(value):
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::jsonb::text", [json.dumps(value)])
        return json.loads(cursor.fetchone()[0])


@pytest.mark.django_db
@settings(max_examples=150, deadline=None)
@given(value=json_values)
def test_restore_after_jsonb_gives_back_the_same_text(value):
    skeleton = key_order.capture(value)
    stored = _through_jsonb(value)
    stored_skeleton = _through_jsonb(skeleton)
    assert json.dumps(key_order.restore(stored, stored_skeleton)) == json.dumps(value)


@pytest.mark.django_db
def test_jsonb_order_is_postgresql_s():
    keys = ["query", "k", "filters", "é", "zz", "ab", "B"]
    assert list(_through_jsonb(dict.fromkeys(keys, 0))) == key_order.jsonb_order(keys)


def test_nothing_is_kept_when_jsonb_keeps_the_order():
    assert key_order.capture({"id": 1, "name": {"a": 1, "bb": [1, {"x": 0}]}}) is None


def test_a_changed_value_keeps_its_data_under_a_stale_skeleton():
    skeleton = key_order.capture({"b2": 1, "a": 2})
    assert key_order.restore({"a": 2, "new": 3}, skeleton) == {"a": 2, "new": 3}
    assert list(key_order.restore({"a": 2, "b2": 1, "c": 0}, skeleton)) == ["b2", "a", "c"]
