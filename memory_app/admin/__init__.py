"""Django admin for every model: power users' view of the raw store.

Pruned items stay visible (filter "pruned") and can be pruned/restored with audited actions.
Every create, edit and delete made here leaves an audit event, as the dashboard's changes do.
Deleting what agents wrote (contexts, messages, runs, steps, tool calls, memories, trace spans)
is a purge: irreversible, so Django admin's own delete pages (one object, or "Delete selected")
ask for the dashboard's typed purge phrase, and messages, steps, runs and memories go through the
purge of the write path (counters kept, their text erased from edit events and trace spans).
Admin users keep the delete button they know; what changes is the one field on the page that
already asks "are you sure?".
"""

from memory_app.admin import registry  # noqa: F401 - registers every model's page
from memory_app.admin.audited import PURGE_PHRASE

__all__ = ["PURGE_PHRASE"]
