"""The checker every Alibaba Cloud request passes (cli/clouds/aliyun_models.py) and the endpoints it names.

What a user notices: a request the real API refuses never leaves ngcx (one line naming the parameter and the
action), and ESS calls go to the host Alibaba's own SDK endpoint data name (ess.aliyuncs.com for the main regions,
a regional host elsewhere) instead of `ess.<region>.aliyuncs.com` for every region (issue 47 item 5).
"""

from __future__ import annotations

import pytest

from ngcx.clouds import aliyun_models
from ngcx.clouds.aliyun import ESS_VERSION, AliyunError, checked


@pytest.mark.parametrize(("region", "host"), [
    ("cn-hangzhou", "ess.aliyuncs.com"), ("cn-shanghai", "ess.aliyuncs.com"), ("ap-southeast-1", "ess.aliyuncs.com"),
    ("eu-central-1", "ess.eu-central-1.aliyuncs.com"), ("cn-chengdu", "ess.cn-chengdu.aliyuncs.com"),
])
def test_ess_endpoints_follow_the_sdks_endpoint_data(region: str, host: str) -> None:
    assert aliyun_models.endpoint("ess", ESS_VERSION, region) == host


def test_a_region_the_data_do_not_name_gets_the_regional_host() -> None:
    assert aliyun_models.endpoint("alb", "2020-06-16", "xx-new-1") == "alb.xx-new-1.aliyuncs.com"


@pytest.mark.parametrize(("params", "ok"), [
    ({"ScalingGroupId": "g", "ServerGroups.1.ServerGroupId": "sgp", "ServerGroups.1.Port": "8000",
      "ServerGroups.1.Type": "ALB", "ServerGroups.1.Weight": "100"}, True),
    ({"ScalingGroupId": "g", "ServerGroup.1.ServerGroupId": "sgp"}, False),     # 2014-08-28's spelling
    ({"ScalingGroupId": "g", "ServerGroups.0.Port": "8000"}, False),             # lists count from 1
    ({"ScalingGroupId": "g", "ServerGroups.1.Bogus": "x"}, False),              # no such member
    ({"ScalingGroupId": "g", "ServerGroups": "sgp"}, False),                     # a list is not one value
])
def test_flattened_names_are_matched_against_the_models_shapes(params: dict[str, str], ok: bool) -> None:
    problem = aliyun_models.check("ess", ESS_VERSION, "AttachServerGroups", params)
    assert (problem is None) == ok, problem


def test_a_misspelled_parameter_is_refused_before_it_leaves_in_one_line() -> None:
    with pytest.raises(AliyunError) as refused:
        checked("ess", ESS_VERSION, "CreateScalingRule", {"ScalingGroupId": "g", "ClientToken": "t"})
    assert refused.value.code == "InvalidParameter" and '"ClientToken"' in refused.value.line()
    assert "\n" not in refused.value.line()


def test_the_common_parameters_and_dotted_names_of_older_models_pass() -> None:
    assert aliyun_models.check("ecs", "2014-05-26", "RunInstances", {
        "ImageId": "img", "InstanceType": "ecs.gn7i-c8g1.2xlarge", "SystemDisk.Category": "cloud_essd",
        "Tag.1.Key": "k", "Tag.1.Value": "v", "SignatureNonce": "n", "RegionId": "cn-hangzhou"}) is None
    assert aliyun_models.check("ram", "2015-05-01", "GetPolicy", {"PolicyName": "p", "PolicyType": "Custom"}) is None


def test_the_check_can_be_switched_off_when_the_models_lag_the_api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NGCX_ALIYUN_MODEL_CHECK", "off")
    checked("ess", ESS_VERSION, "CreateScalingRule", {"ScalingGroupId": "g", "ClientToken": "t"})
