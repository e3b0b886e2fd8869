# The retention's sweep reads namespace items past their time to live soonest first: a partial
# index of the few items that have one, built without blocking writes to the memories.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("memory_app", "0038_span_queue_raw_exports"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="memoryrecord",
            index=models.Index(
                condition=models.Q(("item_expires_at__isnull", False)),
                fields=["item_expires_at", "id"],
                name="memory_item_expires_idx",
            ),
        ),
    ]
