"""A service's cost per hour, spot against on demand, from the offers tables (cli/deploy/offers.py), and the
flags that buy it (service_group.Scaling): what `ngcx deployments show sN` prints for an autoscaled service.

What a user notices (issue 49): a 3-host service with a 1-host on-demand floor costs the floor at the on-demand
price and the rest at the table's spot price, on both clouds' tables; all on demand is the dearer figure; an
--on-demand-base without --spot, or above --max, is one line before anything is made.
"""

from __future__ import annotations

import pytest

from ngcx.core.errors import UserError
from ngcx.deploy.offers import load_table, planned_markets, service_cost
from ngcx.deploy.service_group import Scaling


@pytest.mark.parametrize(("cloud", "itype"), [("aws", "g5.xlarge"), ("aliyun", "ecs.gn7i-c8g1.2xlarge")])
def test_a_spot_service_with_an_on_demand_floor_costs_the_floor_on_demand_and_the_rest_spot(cloud, itype) -> None:
    [row] = [t for t in load_table(cloud)[0] if t.name == itype]
    cost = service_cost(cloud, itype, planned_markets(3, True, 1))
    assert cost is not None and (cost.hosts, cost.spot_hosts) == (3, 2)
    assert cost.per_hour == pytest.approx(row.price_per_hour + 2 * row.spot_price_per_hour)
    assert cost.on_demand_per_hour == pytest.approx(3 * row.price_per_hour)
    assert 0.2 < cost.saving < 0.9
    line = cost.text()
    assert "2 spot, 1 on demand" in line and "saved" in line and "est." in line
    all_on_demand = service_cost(cloud, itype, planned_markets(3, False, 0))
    assert all_on_demand.per_hour == pytest.approx(cost.on_demand_per_hour) and "saved" not in all_on_demand.text()


def test_markets_follow_the_floor() -> None:
    assert planned_markets(3, True, 1) == ["on-demand", "spot", "spot"]
    assert planned_markets(1, True, 2) == ["on-demand"]
    assert planned_markets(2, False, 0) == ["on-demand", "on-demand"]
    assert service_cost("aws", "no.such-type", ["spot"]) is None


def test_an_on_demand_floor_without_spot_or_above_the_max_is_one_line() -> None:
    with pytest.raises(UserError, match="without --spot"):
        Scaling(1, 3, spot=False, on_demand_base=1).check()
    with pytest.raises(UserError, match="--on-demand-base 4"):
        Scaling(1, 3, spot=True, on_demand_base=4).check()
    Scaling(1, 3, spot=True, on_demand_base=1).check()
