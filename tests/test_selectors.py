"""Selectors against Steamship's verified behaviour (reference/frameworks.md §2.5, ss_demo.out).

Steamship's verified history: [sys, u1, a1, u2, fnsel, fnres, a2, agent-status, u3]. Texts are
chosen so that cl100k_base counts equal the word counts the reference run used as its token
stand-in (asserted below), so the verified token-window ids carry over unchanged.
"""

import pytest

from memory_app import errors, selectors, tokens
from memory_app.errors import Invalid
from memory_app.models import Context, Message
from memory_app.search.messages import search_messages
from memory_app.selectors import CompositeSpec, SearchSpec, TokenWindowSpec, WindowSpec, select
from memory_app.services.contexts import context_get_or_create
from memory_app.services.curation import messages_set_pruned
from memory_app.services.messages import messages_append

STEAMSHIP_HISTORY = [
    ("b0", {"role": "system", "text": "You are helpful"}),
    ("b1", {"role": "user", "text": "hi"}),
    ("b2", {"role": "assistant", "text": "hello"}),
    ("b3", {"role": "user", "text": "weather"}),
    (
        "b4",
        {
            "role": "assistant",
            "text": '{"name":"weather","arguments":"{}"}',
            "tags": ["function-selection"],
        },
    ),
    ("b5", {"role": "function", "name": "weather", "text": "sunny"}),
    ("b6", {"role": "assistant", "text": "It is sunny"}),
    ("b7", {"role": "agent", "text": "status: running tool"}),
    ("b8", {"role": "user", "text": "thanks, and tomorrow?"}),
]


def build(keys, items):
    context, _ = context_get_or_create(keys=keys)
    result = messages_append(context=context, items=[dict(i, client_id=cid) for cid, i in items])
    return context, {m.pk: m.client_id for m in result.messages}


def names(selection, id_to_name):
    return [id_to_name[pk] for pk in selection.ids]


@pytest.fixture
def steamship(db):
    return build({"test": "steamship"}, STEAMSHIP_HISTORY)


def test_history_texts_count_like_the_reference_stand_in(steamship):
    words = [
        len(i["text"].split()) for _, i in STEAMSHIP_HISTORY if i["role"] in ("user", "assistant")
    ]
    counted = tokens.count_tokens(
        [i["text"] for _, i in STEAMSHIP_HISTORY if i["role"] in ("user", "assistant")]
    )
    assert counted[:3] == words[:3] and counted[-2] == words[-2]  # hi, hello, weather, It is sunny


@pytest.mark.parametrize(
    ("k", "expected"),
    [
        (1, ["b3", "b4", "b5", "b6"]),
        (2, ["b1", "b2", "b3", "b4", "b5", "b6"]),
        (3, ["b1", "b2", "b3", "b4", "b5", "b6"]),
    ],
)
def test_steamship_turn_window_selects_the_verified_ids(steamship, k, expected):
    context, id_to_name = steamship
    sel = select(context=context, spec=WindowSpec(k=k, semantics="steamship"))
    assert names(sel, id_to_name) == expected
    assert all(item.reason.startswith("window") for item in sel.items)


def test_steamship_window_never_examines_the_oldest_message(db):
    context, id_to_name = build(
        {"test": "starts-with-user"},
        [
            ("b0", {"role": "user", "text": "first question"}),
            ("b1", {"role": "assistant", "text": "first answer"}),
            ("b2", {"role": "user", "text": "second"}),
        ],
    )
    assert names(
        select(context=context, spec=WindowSpec(k=5, semantics="steamship")), id_to_name
    ) == ["b1"]


@pytest.mark.parametrize("pruned_oldest", [False, True])
def test_steamship_window_finds_the_oldest_live_message_past_the_first_chunk(
    db, pruned_oldest, system_actor
):
    """A window reaching back over more than the first chunk read stops at the oldest live
    message, which it leaves out, as Steamship does."""
    n = selectors.FIRST_SCAN_CHUNK + 7
    items = [
        (f"m{i}", {"role": "user" if i % 2 == 0 else "assistant", "text": f"message {i}"})
        for i in range(n)
    ]
    context, id_to_name = build({"test": f"long-{pruned_oldest}"}, items)
    if pruned_oldest:
        oldest = Message.objects.get(context=context, seq=1)
        messages_set_pruned(context=context, ids=[oldest.pk], pruned=True, actor=system_actor)
    first_live = 1 if pruned_oldest else 0
    # The last message is a user prompt (left out), the oldest live one is never examined.
    expected = [f"m{i}" for i in range(first_live + 1, n - 1)]
    selection = select(context=context, spec=WindowSpec(k=selectors.MAX_K, semantics="steamship"))
    assert names(selection, id_to_name) == expected
    assert any("oldest message, never examined" in note for note in selection.notes)


def test_steamship_window_is_one_read(db, django_assert_num_queries):
    """The newest messages, read as the plain window reads them; nothing else."""
    context, _ = build(
        {"test": "one-read"}, [(f"r{i}", {"role": "user", "text": "q"}) for i in range(3)]
    )
    with django_assert_num_queries(1):
        select(context=context, spec=WindowSpec(k=2, semantics="steamship"))


def test_empty_history_selects_nothing(db):
    context, _ = context_get_or_create(keys={"test": "empty"})
    for spec in (
        WindowSpec(k=3),
        WindowSpec(k=3, semantics="steamship"),
        TokenWindowSpec(max_tokens=10),
    ):
        assert select(context=context, spec=spec).items == []


def test_plain_window_is_the_last_k_messages_of_any_role(steamship):
    context, id_to_name = steamship
    sel = select(context=context, spec=WindowSpec(k=3))
    assert names(sel, id_to_name) == ["b6", "b7", "b8"]
    assert sel.total_tokens == sum(i.message.token_count for i in sel.items)


@pytest.mark.parametrize(
    ("max_tokens", "expected"),
    [(3, ["b2", "b3"]), (5, ["b3", "b6"]), (50, ["b1", "b2", "b3", "b6"])],
)
def test_steamship_token_window_skip_policy_selects_the_verified_ids(
    steamship, max_tokens, expected
):
    context, id_to_name = steamship
    sel = select(
        context=context,
        spec=TokenWindowSpec(max_tokens=max_tokens, policy="skip", semantics="steamship"),
    )
    assert names(sel, id_to_name) == expected
    assert sel.total_tokens < max_tokens


def test_skip_policy_includes_older_smaller_messages_past_an_oversized_one(db):
    big = "word " * 40
    context, id_to_name = build(
        {"test": "oversized"},
        [
            ("u1", {"role": "user", "text": "short one"}),
            ("a1", {"role": "assistant", "text": big}),
            ("u2", {"role": "user", "text": "tiny"}),
            ("a2", {"role": "assistant", "text": big}),
            ("u3", {"role": "user", "text": "the prompt"}),
        ],
    )
    skip = select(
        context=context, spec=TokenWindowSpec(max_tokens=10, policy="skip", semantics="steamship")
    )
    contiguous = select(
        context=context,
        spec=TokenWindowSpec(max_tokens=10, policy="contiguous", semantics="steamship"),
    )
    assert names(skip, id_to_name) == ["u1", "u2"]
    assert names(contiguous, id_to_name) == []
    assert any("skipped" in n for n in skip.notes)


def test_token_window_budget_is_strict(db):
    context, id_to_name = build(
        {"test": "strict"},
        [
            ("a", {"role": "user", "text": "one two"}),
            ("b", {"role": "assistant", "text": "three four"}),
        ],
    )
    assert [
        i.tokens for i in select(context=context, spec=TokenWindowSpec(max_tokens=100)).items
    ] == [2, 2]
    # 2 + 2 == 4 is not strictly below 4: only the newest fits.
    assert names(select(context=context, spec=TokenWindowSpec(max_tokens=4)), id_to_name) == ["b"]
    assert names(select(context=context, spec=TokenWindowSpec(max_tokens=5)), id_to_name) == [
        "a",
        "b",
    ]


def test_token_window_counts_on_the_fly_when_stored_counts_are_from_another_tokenizer(steamship):
    # Only cl100k_base ships offline here; stored counts "from another tokenizer" stand in for a
    # request under a tokenizer other than the one used at write time.
    from memory_app.models import Message

    context, _ = steamship
    Message.objects.filter(context=context).update(tokenizer="r50k_base", token_count=999)
    sel = select(context=context, spec=TokenWindowSpec(max_tokens=1000, tokenizer="cl100k_base"))
    assert sel.items, "nothing fits: stored counts were used"
    assert [i.tokens for i in sel.items] == tokens.count_tokens([m.text for m in sel.messages])
    assert sel.tokenizer == "cl100k_base"


def test_unknown_tokenizer_is_refused(steamship):
    context, _ = steamship
    with pytest.raises(errors.UnknownTokenizer):
        select(context=context, spec=TokenWindowSpec(max_tokens=10, tokenizer="no-such-encoding"))


@pytest.mark.parametrize(
    "spec",
    [
        WindowSpec(k=0),
        WindowSpec(k=3, semantics="other"),
        TokenWindowSpec(max_tokens=0),
        TokenWindowSpec(max_tokens=5, policy="greedy"),
        SearchSpec(query="x", k=0),
    ],
)
def test_bad_parameters_are_invalid(steamship, spec):
    context, _ = steamship
    with pytest.raises(Invalid):
        select(context=context, spec=spec)


def test_pruned_messages_never_appear(steamship, system_actor):
    context, id_to_name = steamship
    by_name = {v: k for k, v in id_to_name.items()}
    messages_set_pruned(
        context=context, ids=[by_name["b6"], by_name["b2"]], pruned=True, actor=system_actor
    )
    specs = [
        WindowSpec(k=50),
        WindowSpec(k=5, semantics="steamship"),
        TokenWindowSpec(max_tokens=1000),
        TokenWindowSpec(max_tokens=1000, policy="skip", semantics="steamship"),
        SearchSpec(query="sunny hello", k=10, mode="keyword"),
        CompositeSpec(),
    ]
    for spec in specs:
        chosen = set(names(select(context=context, spec=spec), id_to_name))
        assert not chosen & {"b2", "b6"}, spec
    # The Steamship window now sees the history as if they were deleted.
    sel = select(context=context, spec=WindowSpec(k=1, semantics="steamship"))
    assert names(sel, id_to_name) == ["b1", "b3", "b4", "b5"]


def test_composite_follows_functions_based_agent_order_and_dedup(db):
    context, id_to_name = build(
        {"test": "composite"},
        [
            ("s", {"role": "system", "text": "You are a travel assistant"}),
            ("u1", {"role": "user", "text": "I love Lisbon in spring"}),
            ("a1", {"role": "assistant", "text": "Lisbon is lovely in spring"}),
            ("u2", {"role": "user", "text": "book a table for two"}),
            ("a2", {"role": "assistant", "text": "done, table booked"}),
            ("u3", {"role": "user", "text": "what about the weather"}),
            ("a3", {"role": "assistant", "text": "mild and dry"}),
            ("u4", {"role": "user", "text": "plan a Lisbon trip in spring"}),
            ("f1", {"role": "tool-call", "text": '{"name":"search","arguments":"{}"}'}),
            ("f2", {"role": "function", "name": "search", "text": "three hotels found"}),
        ],
    )
    sel = select(
        context=context,
        spec=CompositeSpec(
            window=WindowSpec(k=1, semantics="steamship"), search_k=3, search_mode="keyword"
        ),
    )
    got = names(sel, id_to_name)
    # system; search hits for u4 (u1, a1; u4 itself excluded) and the 1-turn window, by position
    # and de-duplicated; then u4; then the function calls since u4. The history ends in function
    # blocks, so Steamship's window keeps u4 as a conversation message and counts it: its one
    # turn is (a3, u4), and u4 is then de-duplicated in favour of its place at the end.
    assert got == ["s", "u1", "a1", "a3", "u4", "f1", "f2"]
    assert len(got) == len(set(got))
    reasons = {id_to_name[i.message.pk]: i.reason for i in sel.items}
    assert reasons["s"] == "system message"
    assert reasons["u1"].startswith("search hit")
    assert reasons["a3"].startswith("window")
    assert reasons["u4"].startswith("last user message")


def test_status_messages_of_any_role_are_never_selected(db):
    """A `tool` (or `user`) message tagged status-message is a status, not a function result or
    a prompt: neither the Steamship window nor the composite selector takes it."""
    context, id_to_name = build(
        {"test": "status-tagged"},
        [
            ("s", {"role": "system", "text": "You are a weather assistant"}),
            ("u1", {"role": "user", "text": "weather in Lisbon"}),
            ("f1", {"role": "tool-call", "text": '{"name":"weather","arguments":"{}"}'}),
            ("st1", {"role": "tool", "text": "weather tool running", "tags": ["status-message"]}),
            ("f2", {"role": "function", "name": "weather", "text": "sunny"}),
            ("a1", {"role": "assistant", "text": "sunny in Lisbon"}),
            ("u2", {"role": "user", "text": "and the weather tomorrow?"}),
            ("f3", {"role": "tool-call", "text": '{"name":"weather","arguments":"{}"}'}),
            ("st2", {"role": "tool", "text": "weather tool running", "tags": ["status-message"]}),
            ("st3", {"role": "user", "text": "weather status", "tags": ["status-message"]}),
        ],
    )
    window = select(context=context, spec=WindowSpec(k=2, semantics="steamship"))
    # f3 follows the last user message, so Steamship's backward walk has not seen a user yet.
    assert names(window, id_to_name) == ["u1", "f1", "f2", "a1", "u2"]
    composite = select(
        context=context,
        spec=CompositeSpec(
            window=WindowSpec(k=1, semantics="steamship"), search_k=2, search_mode="keyword"
        ),
    )
    got = names(composite, id_to_name)
    assert not {"st1", "st2", "st3"} & set(got)
    # The last user message is u2 (st3 is a status), and only real function calls follow it.
    assert got[0] == "s" and got[-2:] == ["u2", "f3"]
    assert [n for n in got if n.startswith("u")][-1] == "u2"
    # search_k hits kept after the statuses among the search's answers are skipped (the system
    # message may be one: it is then listed once, as the system message).
    u2 = Message.objects.get(context=context, seq=7)
    found = search_messages(
        context=context, query=u2.text, k=8, mode="keyword", exclude_ids=[u2.pk]
    ).hits
    assert {"st1", "st2", "st3"} & {id_to_name[h.message.pk] for h in found}
    kept = [id_to_name[h.message.pk] for h in found if id_to_name[h.message.pk][:2] != "st"][:2]
    assert len(kept) == 2 and set(kept) <= set(got)
    assert [i for i in composite.items if i.reason.startswith("search hit")]


@pytest.mark.parametrize(
    "window",
    [WindowSpec(k=4, semantics="plain"), TokenWindowSpec(max_tokens=1000, semantics="plain")],
    ids=["plain window", "plain token window"],
)
def test_the_composite_never_selects_a_status_message_even_through_a_plain_window(db, window):
    """A plain window takes the last messages whatever they are; the composite built on it still
    leaves status messages out, as its search hits do."""
    context, id_to_name = build(
        {"test": "status-plain-window", "window": window.kind},
        [
            ("s", {"role": "system", "text": "You are a weather assistant"}),
            ("u1", {"role": "user", "text": "weather in Lisbon"}),
            ("a1", {"role": "assistant", "text": "sunny"}),
            ("st1", {"role": "tool", "text": "weather tool running", "tags": ["status-message"]}),
            ("st2", {"role": "agent", "text": "weather agent thinking"}),
            ("u2", {"role": "user", "text": "weather tomorrow?"}),
        ],
    )
    got = select(context=context, spec=CompositeSpec(window=window, search_mode="keyword"))
    assert names(got, id_to_name) == ["s", "u1", "a1", "u2"]
    assert any("status messages left out" in n for n in got.notes)


def test_composite_window_and_search_overlap_is_listed_once(db):
    context, id_to_name = build(
        {"test": "composite-overlap"},
        [
            ("s", {"role": "system", "text": "Be brief"}),
            ("u1", {"role": "user", "text": "apples are red"}),
            ("a1", {"role": "assistant", "text": "yes apples are red"}),
            ("u2", {"role": "user", "text": "apples"}),
        ],
    )
    sel = select(
        context=context,
        spec=CompositeSpec(window=WindowSpec(k=2, semantics="steamship"), search_mode="keyword"),
    )
    assert names(sel, id_to_name) == ["s", "u1", "a1", "u2"]
    assert sel.items[1].reason.startswith("search hit")  # search came first, so its reason is kept


def test_search_selector_returns_hits_oldest_first_with_reasons(steamship):
    context, id_to_name = steamship
    sel = select(context=context, spec=SearchSpec(query="sunny", k=5, mode="keyword"))
    assert names(sel, id_to_name) == ["b5", "b6"]
    assert all(i.reason.startswith("search: rank") for i in sel.items)


def test_semantic_search_without_provider_says_so(steamship, settings):
    from memory_app.errors import SemanticUnavailable

    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"
    context, _ = steamship
    with pytest.raises(SemanticUnavailable, match="embedding provider"):
        select(context=context, spec=SearchSpec(query="sunny", mode="semantic"))
    assert (
        selectors.select(context=context, spec=SearchSpec(query="sunny"))
        .notes[0]
        .startswith("mode keyword")
    )


# --- over HTTP ---------------------------------------------------------------------------------


def _api_history(api):
    from tests.api_helpers import append, new_context

    cid = new_context(api, {"user": "ada", "chat": "select"})
    ids = {}
    for name, item in STEAMSHIP_HISTORY:
        ids[append(api, cid, client_id=name, **item)["id"]] = name
    return cid, ids


def test_select_endpoint_answers_the_same_as_the_domain_function(db):
    from tests.api_helpers import make_key

    api = make_key(scopes=["read", "write"])
    cid, ids = _api_history(api)
    body = {"selector": "token_window", "max_tokens": 5, "policy": "skip", "semantics": "steamship"}
    response = api.post(f"/api/v1/contexts/{cid}/select", body)
    assert response.status_code == 200, response.content
    data = response.json()
    assert [ids[i["message"]["id"]] for i in data["items"]] == ["b3", "b6"]
    assert (
        data["total_tokens"] == 4 and data["max_tokens"] == 5 and data["tokenizer"] == "cl100k_base"
    )
    assert all(i["reason"] for i in data["items"])
    composite = api.post(
        f"/api/v1/contexts/{cid}/select",
        {"selector": "composite", "window": {"kind": "window", "k": 1}},
    )
    assert composite.status_code == 200, composite.content
    assert [ids[i["message"]["id"]] for i in composite.json()["items"]][0] == "b0"


def test_search_answers_in_rank_order_with_scores_when_asked(db, settings):
    from tests.api_helpers import make_key

    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"
    api = make_key(scopes=["read", "write"])
    cid, ids = _api_history(api)
    body = {"selector": "search", "query": "is it sunny weather", "k": 5, "mode": "keyword"}
    prompt = api.post(f"/api/v1/contexts/{cid}/select", body).json()["items"]
    ranked = api.post(f"/api/v1/contexts/{cid}/select", {**body, "order": "rank"}).json()["items"]
    assert len(ranked) >= 3
    # The prompt order (the default) is the conversation's, oldest first.
    seqs = [i["message"]["seq"] for i in prompt]
    assert seqs == sorted(seqs)
    # Ranked: the same hits, best first, each with its score and rank.
    assert sorted(i["message"]["id"] for i in ranked) == sorted(i["message"]["id"] for i in prompt)
    scores = [i["score"] for i in ranked]
    assert scores == sorted(scores, reverse=True) and scores[0] > scores[-1]
    assert [i["reason"].split()[2] for i in ranked] == [str(n) for n in range(1, len(ranked) + 1)]
    domain = select(
        context=Context.objects.get(pk=cid),
        spec=SearchSpec(query=body["query"], k=5, mode="keyword", order="rank"),
    )
    assert [ids[i.message.pk] for i in domain.items] == [ids[i["message"]["id"]] for i in ranked]


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"selector": "search", "query": "x", "order": "random"}, 422),
        ({"selector": "token_window", "max_tokens": 10, "tokenizer": "klingon"}, 422),
        ({"selector": "window"}, 422),
        ({"selector": "window", "k": 0}, 422),
        ({"selector": "token_window", "max_tokens": 10, "policy": "greedy"}, 422),
        ({"selector": "search", "query": "x", "mode": "semantic"}, 422),
        ({"selector": "search", "query": "", "mode": "keyword"}, 422),
        ({"selector": "teleport", "k": 1}, 422),
        # Not an object where one is asked for (a window that is not one was a default window).
        ({"selector": "composite", "window": "abc"}, 422),
        ({"selector": "composite", "window": [2]}, 422),
        (["window", 2], 422),
    ],
)
def test_select_endpoint_refuses_bad_options_with_422(db, settings, body, status):
    from tests.api_helpers import make_key

    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"
    api = make_key(scopes=["read", "write"])
    cid, _ = _api_history(api)
    response = api.post(f"/api/v1/contexts/{cid}/select", body)
    assert response.status_code == status, response.content
    assert response.json()["detail"]


def test_select_endpoint_hides_other_tenants_contexts(db):
    from tests.api_helpers import make_key

    owner = make_key(scopes=["read", "write"])
    cid, _ = _api_history(owner)
    stranger = make_key(scopes=["read"], context_keys={"user": "bob"})
    assert (
        stranger.post(f"/api/v1/contexts/{cid}/select", {"selector": "window", "k": 3}).status_code
        == 404
    )


# --- random histories against a test-side transcription of Steamship's two selectors -----------
# Written from reference/frameworks.md §2.5 (not product code): the product must agree with it on
# any history, including pruned messages (treated as deleted) and oversized ones.

from hypothesis import HealthCheck, given  # noqa: E402
from hypothesis import settings as hsettings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

KINDS = {
    "system": {"role": "system"},
    "user": {"role": "user"},
    "assistant": {"role": "assistant"},
    "fnsel": {"role": "assistant", "tags": ["function-selection"]},
    "toolcall": {"role": "tool-call"},
    "fnres": {"role": "function"},
    "status": {"role": "agent"},
    # Steamship's tool/user status messages: a status tag outranks the role.
    "toolstatus": {"role": "tool", "tags": ["status-message"]},
    "userstatus": {"role": "user", "tags": ["status-message"]},
}
WORDS = ["hi", "ok", "yes", "no", "sun", "rain", "tea"]


def _oracle_is_user(kind):
    return kind == "user"


def _oracle_is_conversation(kind):
    return kind in ("user", "assistant")


def _oracle_is_function(kind):
    return kind in ("fnsel", "toolcall", "fnres")


def oracle_message_window(history, k):
    msgs = list(history)
    seen_user = False
    if _oracle_is_user(msgs[-1][1]):
        seen_user = True
        msgs.pop()
    selected, counted, index = [], 0, len(msgs) - 1
    while counted < k * 2 and index > 0:
        name, kind, _ = msgs[index]
        if _oracle_is_user(kind):
            seen_user = True
        if _oracle_is_conversation(kind):
            selected.append(name)
            counted += 1
        elif seen_user and _oracle_is_function(kind):
            selected.append(name)
        index -= 1
    return selected[::-1]


def oracle_token_window(history, max_tokens):
    msgs = list(history)
    if _oracle_is_user(msgs[-1][1]):
        msgs.pop()
    selected, current = [], 0
    for name, kind, n in reversed(msgs):
        if _oracle_is_conversation(kind) and current < max_tokens and n + current < max_tokens:
            selected.append(name)
            current += n
    return selected[::-1]


history_strategy = st.lists(
    st.tuples(
        st.sampled_from(sorted(KINDS)),
        st.lists(st.sampled_from(WORDS), min_size=0, max_size=6),
        st.booleans(),
    ),
    min_size=1,
    max_size=14,
)
_counter = iter(range(10**9))


@pytest.mark.django_db
@hsettings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(history=history_strategy, k=st.integers(1, 4), max_tokens=st.integers(1, 25))
def test_random_histories_select_what_steamship_selects(history, k, max_tokens, system_actor):
    items = [
        (f"m{i}", dict(KINDS[kind], text=" ".join(words)))
        for i, (kind, words, _) in enumerate(history)
    ]
    context, id_to_name = build({"test": "random", "n": next(_counter)}, items)
    pruned = [pk for pk, name in id_to_name.items() if history[int(name[1:])][2]]
    if pruned:
        messages_set_pruned(context=context, ids=pruned, pruned=True, actor=system_actor)
    from memory_app.models import Message

    counts = dict(Message.objects.filter(context=context).values_list("client_id", "token_count"))
    live = [
        (f"m{i}", kind, counts[f"m{i}"])
        for i, (kind, _, is_pruned) in enumerate(history)
        if not is_pruned
    ]

    window = select(context=context, spec=WindowSpec(k=k, semantics="steamship"))
    tokens_skip = select(
        context=context,
        spec=TokenWindowSpec(max_tokens=max_tokens, policy="skip", semantics="steamship"),
    )
    if not live:  # Steamship raises IndexError on an empty history; we answer nothing
        assert window.items == [] and tokens_skip.items == []
        return
    assert names(window, id_to_name) == oracle_message_window(live, k)
    assert names(tokens_skip, id_to_name) == oracle_token_window(live, max_tokens)


def _reference_skip(rows, budget):
    """Steamship's skip rule over every live message, newest first: (id, tokens) pairs in."""
    used, picked = 0, []
    for pk, n in rows:
        if n + used < budget:
            used += n
            picked.append(pk)
    return sorted(picked)


@pytest.mark.parametrize("budget", [40, 200, 1000])
def test_skip_policy_on_a_long_history_selects_what_a_full_scan_selects(db, budget):
    """The skip scan reads on only rows that can still fit; the choice must be a full scan's."""
    context, _ = context_get_or_create(keys={"long": "skip"})
    sizes = [(i * 37) % 23 + (150 if i % 7 == 0 else 0) for i in range(400)]
    messages_append(
        context=context,
        items=[
            {"role": "user" if i % 2 else "assistant", "text": " word" * n}
            for i, n in enumerate(sizes)
        ],
    )
    rows = list(context.messages.order_by("-seq").values_list("pk", "token_count"))
    chosen = select(context=context, spec=TokenWindowSpec(max_tokens=budget, policy="skip"))
    assert sorted(item.message.pk for item in chosen.items) == _reference_skip(rows, budget)
    assert len(chosen.items) > 0
    # The scan reads light rows; what it returns are the stored messages, whole.
    stored = {m.pk: m for m in context.messages.all()}
    for item in chosen.items:
        assert isinstance(item.message, Message)
        assert (item.message.text, item.message.created_at) == (
            stored[item.message.pk].text,
            stored[item.message.pk].created_at,
        )


def test_skip_policy_recounts_rows_stored_under_another_tokenizer_past_the_first_chunk(db):
    """A row whose stored count is another tokenizer's (here inflated) is recounted, even
    when the scan narrows to rows whose stored count fits."""
    context, _ = context_get_or_create(keys={"long": "recount"})
    messages_append(context=context, items=[{"role": "user", "text": "tiny"}])
    messages_append(
        context=context, items=[{"role": "assistant", "text": " word" * 30} for _ in range(120)]
    )
    old = context.messages.get(seq=1)
    type(old).objects.filter(pk=old.pk).update(tokenizer="legacy_bpe", token_count=10_000)
    chosen = select(context=context, spec=TokenWindowSpec(max_tokens=100, policy="skip"))
    assert old.pk in [item.message.pk for item in chosen.items]
