#!/usr/bin/env bash
# A fedkit run through Flower's deployment runtime on this machine: one SuperLink and three
# SuperNodes as separate processes on 127.0.0.1 (free ports), as a real deployment runs them:
# TLS with a throwaway CA, and SuperNode authentication (each node's public key registered on
# the SuperLink with `flwr supernode register`; an unregistered node is refused). See
# docs/engines.md for a real deployment. Results go to OUT_DIR in the usual format.
# Every process started here is stopped on exit, failure or interrupt.
#
#   bash examples/flower/deploy_local.sh OUT_DIR [extra `fedkit flower submit` options]
#
# PYTHON (default: python3) is the interpreter with fedkit and flwr installed; INSECURE=1
# runs without TLS and node authentication (plain HTTP: only to debug the script);
# SUPERNODE_ARGS adds options to each `fedkit flower supernode` (e.g. --no-warm: Flower's
# fresh ClientApp process per message, as before fedkit's warm SuperNode). INTRUDER=1 (with
# TLS) also starts a fourth SuperNode whose key is not registered: the SuperLink must refuse
# it (the run would stop with "4 SuperNodes are connected" otherwise); the script then
# prints the intruder's log lines that say why it stopped.
set -euo pipefail

if [ $# -lt 1 ]; then
  echo "usage: $0 OUT_DIR [fedkit flower submit options]" >&2
  exit 2
fi
OUT=$1
shift
PYTHON=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
NODES=3
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fedkit-deploy.XXXXXX")
PIDS=()

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  for pid in "${PIDS[@]}"; do  # each process leads its own group: stop it with its children
    kill -TERM -- "-$pid" 2>/dev/null || true
  done
  for _ in $(seq 50); do
    local alive=0
    for pid in "${PIDS[@]}"; do
      if kill -0 -- "-$pid" 2>/dev/null; then alive=1; fi
    done
    [ "$alive" -eq 0 ] && break
    sleep 0.2
  done
  for pid in "${PIDS[@]}"; do
    kill -KILL -- "-$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if [ "$status" -ne 0 ]; then
    for log in "$WORK"/*.log; do
      echo "---- $(basename "$log") (last lines)" >&2
      tail -n 15 "$log" >&2 || true
    done
  fi
  rm -rf "$WORK"
  exit "$status"
}
trap cleanup EXIT INT TERM

free_port() {
  "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

fedkit() { "$PYTHON" -m fedkit_core.cli "$@"; }

start() {  # start NAME COMMAND...: in its own process group, output to WORK/NAME.log
  local name=$1
  shift
  setsid "$@" >"$WORK/$name.log" 2>&1 &
  PIDS+=("$!")
}

LINK_PORT=$(free_port)
SUPERLINK=127.0.0.1:$LINK_PORT
KEYS=$WORK/keys
if [ "${INSECURE:-0}" = 1 ]; then
  LINK_TLS=(--insecure)
  NODE_TLS=(--insecure)
else  # TLS, and node authentication (on by default with TLS)
  "$PYTHON" "$HERE/throwaway_keys.py" "$KEYS" $((NODES + 1))  # node$NODES: never registered
  LINK_TLS=(--ca-cert "$KEYS/ca.crt" --cert "$KEYS/server.crt" --key "$KEYS/server.key")
  NODE_TLS=(--ca-cert "$KEYS/ca.crt")
  "$PYTHON" -c 'import sys; from pathlib import Path
from fedkit_core.engines.flower.deploy import Tls, write_connection
write_connection(Path(sys.argv[1]), sys.argv[2], Tls(ca_cert=Path(sys.argv[3])))' \
    "$WORK/flwr" "$SUPERLINK" "$KEYS/ca.crt"  # for `flwr supernode register`
fi
start superlink "$PYTHON" -m fedkit_core.cli flower superlink --address "$SUPERLINK" "${LINK_TLS[@]}"
for _ in $(seq 150); do  # until the SuperLink accepts connections
  if "$PYTHON" -c "import socket; socket.create_connection(('127.0.0.1', $LINK_PORT), 1)" 2>/dev/null; then
    break
  fi
  sleep 0.2
done
if [ "${INTRUDER:-0}" = 1 ] && [ "${INSECURE:-0}" != 1 ]; then
  start intruder "$PYTHON" -m fedkit_core.cli flower supernode --superlink "$SUPERLINK" \
    --partition-id 0 --port "$(free_port)" "${NODE_TLS[@]}" --auth-key "$KEYS/node$NODES"
fi
for k in $(seq 0 $((NODES - 1))); do
  AUTH=()
  if [ "${INSECURE:-0}" != 1 ]; then  # register the node's public key, then it may join
    FLWR_HOME="$WORK/flwr" "$(dirname "$(command -v "$PYTHON")")/flwr" supernode register \
      "$KEYS/node$k.pub" >>"$WORK/register.log" 2>&1
    AUTH=(--auth-key "$KEYS/node$k")
  fi
  start "supernode$k" "$PYTHON" -m fedkit_core.cli flower supernode --superlink "$SUPERLINK" \
    --partition-id "$k" --port "$(free_port)" "${NODE_TLS[@]}" "${AUTH[@]}" \
    ${SUPERNODE_ARGS:-}
done

fedkit flower submit --superlink "$SUPERLINK" "${NODE_TLS[@]}" --nodes "$NODES" \
  --config "$HERE/deploy_local.yaml" --out "$OUT" "$@"
if [ "${INTRUDER:-0}" = 1 ] && [ -f "$WORK/intruder.log" ]; then
  echo "---- intruder.log (why it stopped)"
  grep -E "Exit Code|Failed to" "$WORK/intruder.log" || true
fi
