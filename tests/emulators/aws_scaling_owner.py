"""What Auto Scaling's two helpers share with it: its answer shape, a scale-in's victims, the AutoScaling they serve.

Why a module of its own: aws_autoscaling.py builds its WarmPools (aws_warm_pool.py), AlarmActions
(aws_alarms.py) and Refreshes (aws_refresh.py), so it imports them; they need its answer builder, its Victim
records and a typed handle on the AutoScaling that owns them (ScalingOwner: the members they use), and take
them from here instead of importing aws_autoscaling.py back (no two modules import each other).
"""

from __future__ import annotations

import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .aws_wire import WireResponse, new_request_id, xml_bytes

if TYPE_CHECKING:
    from .aws_ec2 import Ec2Emulator

NS = "http://autoscaling.amazonaws.com/doc/2011-01-01/"


@dataclass
class Victim:
    """An instance taken out of its group by a scale-in: draining and waiting for its lifecycle hook."""

    instance_id: str
    group: str
    region: str
    zone: str
    version: str
    hook: str                      # the terminating hook's name ("" when the group has none)
    drained_at: float              # time.monotonic() when its deregistration delay is over
    hook_deadline: float           # HeartbeatTimeout x time_scale from now (restarted by a heartbeat)
    heartbeat_s: float
    token: str = field(default_factory=new_request_id)
    completed: threading.Event = field(default_factory=threading.Event, repr=False)


def scaling_answer(action: str, build: Callable[[ET.Element], Any] | None = None) -> WireResponse:
    """An Auto Scaling success answer: <ActionResponse><ActionResult>...</ActionResult><ResponseMetadata/>."""
    root = ET.Element(f"{{{NS}}}{action}Response")
    result = ET.SubElement(root, f"{{{NS}}}{action}Result")
    if build is not None:
        build(result)
    ET.SubElement(ET.SubElement(root, f"{{{NS}}}ResponseMetadata"), f"{{{NS}}}RequestId").text = new_request_id()
    return WireResponse(200, (("Content-Type", "text/xml"),), xml_bytes(root))


class ScalingOwner(Protocol):
    """The members of aws_autoscaling.AutoScaling that its warm pools and alarm actions use."""

    ec2: Ec2Emulator
    time_scale: float
    errors: list[str]
    _lock: threading.RLock
    _scale_lock: threading.Lock
    _closing: threading.Event
    _versions: dict[str, str]
    _victims: dict[str, Victim]

    def victims(self) -> list[Victim]: ...
    def _moto(self, region: str, action: str, params: dict[str, str]) -> ET.Element | None: ...
    def _group(self, region: str, name: str) -> ET.Element | None: ...
    def _groups(self, region: str) -> list[ET.Element]: ...
    def _template_version(self, region: str, template: ET.Element | None) -> tuple[str, bytes, dict[str, str]]: ...
    def _set(self, region: str, name: str, before: int, after: int, metric: float) -> None: ...
    def _sync(self, region: str, name: str) -> None: ...
    def retire(self, region: str, group: ET.Element, ids: list[str], decrement: bool = True,
               deadline: float | None = None) -> None: ...
