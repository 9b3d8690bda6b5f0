"""``kvsim policies`` and ``kvsim models``: what can be named on the command line."""

from __future__ import annotations

import click

from kvsim.policies.registry import describe_policies
from kvsim.specs.models import MODELS


@click.command("policies")
def policies_command() -> None:
    """List every eviction and admission policy with a one-line description."""
    rows = describe_policies()
    width = max(len(name) for _, name, _ in rows)
    for kind in ("eviction", "admission"):
        click.echo(f"{kind} policies:")
        for k, name, text in rows:
            if k == kind:
                click.echo(f"  {name:<{width}}  {text}")
    click.echo("A user's own policy: --policy package.module:ClassName")


@click.command("models")
def models_command() -> None:
    """List the model presets and their KV bytes per token (bf16, TP=1)."""
    for name, spec in MODELS.items():
        kind = "MLA" if spec.is_mla else f"{spec.num_kv_heads} KV heads x {spec.head_dim}"
        click.echo(
            f"  {name:<16} {spec.num_layers:>3} layers, {kind:<22} "
            f"{spec.kv_bytes_per_token():>8,} B/token"
        )


COMMANDS = [policies_command, models_command]
