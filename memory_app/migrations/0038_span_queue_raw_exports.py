"""Queued OTLP trace exports are kept as received: protobuf bytes, decoded by the mapper.

The receiver used to decode every span into dicts and queue them as JSON text; it now reads only
what placing and idempotency need (ids, context keys) and queues the protobuf of each context's
spans in `body`. Log exports still queue their decoded records in `payload` (a record's id is a
digest of its content). `body` is stored out of line without compression: the rows live until the
worker maps them, and compressing them cost the acknowledgement more than their space is worth.

Frozen: the SQL is written out here.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('memory_app', '0037_vectors_wait_in_side_tables'),
    ]

    operations = [
        migrations.AddField(
            model_name='spanqueue',
            name='body',
            field=models.BinaryField(null=True),
        ),
        migrations.AlterField(
            model_name='spanqueue',
            name='payload',
            field=models.TextField(blank=True, default=''),
        ),
        migrations.RunSQL(
            "ALTER TABLE memory_app_spanqueue ALTER COLUMN body SET STORAGE EXTERNAL;",
            "ALTER TABLE memory_app_spanqueue ALTER COLUMN body SET STORAGE EXTENDED;",
        ),
    ]
