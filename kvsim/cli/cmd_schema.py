"""``kvsim schema``: the JSON Schema of a user-facing structure, for editors and docs."""

from __future__ import annotations

import json

import click

from kvsim.options.registry import SCHEMAS, schema_named
from kvsim.options.schema import json_schema


@click.command("schema")
@click.argument("name", required=False)
def schema_command(name: str | None) -> None:
    """Print the JSON Schema of NAME (e.g. kv-transfer-config); without NAME, list them.

    \b
    Example:
      kvsim schema kv-connector-extra-config > extra-config.schema.json
    """
    if name is None:
        for known in SCHEMAS:
            click.echo(known)
        return
    click.echo(json.dumps(json_schema(schema_named(name)), indent=2))


COMMANDS = [schema_command]
