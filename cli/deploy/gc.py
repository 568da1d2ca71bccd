"""What `ngcx deployments gc` finds and deletes: hosts, containers, scaling groups and balancers with this
store's tags that no record owns (an interrupted deploy, a kill -9).

Why in the library, not in the command: the dashboard's overview counts the same orphans (issue 23) and must
find exactly what gc would delete. A cloud without credentials here has none of ours: it is skipped.
"""

from __future__ import annotations

import time
from typing import Any

from ..core.errors import UserError
from . import TARGETS, store, target
from .common import FAILED


def close_interrupted() -> None:
    """Interrupted deployments' ngcx is gone: mark them failed, so whatever they made counts as an orphan."""
    for record in store.interrupted():
        store.update(record.id, status=FAILED, pid=None,
                     detail=f"interrupted while {record.status}; found by gc at {time.ctime()}")


def find(clouds: tuple[str, ...] = TARGETS) -> list[dict[str, Any]]:
    """Every orphan on `clouds`, each a dict with its cloud, id, status and type or name."""
    found: list[dict[str, Any]] = []
    for cloud in clouds:
        found += [dict(item, cloud=cloud) for item in _skip_without_credentials(cloud, target(cloud).orphans)]
        found += [dict(item, cloud=cloud) for item in _skip_without_credentials(cloud, lambda c=cloud: _groups(c))]
    return found


def delete(item: dict[str, Any]) -> None:
    """Delete one orphan that find() returned, by its kind."""
    from .service import delete_orphan_balancer
    from .service_group import delete_orphan_group

    if item.get("status") == "balancer":
        delete_orphan_balancer(item["cloud"], item)
    elif item.get("status") == "scaling group":
        delete_orphan_group(item["cloud"], item)
    else:
        target(item["cloud"]).delete_orphan(item)


def _groups(cloud: str) -> list[dict[str, str]]:
    """Scaling groups, then balancers (a group goes first: it holds its balancer's target group)."""
    from .service import orphan_balancers
    from .service_group import orphan_groups

    return orphan_groups(cloud) + orphan_balancers(cloud)


def _skip_without_credentials(cloud: str, finder: Any) -> list[dict[str, str]]:
    try:
        return finder()
    except UserError as exc:
        if cloud != "local" and "credentials" in exc.message:
            return []
        raise
