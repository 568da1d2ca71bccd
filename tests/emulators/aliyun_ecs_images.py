"""ECS's images (2014-05-26): CreateImage as a snapshot of the machine, DescribeImages, DeleteImage.

Why apart: an image has its own life (Creating until the backend's copy is done, then Available or
CreateFailed) and its own backend calls (hosts.snapshot / hosts.delete_image); it only reads the
instances. DescribeImages lists only Available images unless Status is given (the stricter reading).
"""

from __future__ import annotations

from typing import Any

from .aliyun_ecs_machines import EcsMachines, Image, Instance, new_id, tag_list
from .aliyun_rpc import ApiError, page, required


class EcsImages(EcsMachines):
    """CreateImage / DescribeImages / DeleteImage, and images() for tests."""

    def images(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"id": m.id, "name": m.name, "status": m.status, "owner": m.owner, "tags": dict(m.tags),
                     "source_instance": m.source_instance} for m in self._images.values()]


    def _create_image(self, params: dict[str, str]) -> dict[str, Any]:
        inst = self._instance(required(params, "InstanceId"))
        if inst.status not in ("Running", "Stopped"):
            raise self._incorrect_status(inst, "Running or Stopped")
        name = params.get("ImageName", "")
        if name and any(m.name == name and m.owner == "self" for m in self._images.values()):
            raise ApiError(400, "InvalidImageName.Duplicated", f"The specified ImageName {name} already exists.")
        image = Image(new_id("m-bp"), name, "Creating", "self", self._tags(params), inst.id)
        image.name = image.name or image.id
        self._images[image.id] = image
        self._spawn(self._snapshot, inst, image)
        return {"ImageId": image.id}

    def _snapshot(self, inst: Instance, image: Image) -> None:
        with inst.host_lock:
            try:
                if not inst.on_host:
                    raise RuntimeError("the instance has no machine (deleted or never booted)")
                self.hosts.snapshot(inst.id, image.id)
                status = "Available"
            except Exception as exc:  # reported as the image's CreateFailed status
                self._host_failed(image.id, "snapshot", exc)
                status = "CreateFailed"
        with self._lock:
            image.status = status

    def _describe_images(self, params: dict[str, str]) -> dict[str, Any]:
        ids = [i for i in params.get("ImageId", "").split(",") if i]
        statuses = (params.get("Status") or "Available").split(",")
        owner = params.get("ImageOwnerAlias", "")
        found = [m for m in self._images.values()
                 if (not ids or m.id in ids) and m.status in statuses and owner in ("", m.owner)
                 and params.get("ImageName", m.name) == m.name and self._tags_match(m.tags, params)]
        items, paging = page(found, params)
        return {"RegionId": self.region, **paging, "Images": {"Image": [
            {"ImageId": m.id, "ImageName": m.name, "Status": m.status, "ImageOwnerAlias": m.owner,
             "Progress": "100%" if m.status == "Available" else "0%", "CreationTime": m.created,
             "OSType": "linux", "Architecture": "x86_64", "Size": 20, "Tags": tag_list(m.tags)}
            for m in items]}}

    def _delete_image(self, params: dict[str, str]) -> dict[str, Any]:
        image_id = required(params, "ImageId")
        image = self._images.get(image_id)
        if image is None:
            raise ApiError(404, "InvalidImageId.NotFound", f"The specified ImageId {image_id} does not exist.")
        if image.owner != "self":
            raise ApiError(403, "OperationDenied", "Public images cannot be deleted.")
        if image.status == "Creating":
            raise ApiError(403, "IncorrectImageStatus", "The image is still being created.")
        del self._images[image_id]
        if image.status == "Available":
            self._spawn(self._drop_image, image_id)
        return {}

    def _drop_image(self, image_id: str) -> None:
        try:
            self.hosts.delete_image(image_id)
        except Exception as exc:  # reported; the API already forgot the image
            self._host_failed(image_id, "delete_image", exc)
