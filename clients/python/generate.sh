#!/usr/bin/env bash
# Generates muster's Python client from proto/ into this package's `muster/`
# (or into MUSTER_PYTHON_OUT): the messages and gRPC stubs, which the
# package `muster-client` ships beside the worker library `muster_worker`.
# Needs: pip install grpcio-tools==1.85.1
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
proto="$here/../../proto"
python="${PYTHON:-python3}"
out="${MUSTER_PYTHON_OUT:-$here}"
rm -rf "$out/muster"
mkdir -p "$out"
"$python" -m grpc_tools.protoc -I "$proto" \
  --python_out="$out" --grpc_python_out="$out" \
  $(cd "$proto" && find muster -name '*.proto' | sort)
echo "generated the muster client in $out/muster"
