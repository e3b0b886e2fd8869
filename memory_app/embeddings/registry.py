"""Which model names vectors may be stored and searched under, and their dimensions: the
`EmbeddingModel` rows an operator registered, and the configured provider's model, which
registers itself (the local model at once, any other when the worker first embeds with it).

Every vector path asks here (`client_vectors` for the API's, MCP's and selectors' vectors, the
backup restore for embedding lines, `ensure_model_index` before it builds an index), so a name
nobody registered is refused before it is stored or indexed."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction

from memory_app.audit import Actor, audit_record
from memory_app.embeddings.providers import LOCAL_DIMENSIONS, get_provider
from memory_app.errors import UnregisteredModel
from memory_app.models import EmbeddingModel

PROVIDER_ACTOR = Actor.system("system:provider")
# Registrations are never removed, so a name found once stays valid for the process; names not
# found are asked again each time (another process may have registered them meanwhile).
_registered: dict[str, int] = {}


def forget() -> None:
    """Drop the process's cache (tests whose database rolls back registrations)."""
    _registered.clear()


def registered_dimensions(name: str) -> int | None:
    """The dimensions `name` is registered with, or None when it is not registered. The
    configured local model, when it is the bundled one, registers itself here on first use: its
    dimensions are known without loading it (a model from AGENTMEMORY_LOCAL_MODEL_PATH may have
    others, so the worker registers it from its first answer, like a remote one)."""
    if name in _registered:
        return _registered[name]
    dims = EmbeddingModel.objects.filter(name=name).values_list("dimensions", flat=True).first()
    if dims is None and not settings.AGENTMEMORY_LOCAL_MODEL_PATH:
        provider = get_provider()
        if provider is not None and provider.model == name and provider.kind == "local":
            dims = register_provider_model(name, LOCAL_DIMENSIONS)
    if dims is not None:
        _registered[name] = dims
    return dims


def registered_models() -> list[EmbeddingModel]:
    return list(EmbeddingModel.objects.order_by("name"))


def registered_names() -> list[str]:
    return list(EmbeddingModel.objects.order_by("name").values_list("name", flat=True))


def unregistered(name: str, *, where: str = "") -> UnregisteredModel:
    """The 422 for a vector under `name`: it names the registered models and who adds one."""
    names = registered_names()
    listed = ", ".join(repr(n) for n in names) if names else "none yet"
    prefix = f"{where}: " if where else ""
    return UnregisteredModel(
        f"{prefix}embedding model {name!r} is not registered; registered models: {listed}. "
        "An operator registers a model with its dimensions (`manage.py embedding_model add`, "
        "or POST /api/v1/embedding-models with an unconfined admin key)"
    )


def require_registered(name: str, *, where: str = "") -> int:
    """The registered dimensions of `name`, or `unregistered` raised."""
    dims = registered_dimensions(name)
    if dims is None:
        raise unregistered(name, where=where)
    return dims


def store_registration(
    name: str, dimensions: int, *, actor: Actor, note: str = ""
) -> tuple[EmbeddingModel, bool]:
    """The registration of `name` (and whether this call made it, audited): an earlier one is
    answered as it stands, whatever its dimensions. get_or_create also takes a concurrent
    registration of the same name (it reads it back)."""
    with transaction.atomic():
        row, created = EmbeddingModel.objects.get_or_create(
            name=name, defaults={"dimensions": dimensions, "created_by": actor.label}
        )
        if created:
            audit_record(
                actor=actor,
                action="register",
                target_type="embedding_model",
                target_ids=[row.pk],
                after={"name": name, "dimensions": dimensions},
                note=note,
            )
    return row, created


def register_provider_model(name: str, dimensions: int) -> int:
    """Register the configured provider's model (the operator chose it in the settings) with the
    dimensions its vectors have; returns the registered dimensions, which an earlier registration
    keeps (the worker then refuses vectors of another length)."""
    row, _ = store_registration(
        name, dimensions, actor=PROVIDER_ACTOR, note="the configured embedding provider's model"
    )
    _registered[name] = row.dimensions
    return row.dimensions
