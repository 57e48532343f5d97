#!/usr/bin/env bash
# A throwaway 3-node Redis Cluster on 127.0.0.1 for the C example and manual runs.
#   scripts/redis-cluster.sh start DIR   # starts it (free ports, password, no persistence) in DIR
#                                        # and prints `export STRATA_REDIS_ADDRESS=...` lines
#   scripts/redis-cluster.sh stop DIR    # SIGTERM, then SIGKILL after 3 s; waits for every node
# Needs redis-server and redis-cli (Debian: apt-get install redis-server redis-tools).
set -euo pipefail
cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }
password=strata-example-pw

free_port() {
    python3 - <<'PY'
import socket
while True:
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close()
    if p >= 55000:
        continue
    b = socket.socket()
    try:
        b.bind(("127.0.0.1", p + 10000))
    except OSError:
        continue
    finally:
        b.close()
    print(p)
    break
PY
}

case "$cmd" in
start)
    mkdir -p "$dir"
    : >"$dir/pids"
    addrs=()
    for _ in 1 2 3; do
        port=$(free_port)
        while printf '%s\n' "${addrs[@]+"${addrs[@]}"}" | grep -q ":$port\$"; do port=$(free_port); done
        mkdir -p "$dir/$port"
        redis-server --port "$port" --bind 127.0.0.1 --dir "$dir/$port" --cluster-enabled yes \
            --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
            --cluster-require-full-coverage no --requirepass "$password" --masterauth "$password" \
            --save "" --appendonly no --logfile "$dir/$port/log" --daemonize no \
            </dev/null >/dev/null 2>&1 &
        echo $! >>"$dir/pids"
        addrs+=("127.0.0.1:$port")
    done
    for a in "${addrs[@]}"; do
        for _ in $(seq 100); do
            redis-cli -h "${a%:*}" -p "${a##*:}" -a "$password" --no-auth-warning ping 2>/dev/null | grep -q PONG && break
            sleep 0.1
        done
    done
    redis-cli -a "$password" --no-auth-warning --cluster create "${addrs[@]}" --cluster-yes >"$dir/create.log" 2>&1 ||
        { cat "$dir/create.log" >&2; exit 1; }
    for a in "${addrs[@]}"; do
        for _ in $(seq 300); do
            redis-cli -h "${a%:*}" -p "${a##*:}" -a "$password" --no-auth-warning cluster info 2>/dev/null | grep -q 'cluster_state:ok' && break
            sleep 0.1
        done
    done
    seeds=$(IFS=,; echo "${addrs[*]}")
    echo "export STRATA_REDIS_ADDRESS=$seeds"
    echo "export STRATA_REDIS_PASSWORD=$password"
    ;;
stop)
    [ -f "$dir/pids" ] || exit 0
    mapfile -t pids <"$dir/pids"
    kill -TERM "${pids[@]}" 2>/dev/null || true
    for _ in $(seq 30); do
        alive=0
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ "$alive" -eq 0 ] && break
        sleep 0.1
    done
    kill -KILL "${pids[@]}" 2>/dev/null || true
    rm -f "$dir/pids"
    ;;
*)
    echo "usage: $0 start|stop DIR" >&2
    exit 2
    ;;
esac
