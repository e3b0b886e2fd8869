"""Concurrent appends over real connections: seqs 1..N exactly; retries change nothing."""

import threading

import pytest
from django.db import connection

from memory_app.models import Context, Message
from tests.api_helpers import ApiClient, make_key, new_context

THREADS = 8
PER_THREAD = 250


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_eight_writers_get_gap_free_unique_seqs_and_retries_change_nothing():
    api = make_key(scopes=["read", "write"])
    cid = new_context(api)
    url = f"/api/v1/contexts/{cid}/messages"
    errors: list[str] = []
    barrier = threading.Barrier(THREADS)

    def writer(n: int) -> None:
        client = ApiClient(api.secret)  # own client; this thread gets its own DB connection
        try:
            barrier.wait()
            for i in range(PER_THREAD):
                body = {"client_id": f"t{n}-{i}", "role": "user", "text": f"thread {n} message {i}"}
                response = client.post(url, body)
                if response.status_code != 201:
                    errors.append(f"{n}/{i}: {response.status_code} {response.content[:200]}")
                # Every tenth request is retried at once, as a client would after a timeout.
                if i % 10 == 0 and client.post(url, body).status_code != 200:
                    errors.append(f"retry {n}/{i} not 200")
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    total = THREADS * PER_THREAD
    seqs = list(
        Message.objects.filter(context_id=cid).order_by("seq").values_list("seq", flat=True)
    )
    assert seqs == list(range(1, total + 1))
    context = Context.objects.get(pk=cid)
    assert (context.last_seq, context.message_count) == (total, total)
    # Each thread's own messages kept their order.
    for n in range(THREADS):
        mine = Message.objects.filter(context_id=cid, client_id__startswith=f"t{n}-").order_by(
            "seq"
        )
        assert [m.client_id for m in mine] == [f"t{n}-{i}" for i in range(PER_THREAD)]

    # Retrying everything afterwards (a batch per thread) writes nothing.
    for n in range(THREADS):
        body = {
            "messages": [
                {"client_id": f"t{n}-{i}", "role": "user", "text": f"thread {n} message {i}"}
                for i in range(PER_THREAD)
            ]
        }
        response = api.post(f"{url}/batch", body)
        assert response.status_code == 200
        assert not any(response.json()["created"])
    assert Message.objects.filter(context_id=cid).count() == total
    assert Context.objects.get(pk=cid).last_seq == total
