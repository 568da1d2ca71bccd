"""The KServe v2 gRPC service (Triton's GRPCInferenceService) next to the HTTP server: `--grpc-port`.

Why: tritonclient.grpc, perf_analyzer and most Triton deployments talk gRPC on 8001; a protobuf
message with raw tensor bytes needs no JSON header parsing and no HTTP framing. Same models,
same batchers, same shared-memory registries, same counters as HTTP: a request answers the same
over either transport (inference.py holds what both do).

What is served: ServerLive/Ready, ModelReady, ServerMetadata, ModelMetadata, ModelConfig,
ModelStatistics, ModelInfer, the repository extension (index, load, unload), system shared
memory (register, unregister, status) and CUDA shared memory (where a GPU is; cuda_shm.py).
ModelStreamInfer, TraceSetting and LogSettings answer UNIMPLEMENTED.

A gRPC request becomes the same parsed request as an HTTP one (protocol.parse_infer_request):
raw_input_contents play the part of the binary tensor extension (one input's bytes are used in
place, several are joined), typed `contents` the part of JSON `data`, and shared-memory
parameters are the same names. Errors keep their message and map to gRPC status codes:
400 INVALID_ARGUMENT (bad input), 404 NOT_FOUND (unknown model / version / region), 503
UNAVAILABLE (not ready, unloaded, draining), 413 RESOURCE_EXHAUSTED, 403 PERMISSION_DENIED
(shared memory from another host), 500 INTERNAL; a message over --max-body-mb is refused by gRPC
itself with RESOURCE_EXHAUSTED before it is read.

Who may call an RPC is asked of the server's access.Policy before its handler runs (_handler),
with the RPC's category (access.GRPC_CATEGORIES), its peer and its metadata (a bearer key in
`authorization`): the same check, and the same rules, as every HTTP route; a refusal is
UNAUTHENTICATED (no or a wrong key), PERMISSION_DENIED (model control off, not the admin key,
shared memory from another host) or INVALID_ARGUMENT. With --tls-cert / --tls-key the port
speaks TLS (grpc.ssl_server_credentials over the same PEM files as the HTTP ports).

The messages come from a vendored descriptor (grpc_proto.py says why); grpcio is imported only
when --grpc-port is given, so HTTP-only use needs no gRPC at all.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

from . import __version__, inference
from .access import GRPC_CONTROL, Call, Category, Policy, grpc_category
from .errors import RuntimeUserError
from .grpc_proto import SERVICE, message, methods
from .protocol import (
    BYTES,
    ProtocolError,
    output_bytes,
    parse_infer_request,
    peer_text,
    shm_output,
)
from .routes import SERVER_NAME, App, counted
from .served import NotFound

DEFAULT_WORKERS = 64          # RPCs handled at once (each inference waits in its batcher)
# typed `contents` field for each KServe datatype (FP16 / BF16 have none: they travel raw)
CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
            "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
            "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
            "FP64": "fp64_contents", "BYTES": "bytes_contents"}


def status_code(http_status: int) -> Any:
    """The gRPC code for a ProtocolError's HTTP status."""
    import grpc

    return {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
            403: grpc.StatusCode.PERMISSION_DENIED,
            404: grpc.StatusCode.NOT_FOUND, 405: grpc.StatusCode.UNIMPLEMENTED,
            413: grpc.StatusCode.RESOURCE_EXHAUSTED, 503: grpc.StatusCode.UNAVAILABLE,
            }.get(http_status, grpc.StatusCode.INTERNAL)


def peer_address(peer: str) -> str:
    """The IP address in grpc's peer string ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000"); "" for a unix socket."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return ""


def _param_value(param: Any) -> Any:
    """An InferParameter / ModelRepositoryParameter as a Python value (None when unset)."""
    which = param.WhichOneof("parameter_choice")
    return None if which is None else getattr(param, which)


def _params(mapping: Any) -> dict[str, Any]:
    return {key: _param_value(value) for key, value in mapping.items()}


def _set_param(mapping: Any, key: str, value: Any) -> None:
    if isinstance(value, bool):
        mapping[key].bool_param = value
    elif isinstance(value, int):
        mapping[key].int64_param = value
    elif isinstance(value, float):
        mapping[key].double_param = value
    else:
        mapping[key].string_param = str(value)


def request_doc(request: Any) -> tuple[dict[str, Any], memoryview | None]:
    """A ModelInferRequest as the KServe JSON document plus binary tail that protocol.py parses.

    Triton's rule: when raw_input_contents is used, it holds the bytes of every input that is not
    in shared memory, in the order of the inputs; otherwise each input carries typed `contents`.
    """
    raws = list(request.raw_input_contents)
    chunks: list[bytes] = []
    inputs = []
    for tensor in request.inputs:
        params = _params(tensor.parameters)
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape),
                                 "parameters": params}
        where = f"input '{peer_text(tensor.name, 60)}'"
        has_contents = tensor.HasField("contents")
        if params.get("shared_memory_region") is not None:
            if has_contents:
                raise ProtocolError(f"{where} names a shared memory region and also carries contents; give one")
        elif raws:
            if has_contents:
                raise ProtocolError(f"{where} carries typed contents, but the request uses raw_input_contents: "
                                    "send every input raw (or every input as contents)")
            if len(chunks) >= len(raws):
                raise ProtocolError(f"raw_input_contents has {len(raws)} entries, fewer than the inputs that "
                                    "are not in shared memory")
            params["binary_data_size"] = len(raws[len(chunks)])
            chunks.append(raws[len(chunks)])
        elif has_contents:
            field = CONTENTS.get(tensor.datatype)
            if field is None:
                raise ProtocolError(f"{where}: datatype {peer_text(tensor.datatype, 20)} has no typed "
                                    "contents field; send it in raw_input_contents")
            values = list(getattr(tensor.contents, field))
            if tensor.datatype == BYTES:             # length-prefixed, as the binary extension
                blob = b"".join(len(v).to_bytes(4, "little") + v for v in values)
                params["binary_data_size"] = len(blob)
                chunks.append(blob)
            else:
                entry["data"] = values
        inputs.append(entry)
    if raws and len(chunks) != len(raws):
        raise ProtocolError(f"raw_input_contents has {len(raws)} entries but {len(chunks)} inputs take raw data")
    outputs = [{"name": o.name, "parameters": _params(o.parameters)} for o in request.outputs]
    doc: dict[str, Any] = {"inputs": inputs, "parameters": _params(request.parameters)}
    if outputs:
        doc["outputs"] = outputs
    if request.id:
        doc["id"] = request.id
    if not chunks:
        return doc, None
    return doc, memoryview(chunks[0] if len(chunks) == 1 else b"".join(chunks))


class Service:
    """The RPC handlers over a server's routes.App (table, shm, cuda_shm, draining, ready); who may
    call them is asked of app.policy before each one (_handler)."""

    def __init__(self, app: App):
        self.app = app

    # -- health and metadata --
    def ServerLive(self, request: Any, context: Any) -> Any:  # noqa: N802 - the RPC's name
        return message("ServerLiveResponse")(live=True)

    def ServerReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        return message("ServerReadyResponse")(ready=bool(self.app.ready))

    def ModelReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        try:
            model = self.app.table.lookup(request.name, request.version or None)
        except ProtocolError as exc:
            if exc.status != 503:
                raise
            return message("ModelReadyResponse")(ready=False)
        return message("ModelReadyResponse")(ready=model.ready and not self.app.draining)

    def ServerMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        return message("ServerMetadataResponse")(name=SERVER_NAME, version=__version__,
                                                 extensions=self.app.extensions())

    def ModelMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        model = self.app.table.lookup(request.name, request.version or None)
        doc = model.metadata()
        versions = doc["versions"] if self.app.single is not None else self.app.table.versions_of(request.name)
        tensor = message("ModelMetadataResponse").TensorMetadata
        return message("ModelMetadataResponse")(
            name=doc["name"], versions=versions, platform=doc["platform"],
            inputs=[tensor(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in doc["inputs"]],
            outputs=[tensor(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in doc["outputs"]])

    def ModelConfig(self, request: Any, context: Any) -> Any:  # noqa: N802
        doc = self.app.table.lookup(request.name, request.version or None).config()
        config = message("ModelConfig")(name=doc["name"], platform=doc["platform"], backend=doc["backend"],
                                        max_batch_size=doc["max_batch_size"])
        for item, target in ((doc["input"], config.input), (doc["output"], config.output)):
            for t in item:
                target.add(name=t["name"], data_type=t["data_type"], dims=t["dims"])
        if "dynamic_batching" in doc:
            db = doc["dynamic_batching"]
            config.dynamic_batching.preferred_batch_size.extend(db["preferred_batch_size"])
            config.dynamic_batching.max_queue_delay_microseconds = db["max_queue_delay_microseconds"]
        for group in doc.get("instance_group", []):
            config.instance_group.add(name=group.get("name", ""), kind=group["kind"], count=group["count"],
                                      gpus=group.get("gpus", []))
        for key, value in doc["parameters"].items():
            config.parameters[key].string_value = str(value)
        return message("ModelConfigResponse")(config=config)

    def ModelStatistics(self, request: Any, context: Any) -> Any:  # noqa: N802
        table = self.app.table
        if request.name:
            entries = [m.stats_entry() for m in self._models_of(request.name, request.version or None)]
        else:
            entries = [m.stats_entry() for m in table.served()]
        out = message("ModelStatisticsResponse")()
        for e in entries:
            stat = out.model_stats.add(name=e["name"], version=e["version"], last_inference=e["last_inference"],
                                       inference_count=e["inference_count"], execution_count=e["execution_count"])
            for key, value in e["inference_stats"].items():
                getattr(stat.inference_stats, key).count = value["count"]
                getattr(stat.inference_stats, key).ns = value["ns"]
            for b in e["batch_stats"]:
                item = stat.batch_stats.add(batch_size=b["batch_size"])
                item.compute_infer.count = b["compute_infer"]["count"]
        return out

    def _models_of(self, name: str, version: str | None) -> list:
        table = self.app.table
        if version is not None or table.single is not None:
            return [table.lookup(name, version)]
        table.lookup(name, None)                  # 404 / 503 as for inference
        return [table.lookup(name, v) for v in table.versions_of(name)]

    # -- inference --
    def ModelInfer(self, request: Any, context: Any) -> Any:  # noqa: N802
        app = self.app
        if app.draining:
            raise ProtocolError("the server is shutting down; retry against another replica", 503)
        model = app.table.lookup(request.model_name, request.model_version or None)
        with counted(model):
            engine = model.engine if model.engine is not None and model.closed is None else model.require_engine()
            view = app.shm_view(_call(context, Category.INFERENCE))
            doc, binary = request_doc(request)
            req = parse_infer_request(doc, binary, engine.inputs, engine.outputs, model.name, model.batched, view)
            results = inference.run(model, req)
            return self._response(model, req, results, view)

    @staticmethod
    def _response(model: Any, req: Any, results: dict, view: Any) -> Any:
        response = message("ModelInferResponse")(model_name=model.name, model_version=model.version,
                                                 id=req.id or "")
        for name, _binary in req.outputs:
            arr = results[name]
            out = response.outputs.add(name=name)
            if name in req.shm_outputs:
                entry = shm_output(name, arr, req.shm_outputs[name], view)
                out.datatype = entry["datatype"]
                out.shape.extend(entry["shape"])
                for key, value in entry["parameters"].items():
                    _set_param(out.parameters, key, value)
                response.raw_output_contents.append(b"")      # keeps raw_output_contents aligned with outputs
                continue
            datatype, shape, data = output_bytes(name, arr)
            out.datatype = datatype
            out.shape.extend(shape)
            response.raw_output_contents.append(data)
        return response

    # -- the repository extension --
    def RepositoryIndex(self, request: Any, context: Any) -> Any:  # noqa: N802
        index = message("RepositoryIndexResponse").ModelIndex
        rows = self.app.table.index(ready_only=request.ready)
        return message("RepositoryIndexResponse")(models=[
            index(name=r["name"], version=r.get("version", ""), state=r["state"], reason=r.get("reason", ""))
            for r in rows])

    def RepositoryModelLoad(self, request: Any, context: Any) -> Any:  # noqa: N802
        params = _params(request.parameters)
        override = inference.load_override(params, request.model_name)
        self._control(context, lambda: self.app.table.load(request.model_name, override))
        return message("RepositoryModelLoadResponse")()

    def RepositoryModelUnload(self, request: Any, context: Any) -> Any:  # noqa: N802
        for key, value in _params(request.parameters).items():
            if key != "unload_dependents" or not isinstance(value, bool):
                raise ProtocolError(f"unknown unload parameter '{peer_text(key, 40)}'; known: "
                                    "unload_dependents (bool)")
        self._control(context, lambda: self.app.table.unload(request.model_name))
        return message("RepositoryModelUnloadResponse")()

    def _control(self, context: Any, action: Callable[[], Any]) -> None:
        """A load or unload (the policy allowed it as model control before the handler ran)."""
        try:
            action()
        except NotFound as exc:
            raise ProtocolError(str(exc), 404) from None
        except RuntimeUserError as exc:
            raise ProtocolError(" ".join(str(exc).split()), 400) from None

    # -- system shared memory --
    def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:  # noqa: N802
        shm = self.app.shm
        status = message("SystemSharedMemoryStatusResponse")
        out = status()
        for r in shm.status(request.name or None):
            out.regions[r["name"]].CopyFrom(status.RegionStatus(**r))
        return out

    def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.app.shm.register(request.name, {"key": request.key, "offset": request.offset,
                                                   "byte_size": request.byte_size})
        return message("SystemSharedMemoryRegisterResponse")()

    def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.app.shm.unregister(request.name or None)
        return message("SystemSharedMemoryUnregisterResponse")()

    # -- CUDA shared memory --
    def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:  # noqa: N802
        cuda = self.app.cuda_shm
        status = message("CudaSharedMemoryStatusResponse")
        out = status()
        for r in cuda.status(request.name or None):
            out.regions[r["name"]].CopyFrom(status.RegionStatus(**r))
        return out

    def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.app.cuda_shm.register(request.name, request.raw_handle, request.device_id, request.byte_size)
        return message("CudaSharedMemoryRegisterResponse")()

    def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.app.cuda_shm.unregister(request.name or None)
        return message("CudaSharedMemoryUnregisterResponse")()



def _call(context: Any, category: Category | None, control: bool = False) -> Call:
    """An RPC as the access policy sees it: its category, its peer's address and its metadata (a key
    sent more than once: its values joined, as HTTP headers are)."""
    metadata: dict[str, Any] = {}
    for key, value in context.invocation_metadata() or ():
        metadata[key] = f"{metadata[key]}, {value}" if key in metadata else value
    return Call(category, peer_address(context.peer()), metadata, control)


def _handler(fn: Callable[[Any, Any], Any], name: str, policy: Policy) -> Callable[[Any, Any], Any]:
    """Run one RPC once the access policy allows it (access.py: the same Policy.check as HTTP, asked
    before the handler looks at the request, a load's parameters included); a ProtocolError (or a
    user error) becomes its gRPC status with the same message."""
    category, control = grpc_category(name), name in GRPC_CONTROL

    def call(request: Any, context: Any) -> Any:
        try:
            policy.check(_call(context, category, control))
            return fn(request, context)
        except ProtocolError as exc:
            code, text = status_code(exc.status), exc.message
        except NotFound as exc:
            code, text = status_code(404), str(exc)
        except RuntimeUserError as exc:
            code, text = status_code(400), str(exc)
        except Exception as exc:  # noqa: BLE001 - the server must keep serving
            code, text = status_code(500), f"internal error: {type(exc).__name__}: {exc}"
        context.abort(code, " ".join(text.split())[:2000])

    return call


def _check_free(host: str, port: int) -> None:
    """Refuse a taken port with one line before grpc tries it (grpc's own failure logs a C-core error)."""
    import socket

    from .served import ServeError

    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise ServeError(f"cannot listen on {host}:{port} for gRPC: {exc.strerror or exc}; pick another "
                             "--grpc-port") from None


class GrpcEndpoint:
    """A running gRPC server: its port, and stop(grace) that lets in-flight RPCs finish."""

    def __init__(self, server: Any, host: str, port: int):
        self._server = server
        self.host = host
        self.port = port
        self._stopped: threading.Event | None = None

    @property
    def target(self) -> str:
        """host:port as tritonclient.grpc.InferenceServerClient(url=...) takes it."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def stop(self, grace: float | None = None) -> threading.Event:
        """Refuse new RPCs at once; those in flight get `grace` seconds. Returns the event set when done."""
        if self._stopped is None:
            self._stopped = self._server.stop(grace)
        return self._stopped


def start(app: App, host: str, port: int, *, max_message_bytes: int, workers: int = DEFAULT_WORKERS,
          reuse_port: bool = False, tls_files: tuple[str, str] | None = None) -> GrpcEndpoint:
    """Serve the GRPCInferenceService for `app` on host:port (0 = a free port) from a thread pool.

    reuse_port: bind with SO_REUSEPORT so several server processes share the port (serve --mps);
    off otherwise, so a port already taken is an error instead of a silent second listener.
    tls_files: (certificate, key) PEM paths, checked already (tls.server_context): serve TLS
    through grpc.ssl_server_credentials.
    """
    from .served import ServeError

    try:
        import grpc
    except ImportError:
        raise ServeError("--grpc-port needs grpcio and protobuf, which are not installed here; pip install "
                         "grpcio protobuf, or serve over HTTP only") from None
    if not reuse_port:
        _check_free(host, port)
    service = Service(app)
    handlers = {}
    for name, req_name, resp_name, streaming in methods():
        fn = getattr(service, name, None)
        if fn is None or streaming:
            continue                            # not served: grpc answers UNIMPLEMENTED
        handlers[name] = grpc.unary_unary_rpc_method_handler(
            _handler(fn, name, app.policy), request_deserializer=message(req_name).FromString,
            response_serializer=message(resp_name).SerializeToString)
    options = [("grpc.max_receive_message_length", max_message_bytes), ("grpc.max_send_message_length", -1),
               ("grpc.so_reuseport", 1 if reuse_port else 0)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ngcx-grpc"),
                         handlers=[grpc.method_handlers_generic_handler(SERVICE, handlers)], options=options)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        if tls_files is None:
            bound = server.add_insecure_port(address)
        else:
            cert, key = (Path(path).read_bytes() for path in tls_files)
            bound = server.add_secure_port(address, grpc.ssl_server_credentials([(key, cert)]))
    except RuntimeError as exc:
        bound, why = 0, str(exc)
    else:
        why = "the address is in use or not available"
    if not bound:
        server.stop(None)
        raise ServeError(f"cannot listen on {address} for gRPC: {why}; pick another --grpc-port")
    server.start()
    return GrpcEndpoint(server, host, bound)
