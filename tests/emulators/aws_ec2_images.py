"""EC2 images (AMIs) made from the machines: CreateImage, DeregisterImage, DescribeImages (Ec2Emulator's).

Why apart from the instance harness (aws_ec2_machines.py): an image is its own resource with its own
life (`pending` until the backend's copy of the machine is done, then `available` or `failed`) and its
own backend calls (hosts.snapshot / hosts.delete_image); it only reads the instances. What it adds to moto:

- CreateImage -> hosts.snapshot (image id = moto's new AMI id; DescribeImages says `pending` until the copy
  is done); DeregisterImage -> hosts.delete_image.
- Image names unique per account and region (moto's are not): 400 InvalidAMIName.Duplicate.
- TagSpecifications for `snapshot` (moto raises NotImplementedError on them): applied by the harness.
- CreateImage never reboots the instance (a running machine is paused for a crash-consistent copy, as with
  NoReboot=true).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlencode

from .aws_ec2_machines import Ec2Machines, Instance
from .aws_wire import AwsError, WireRequest, WireResponse, child, child_text, items, parse_xml, path, xml_bytes


@dataclass
class Image:
    id: str
    source_instance: str
    state: str = "pending"
    done: threading.Event = field(default_factory=threading.Event, repr=False)


class Ec2Images(Ec2Machines):
    """CreateImage / DeregisterImage / DescribeImages over moto, each image a snapshot on the HostBackend."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._images: dict[str, Image] = {}

    def images(self) -> list[dict[str, str]]:
        """Images made by CreateImage through the emulator: id, state, source instance."""
        with self._lock:
            return [{"id": m.id, "state": m.state, "source_instance": m.source_instance}
                    for m in self._images.values()]

    def _create_image(self, request: WireRequest) -> WireResponse:
        name = request.params.get("Name", "")
        taken = parse_xml(self._need_upstream().ec2(request.region, "DescribeImages", {
            "Owner.1": "self", "Filter.1.Name": "name", "Filter.1.Value.1": name}).body)
        for item in items(taken, "imagesSet"):   # EC2 keeps image names unique per account and region; moto does not
            raise AwsError(400, "InvalidAMIName.Duplicate",
                           f"AMI name {name} is already in use by AMI {child_text(item, 'imageId')}")
        forwarded, snapshot_tags = _without_snapshot_tags(request)
        answer = self._forward(forwarded)
        root = parse_xml(answer.body) if answer.ok else None
        image_id = child_text(root, "imageId") if root is not None else ""
        if not image_id:
            return answer
        if snapshot_tags:
            self._tag_snapshots(request.region, image_id, snapshot_tags)
        source = request.params.get("InstanceId", "")
        with self._lock:
            inst = self._instances.get(source)
            image = Image(image_id, source)
            self._images[image_id] = image
        self._spawn(self._snapshot, inst, image)
        return answer

    def _tag_snapshots(self, region: str, image_id: str, tags: list[tuple[str, str]]) -> None:
        """What moto cannot do in CreateImage (TagSpecifications for `snapshot`): tag the image's snapshots."""
        upstream = self._need_upstream()
        root = parse_xml(upstream.ec2(region, "DescribeImages", {"ImageId.1": image_id}).body)
        snapshots = [child_text(path(m, "ebs"), "snapshotId") for i in items(root, "imagesSet")
                     for m in items(i, "blockDeviceMapping") if path(m, "ebs") is not None]
        params = {f"ResourceId.{n}": s for n, s in enumerate((s for s in snapshots if s), start=1)}
        if params:
            for n, (key, value) in enumerate(tags, start=1):
                params[f"Tag.{n}.Key"], params[f"Tag.{n}.Value"] = key, value
            upstream.ec2(region, "CreateTags", params)

    def _snapshot(self, inst: Instance | None, image: Image) -> None:
        try:
            if inst is None:
                raise RuntimeError("the instance was not launched through this emulator")
            with inst.host_lock:    # after a stop in flight: the machine is off (or paused by the backend)
                if not inst.on_host:
                    raise RuntimeError("the instance has no machine (terminated or never booted)")
                self.hosts.snapshot(inst.id, image.id)
            state = "available"
        except Exception as exc:  # reported as the image's `failed` state
            self._host_failed(image.id, "snapshot", exc)
            state = "failed"
        with self._lock:
            image.state = state
        image.done.set()

    def _deregister_image(self, request: WireRequest) -> WireResponse:
        answer = self._forward(request)
        if answer.ok:
            with self._lock:
                image = self._images.pop(request.params.get("ImageId", ""), None)
            if image is not None:
                self._spawn(self._drop_image, image)
        return answer

    def _drop_image(self, image: Image) -> None:
        while not image.done.wait(0.1):
            if self._closing.is_set():
                return
        if image.state == "available":
            try:
                self.hosts.delete_image(image.id)
            except Exception as exc:  # reported; the API already forgot the image
                self._host_failed(image.id, "delete_image", exc)

    def _describe_images(self, request: WireRequest) -> WireResponse:
        answer = self._forward(request)
        root = parse_xml(answer.body) if answer.ok else None
        if root is None:
            return answer
        changed = False
        for item in items(root, "imagesSet"):
            with self._lock:
                image = self._images.get(child_text(item, "imageId"))
                state = image.state if image is not None else ""
            element = child(item, "imageState")
            if state and element is not None and element.text != state:
                element.text, changed = state, True
        return answer.with_body(xml_bytes(root)) if changed else answer


def _without_snapshot_tags(request: WireRequest) -> tuple[WireRequest, list[tuple[str, str]]]:
    """CreateImage's TagSpecification.N for ResourceType=snapshot (moto raises NotImplementedError on them),
    taken out of the request moto gets; the harness applies them itself."""
    params = request.params
    numbers = {key.split(".")[1] for key, value in params.items()
               if key.startswith("TagSpecification.") and key.endswith(".ResourceType") and value == "snapshot"}
    if not numbers:
        return request, []
    prefixes = tuple(f"TagSpecification.{n}." for n in numbers)
    tags = [(params[key], params.get(key[:-len("Key")] + "Value", "")) for key in sorted(params)
            if key.startswith(prefixes) and key.endswith(".Key")]
    kept = {key: value for key, value in params.items() if not key.startswith(prefixes)}
    return replace(request, body=urlencode(kept).encode(), params=kept), tags
