"""A fleet's balance: per instance, its share of the load (prompt tokens routed) and its
share of the fleet's hits, side by side, from a fleet run's ``instances`` table.

Equal bars mean the router spread the work and the reuse alike; a tall hit share beside
a short load share is an instance the router sends the reused prefixes to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from kvsim.core.errors import InputError
from kvsim.plots.capacity import need_columns
from kvsim.plots.style import finish, panels, styled

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: the columns drawn, and their labels
SHARES = {"load_share": "load (prompt tokens)", "hit_share": "hits (all tiers)"}


def fleet_balance(
    instances: pd.DataFrame | Any, *, preset: str | None = None, ax: Axes | None = None
) -> Figure:
    """Bars of ``load_share`` and ``hit_share`` per instance (``instances``: the table, or
    a fleet :class:`kvsim.Result`), with the even share 1/N as a dashed line."""
    tables = getattr(instances, "tables", None)
    if isinstance(tables, dict) and "instances" not in tables:
        raise InputError("fleet-balance: takes a fleet's result (instances=N), got one engine's")
    table = tables["instances"] if isinstance(tables, dict) else instances
    need_columns(table, [], "fleet-balance")
    missing = [c for c in ("instance", *SHARES) if c not in table]
    if missing:
        raise InputError(f"fleet-balance: the instances table lacks {', '.join(missing)}")
    with styled(preset) as p:
        (a,) = panels(ax, p, 1)
        x = np.arange(len(table))
        width = 0.4
        for k, (column, label) in enumerate(SHARES.items()):
            a.bar(x + (k - 0.5) * width, table[column], width, label=label)
        a.axhline(1 / max(1, len(table)), linestyle="--", color="0.4", label="even share")
        a.set_xticks(x, [str(i) for i in table["instance"]])
        a.set_xlabel("instance")
        a.set_ylabel("share of the fleet")
        # above the axes, in one row: inside, it covered the tallest bars
        a.legend(
            fontsize=p.small_pt,
            loc="lower center",
            bbox_to_anchor=(0.5, 1.0),
            ncol=3,
            frameon=False,
        )
        return finish([a], p)
