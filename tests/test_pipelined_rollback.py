"""A savepoint rolled back inside a pipeline (an append's repeat refused in a caller's
transaction) leaves the statements prepared after it working."""

import pytest
from django.db import connection

from memory_app import auth, pipelines
from memory_app.errors import Conflict
from memory_app.services.contexts import context_get_or_create
from memory_app.services.messages import messages_append

pytestmark = pytest.mark.django_db


def test_a_statement_prepared_after_a_refused_repeat_runs_again():
    """psycopg forgets its prepared statements when it sees the savepoint's ROLLBACK and
    deallocates them on the server only after the connection's next statement: a statement
    that next one prepared was deallocated with them, and failed the next time ("prepared
    statement does not exist"), a 500 for the next request on the connection."""
    context, _ = context_get_or_create(keys={"pipelined": "rollback"})
    issued = auth.apikey_create(name="pipelined", scopes=["read"])
    item = {"role": "user", "text": "first", "client_id": "c1"}
    messages_append(context=context, items=[item])
    assert auth.apikey_verify(issued.secret).pk == issued.key.pk  # a statement prepared before
    with pytest.raises(Conflict):
        messages_append(context=context, items=[{**item, "text": "other"}])
    for _ in range(3):  # prepared on the first, executed by name after
        assert auth.apikey_verify(issued.secret).pk == issued.key.pk
    (row,) = pipelines.first_rows([("SELECT %s::int + 1", [1])])
    assert row == (2,)


def test_a_statement_prepared_after_a_savepoint_rolled_back_in_a_pipelined_transaction_runs():
    """The same psycopg behaviour in `pipelined_transaction`: a savepoint rolled back among its
    statements makes psycopg forget the prepared statements, and the next one prepared after
    the block is deallocated with them unless the deallocation runs when the block ends."""
    issued = auth.apikey_create(name="pipelined-transaction", scopes=["read"])
    assert auth.apikey_verify(issued.secret).pk == issued.key.pk  # a statement prepared before
    with connection.cursor() as cursor, pipelines.pipelined_transaction(cursor):
        cursor.execute("SAVEPOINT tried")
        cursor.execute("SELECT 1")
        cursor.execute("ROLLBACK TO SAVEPOINT tried")
    for _ in range(3):  # prepared on the first, executed by name after
        assert auth.apikey_verify(issued.secret).pk == issued.key.pk


@pytest.mark.django_db(transaction=True)
def test_the_same_in_a_pipelined_transaction_of_its_own():
    """Outside any atomic block the pipelined transaction sends its own BEGIN and COMMIT, and a
    savepoint rolled back among its statements leaves the prepared statements working too."""
    issued = auth.apikey_create(name="pipelined-own", scopes=["read"])
    assert auth.apikey_verify(issued.secret).pk == issued.key.pk
    assert not connection.in_atomic_block
    with connection.cursor() as cursor, pipelines.pipelined_transaction(cursor):
        cursor.execute("SAVEPOINT tried")
        cursor.execute("ROLLBACK TO SAVEPOINT tried")
    for _ in range(3):
        assert auth.apikey_verify(issued.secret).pk == issued.key.pk
