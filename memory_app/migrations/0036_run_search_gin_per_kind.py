"""The full-text vectors of what runs wrote get one GIN index per kind (step output, error,
tool call) in place of one for all three.

Search everything reads each kind's first matches apart (`memory_app.queries.search_all`):
with one index, each of the three reads built a bitmap of every kind's matches of the word and
threw the other kinds' away row by row (a word in 25,000 tool calls cost the step-output and
error reads that bitmap too). Each index is built in one pass; writes to the table wait while
it is built.
"""

import django.contrib.postgres.indexes
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('memory_app', '0035_run_search_table'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='runsearch',
            name='run_search_gin',
        ),
        migrations.AddIndex(
            model_name='runsearch',
            index=django.contrib.postgres.indexes.GinIndex(condition=models.Q(('kind', 'output')), fields=['search_vector'], name='run_search_output_gin'),
        ),
        migrations.AddIndex(
            model_name='runsearch',
            index=django.contrib.postgres.indexes.GinIndex(condition=models.Q(('kind', 'error')), fields=['search_vector'], name='run_search_error_gin'),
        ),
        migrations.AddIndex(
            model_name='runsearch',
            index=django.contrib.postgres.indexes.GinIndex(condition=models.Q(('kind', 'tool')), fields=['search_vector'], name='run_search_tool_gin'),
        ),
    ]
