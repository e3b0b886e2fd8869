"""Deleting rows of one context by statements that all name it.

Django's `QuerySet.delete()` collects what a delete takes along (its CASCADE and SET_NULL
relations) by the parents' ids alone, and deletes the rows it collected by their ids alone: on
Citus, where the tables of a context's rows are distributed by `context_id`, each of those
statements goes to every shard. `delete_in_context` takes the same rows along, naming the
context in every statement on a table of context rows. The context's rows are all there is to
take: the database's composite foreign keys hold a child row in its parent's context (a step
in its run's, a message and a score in their step's, a vector in its message's; migrations
0020, 0029, 0031, 0037). Tables kept off the shards (the memory records) are written as
Django's collector writes them.
"""

from __future__ import annotations

from django.db import models
from django.db.models.deletion import get_candidate_relations_to_delete
from django.db.models.signals import post_delete, pre_delete


def delete_in_context(model: type[models.Model], *, context_id: int, ids: list[int]) -> int:
    """Delete these rows of `model` in context `context_id`, and what Django's cascade would
    take along (CASCADE deleted, SET_NULL set to null, DO_NOTHING left to the database's own
    cascade), children first. Answers how many of the rows went.

    No delete signal is sent: a model with a receiver is refused rather than its receiver
    skipped."""
    if not ids:
        return 0
    _without_receivers(model)
    for relation in get_candidate_relations_to_delete(model._meta):
        _take_along(relation, context_id=context_id, ids=ids)
    rows = model._base_manager.filter(context_id=context_id, pk__in=ids)
    return rows._raw_delete(rows.db)


def _take_along(relation, *, context_id: int, ids: list[int]) -> None:
    """What the deletion of rows `ids` does to the rows of `relation` that point at them."""
    field, related = relation.field, relation.related_model
    on_delete = field.remote_field.on_delete
    if on_delete is models.DO_NOTHING:
        return
    if on_delete not in (models.CASCADE, models.SET_NULL):
        # PROTECT, RESTRICT, SET_DEFAULT, SET(...): Django's collector is the one to follow.
        raise TypeError(f"{related.__name__}.{field.name}: on_delete {on_delete.__name__}")
    if related is relation.model and on_delete is models.CASCADE:
        # Rows that cascade to rows of their own table may form a cycle, which only the
        # collector's memory of what it took stops.
        raise TypeError(f"{related.__name__}.{field.name}: a cascade within its own table")
    rows = related._base_manager.filter(**{f"{field.attname}__in": ids})
    if not _of_contexts(related):
        # A table kept off the shards: its rows are found by the ids wherever they are.
        if on_delete is models.SET_NULL:
            rows.update(**{field.attname: None})
        else:
            rows.delete()
        return
    rows = rows.filter(context_id=context_id)
    if on_delete is models.SET_NULL:
        rows.update(**{field.attname: None})
    elif _leaf(related):
        _without_receivers(related)
        rows._raw_delete(rows.db)
    else:
        pks = list(rows.values_list("pk", flat=True))
        delete_in_context(related, context_id=context_id, ids=pks)


def _of_contexts(model: type[models.Model]) -> bool:
    """Whether every row of `model` is a context's (distributed by it on Citus)."""
    return any(f.attname == "context_id" and not f.null for f in model._meta.concrete_fields)


def _leaf(model: type[models.Model]) -> bool:
    """Whether a delete of `model`'s rows takes nothing along that Django would follow."""
    return all(
        r.field.remote_field.on_delete is models.DO_NOTHING
        for r in get_candidate_relations_to_delete(model._meta)
    )


def _without_receivers(model: type[models.Model]) -> None:
    if pre_delete.has_listeners(model) or post_delete.has_listeners(model):
        raise TypeError(f"{model.__name__} has delete receivers: delete it with Django's delete")
