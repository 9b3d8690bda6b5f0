"""``kvsim policies`` and ``kvsim models``: what can be named on the command line."""

from __future__ import annotations

import click

from kvsim.policies.registry import VLLM_EXPORT_MODULE, VLLM_EXPORTS, describe_policies
from kvsim.specs.models import MODELS

#: admission rules vLLM 0.33 runs itself (its manager's store_threshold); the others have no
#: hook there: its OffloadingConnector loads a CachePolicy (eviction) and nothing else
VLLM_ADMISSION = {"always": "vLLM's default", "threshold": "vLLM's store_threshold=N"}


def deployment(kind: str, name: str) -> str:
    """Where a registered policy runs: in vLLM unchanged (how to name it there) or in kvsim
    only (and why)."""
    if kind == "eviction":
        exported = {v: k for k, v in VLLM_EXPORTS.items()}
        if name in exported:
            return f"vLLM: eviction_policy={exported[name]}"
        return "kvsim only: needs the trace's future, which a live server lacks"
    if name in VLLM_ADMISSION:
        return f"vLLM: {VLLM_ADMISSION[name]}"
    return "kvsim only: vLLM 0.33 has no admission hook but store_threshold"


@click.command("policies")
def policies_command() -> None:
    """List every eviction and admission policy with a one-line description.

    Each says where it runs: in vLLM 0.33 unchanged (eviction policies through
    ``cache_policy_module_path`` ``kvsim.integrations.vllm``) or in kvsim only, and why."""
    rows = describe_policies()
    width = max(len(name) for _, name, _ in rows)
    for kind in ("eviction", "admission"):
        click.echo(f"{kind} policies:")
        for k, name, text in rows:
            if k == kind:
                click.echo(f"  {name:<{width}}  {text}")
                click.echo(f"  {'':<{width}}    [{deployment(kind, name)}]")
    click.echo(
        "A user's own policy: --policy package.module:ClassName (into vLLM through "
        f"cache_policy_module_path={VLLM_EXPORT_MODULE}: docs/policies.md)"
    )


@click.command("models")
def models_command() -> None:
    """List the model presets: KV bytes a token, parameters, weights as stored.

    KV bytes per token in the model's dtype at TP 1; parameters active per token for MoE;
    the weights as vLLM stores them decide the TP a GPU needs (the weights over TP must
    leave room for KV)."""
    for name, spec in MODELS.items():
        kind = "MLA" if spec.is_mla else f"{spec.num_kv_heads} KV heads x {spec.head_dim}"
        params = f"{spec.num_params / 1e9:.1f}B"
        if spec.active_params < spec.num_params:
            params += f" ({spec.active_params / 1e9:.1f}B active)"
        stored = {"auto": f"{8 * spec.default_dtype_bytes}-bit", "mxfp4": "mxfp4 experts"}.get(
            spec.weight_dtype, spec.weight_dtype
        )
        click.echo(
            f"  {name:<16} {spec.num_layers:>3} layers, {kind:<22} "
            f"{spec.kv_bytes_per_token():>8,} B/token  {params:<22} "
            f"{spec.weight_bytes() / 1e9:>6.1f} GB {stored}"
        )


COMMANDS = [policies_command, models_command]
