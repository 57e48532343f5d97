#!/usr/bin/env bash
# Copies this example to a temporary folder, writes its tables, serves it with tritonserver and
# the strata backend, and queries it with client.py.
#   run.sh <tritonserver> <folder of libtritonserver> <backend directory> [python]
# scripts/triton-tests.sh runs it with tritonserver from build/triton-venv (nvidia-pytriton) and
# the backend installed in build/triton/prefix/backends.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TRITONSERVER="$1" LIBS="$2" BACKENDS="$3" PY="${4:-python3}"
WORK="$(mktemp -d)"
trap 'kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; rm -rf "$WORK"' EXIT
cp -r "$HERE/models" "$HERE/ps.json" "$WORK/"
"$PY" "$HERE/make_tables.py" "$WORK"
port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
HTTP_PORT="$(port)" GRPC_PORT="$(port)" METRICS_PORT="$(port)"
LD_LIBRARY_PATH="$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$TRITONSERVER" \
    --model-repository="$WORK/models" \
    --backend-directory="$BACKENDS" \
    --backend-config=strata,ps="$WORK/ps.json" \
    --http-address=127.0.0.1 --http-port="$HTTP_PORT" \
    --grpc-address=127.0.0.1 --grpc-port="$GRPC_PORT" \
    --metrics-address=127.0.0.1 --metrics-port="$METRICS_PORT" >"$WORK/tritonserver.log" 2>&1 &
PID=$!
for _ in $(seq 300); do
    if curl -sf "http://127.0.0.1:$HTTP_PORT/v2/health/ready" >/dev/null 2>&1; then break; fi
    kill -0 "$PID" 2>/dev/null || { cat "$WORK/tritonserver.log"; exit 1; }
    sleep 0.2
done
"$PY" "$HERE/client.py" "$WORK" "127.0.0.1:$HTTP_PORT" "127.0.0.1:$GRPC_PORT"
curl -s "http://127.0.0.1:$METRICS_PORT/metrics" | grep '^strata_' | head -4
kill -TERM "$PID"
wait "$PID" || true
echo "tritonserver stopped"
