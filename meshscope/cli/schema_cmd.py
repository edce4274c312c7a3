"""``meshscope schema summary``: the JSON Schema of summary.json, generated from the report's
typed record (``analysis/report/summary_schema.py``; docs/summary.schema.json is the same)."""
from __future__ import annotations

import click


@click.command()
@click.argument("document", type=click.Choice(["summary"]))
def schema(document):
    """Print the JSON Schema of a document meshscope writes (summary: a report's
    summary.json)."""
    from meshscope.analysis.report import summary_schema

    click.echo(summary_schema.text(), nl=False)


COMMANDS = (schema,)
