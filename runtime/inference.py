"""What every transport does with a parsed request: run it through the model's batcher, and the
repository's load parameters. Shared by the HTTP routes (routes.py) and the gRPC service
(grpc_service.py), so both answer the same request with the same result or the same error.

Errors are ProtocolErrors with an HTTP status; gRPC maps the status to its own codes
(grpc_service.STATUS_CODES): 400 INVALID_ARGUMENT, 404 NOT_FOUND, 413 RESOURCE_EXHAUSTED,
503 UNAVAILABLE, 500 INTERNAL.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .batching import BadRequest, EngineFailure, ShuttingDown
from .errors import RuntimeUserError
from .protocol import InferRequest, ProtocolError, peer_text
from .served import ServedModel


def run(model: ServedModel, req: InferRequest) -> dict[str, np.ndarray]:
    """The outputs of one request (possibly merged with others by the model's batcher)."""
    if model.batched and req.batch > model.max_batch:
        raise ProtocolError(f"batch {req.batch} (dimension 0) exceeds the server's max batch "
                            f"{model.max_batch}; send at most {model.max_batch} per request")
    if model.batched and req.batch == 0:
        raise ProtocolError("batch size 0: dimension 0 of the inputs must be at least 1")
    batcher = model.batcher
    if batcher is None:
        raise ProtocolError(f"model '{model.name}' is not loaded", 503)
    try:
        results = batcher.submit(req.inputs, req.batch)
    except EngineFailure as exc:
        status = 503 if isinstance(exc, ShuttingDown) else 400 if isinstance(exc, BadRequest) else 500
        raise ProtocolError(str(exc), status) from None
    missing = [n for n, _ in req.outputs if n not in results]
    if missing:
        raise ProtocolError(f"engine '{model.name}' returned no output {', '.join(missing)}", 500)
    return results


def load_override(params: dict[str, Any], name: str):
    """A load request's parameters: an optional `config` (a JSON string of model config, as
    tritonclient's load_model(config=...) sends) used instead of the one on disk."""
    from .repository import parse_config, parse_json

    override = None
    for key, value in params.items():
        if key == "config":
            if not isinstance(value, str):
                raise ProtocolError("the load parameter 'config' must be a JSON string of the model config")
            where = "the load request's config"
            try:
                override = parse_config(parse_json(value, where), where, expected_name=name)
            except RuntimeUserError as exc:
                raise ProtocolError(str(exc)) from None
        elif str(key).startswith("file:"):
            raise ProtocolError("file overrides (parameters 'file:...') are not supported; put the model files in "
                                f"the repository under {name}/<version>/")
        else:
            raise ProtocolError(f"unknown load parameter '{peer_text(str(key), 40)}'; known: config")
    return override
