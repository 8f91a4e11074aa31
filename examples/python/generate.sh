#!/usr/bin/env bash
# Generates the Python client of muster from proto/ into ./generated
# (or MUSTER_PYTHON_OUT).
# Needs: pip install grpcio==1.85.1 grpcio-tools==1.85.1 (and grpcio-status==1.85.1 for call.py)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
proto="$here/../../proto"
python="${PYTHON:-python3}"
out="${MUSTER_PYTHON_OUT:-$here/generated}"
rm -rf "$out"
mkdir -p "$out"
"$python" -m grpc_tools.protoc -I "$proto" \
  --python_out="$out" --grpc_python_out="$out" \
  $(cd "$proto" && find muster -name '*.proto' | sort)
echo "generated the muster client in $out"
