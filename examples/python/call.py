"""Calls one muster method with a JSON request and prints the answer as JSON,
or, when the call is refused, its status with every detail decoded: how a
Python client reads muster's errors.

    python3 examples/python/call.py \
      127.0.0.1:50051 muster.execution.v1.ExecutionService/GetExecution '{"id": "nope"}' \
      --token "$(cat muster-data/operator.token)"

A refused call prints, and exits 1 with:

    {"code": "NOT_FOUND", "message": "...", "details": [
      {"@type": "type.googleapis.com/google.rpc.ResourceInfo", "resourceType": "...", ...}]}

Details are the standard `google.rpc` messages (`BadRequest`, `ErrorInfo`,
`PreconditionFailure`, `ResourceInfo`, `QuotaFailure`, `RetryInfo`) and,
for a refused document, one `muster.common.v1.Diagnostic` per finding.
Needs: pip install grpcio grpcio-status (which brings googleapis-common-protos).
"""

import argparse
import importlib
import json
import os
import sys

import grpc
from google.protobuf import descriptor_pool, json_format, message_factory
from google.rpc import error_details_pb2  # noqa: F401 (registers the google.rpc details)
from grpc_status import rpc_status

import muster


def load_muster_modules():
    """Imports every generated muster module, so the pool knows each message."""
    for root in muster.__path__:
        for folder, _, files in os.walk(root):
            package = os.path.relpath(folder, os.path.dirname(root)).replace(os.sep, ".")
            for file in sorted(files):
                if file.endswith("_pb2.py"):
                    importlib.import_module(f"{package}.{file[:-3]}")


def message_class(full_name):
    return message_factory.GetMessageClass(descriptor_pool.Default().FindMessageTypeByName(full_name))


def decoded(any_detail):
    """A detail as JSON (with its `@type`), or its type and raw bytes when unknown."""
    name = any_detail.type_url.split("/")[-1]
    try:
        detail = message_class(name)()
    except KeyError:
        return {"@type": any_detail.type_url, "undecoded": any_detail.value.hex()}
    any_detail.Unpack(detail)
    return {"@type": any_detail.type_url, **json_format.MessageToDict(detail)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address", help="host:port of a muster service")
    parser.add_argument("method", help="package.Service/Method")
    parser.add_argument("request", help="the request as JSON")
    parser.add_argument("--token", default=None, help="the bearer token of the caller")
    args = parser.parse_args()

    load_muster_modules()
    service, method = args.method.split("/")
    described = descriptor_pool.Default().FindServiceByName(service).FindMethodByName(method)
    request_class = message_class(described.input_type.full_name)
    response_class = message_class(described.output_type.full_name)
    request = json_format.Parse(args.request, request_class())
    metadata = [("authorization", f"Bearer {args.token}")] if args.token else []

    call = grpc.insecure_channel(args.address).unary_unary(
        f"/{args.method}",
        request_serializer=request_class.SerializeToString,
        response_deserializer=response_class.FromString,
    )
    try:
        response = call(request, metadata=metadata, timeout=30)
    except grpc.RpcError as error:
        status = rpc_status.from_call(error)
        refused = {"code": error.code().name, "message": error.details()}
        refused["details"] = [decoded(detail) for detail in status.details] if status else []
        print(json.dumps(refused, indent=2))
        return 1
    print(json_format.MessageToJson(response))
    return 0


if __name__ == "__main__":
    sys.exit(main())
