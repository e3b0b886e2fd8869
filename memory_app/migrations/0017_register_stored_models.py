"""Register every model name the store already holds vectors under, with their dimensions.

From 0016 on, a vector is accepted (and searched) only under a registered model. Without this
step the vectors of an existing store would become unsearchable the moment it upgrades. A name
whose stored vectors have more than one length (possible before the registry: the first vector
fixed it only per process) is registered with the length most of its vectors have; the others
stay stored but are never searched, as before. Names with only pending rows (no vector yet) are
left to the worker, which registers its provider's model when it first embeds.

Frozen: reads the historical models only.
"""

from django.db import migrations
from django.db.models import Count


def register_stored(apps, schema_editor):
    Embedding = apps.get_model("memory_app", "Embedding")
    EmbeddingModel = apps.get_model("memory_app", "EmbeddingModel")
    db = schema_editor.connection.alias
    counts = (
        Embedding.objects.using(db)
        .filter(vector__isnull=False, dimensions__gte=1, dimensions__lte=16000)
        .values("model", "dimensions")
        .annotate(n=Count("id"))
        .order_by("model", "-n", "dimensions")
    )
    chosen = {}
    for row in counts:
        chosen.setdefault(row["model"], row["dimensions"])
    for name, dims in chosen.items():
        EmbeddingModel.objects.using(db).get_or_create(
            name=name, defaults={"dimensions": dims, "created_by": "migration:0017"}
        )


class Migration(migrations.Migration):

    dependencies = [
        ("memory_app", "0016_embedding_model_registry"),
    ]

    operations = [
        migrations.RunPython(register_stored, migrations.RunPython.noop, elidable=False),
    ]
