#!/usr/bin/env bash
# A fedkit run through Flower's deployment runtime on this machine: one SuperLink and three
# SuperNodes as separate processes on 127.0.0.1 (free ports), as a real deployment runs them:
# TLS with a throwaway CA, and SuperNode authentication with the nodes' public keys fixed at
# the SuperLink's start (--node-keys; a node with another key is refused). The SuperNodes
# reach the SuperLink's Fleet address; the run is submitted to its operator address, which
# serves only this machine. See docs/engines.md for a real deployment. Results go to OUT_DIR
# in the usual format. Every process started here is stopped on exit, failure or interrupt.
#
#   bash examples/flower/deploy_local.sh [--dry-run] OUT_DIR [extra `fedkit flower submit` options]
#
# The interpreter is the one fedkit was installed with: PYTHON if set, else the active venv's
# ($VIRTUAL_ENV/bin/python), else the one of the `fedkit` command on PATH (its #! line), else
# the checkout's .venv/bin/python, else python3. The script says which, and stops (exit 2)
# when it lacks fedkit or Flower (pip install 'fedkit[flower]'); --dry-run stops after that
# check, before starting anything. INSECURE=1
# runs without TLS and node authentication (plain HTTP: only to debug the script);
# SUPERNODE_ARGS adds options to each `fedkit flower supernode` (e.g. --warm: fedkit's opt-in
# warm SuperNode, which keeps each client in one process instead of Flower's fresh ClientApp
# process per message; see docs/engines.md, "the fast layer"). INTRUDER=1 (with
# TLS) also plays an outsider holding only the public ca.crt and a key of its own: it tries
# to register its key (`flwr supernode register`) on the Fleet address and on the operator
# address, to unregister a hospital's node, and starts a fourth SuperNode with its key. The
# SuperLink must refuse each (the run would stop with "4 SuperNodes are connected"
# otherwise); the script prints what each attempt got. STOLEN=1 (with TLS) plays a thief
# holding a copy of hospital 0's private key: its SuperNode connects with that key before
# hospital 0's own node (the script waits until the SuperLink has activated it), so the
# SuperLink refuses the real node's activation and the thief serves client 0 (with the same
# local data here, so the run completes). The SuperLink warns of the second activation, the
# run records it as an event and names the node and address that served each client
# (results.json's `nodes`); the script prints the SuperLink's lines about it.
set -euo pipefail

DRY_RUN=0
if [ "${1:-}" = --dry-run ]; then
  DRY_RUN=1
  shift
fi
if [ $# -lt 1 ] && [ "$DRY_RUN" = 0 ]; then
  echo "usage: $0 [--dry-run] OUT_DIR [fedkit flower submit options]" >&2
  exit 2
fi
OUT=${1:-}
if [ $# -gt 0 ]; then
  shift
fi
HERE=$(cd "$(dirname "$0")" && pwd)

pick_python() {  # prints "INTERPRETER<TAB>where it comes from"
  if [ -n "${PYTHON:-}" ]; then
    printf '%s\t%s\n' "$PYTHON" "PYTHON"
    return
  fi
  if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
    printf '%s\t%s\n' "$VIRTUAL_ENV/bin/python" "the active venv, VIRTUAL_ENV"
    return
  fi
  local script interpreter
  script=$(command -v fedkit || true)
  if [ -n "$script" ] && [ -f "$script" ]; then
    interpreter=$(head -n 1 "$script" | sed -n 's/^#![[:space:]]*//p' | cut -d' ' -f1)
    if [[ "$(basename "$interpreter")" == python* ]] && [ -x "$interpreter" ]; then
      printf '%s\t%s\n' "$interpreter" "the fedkit command at $script"
      return
    fi
  fi
  local checkout
  checkout=$(cd "$HERE/../.." && pwd)
  if [ -x "$checkout/.venv/bin/python" ]; then
    printf '%s\t%s\n' "$checkout/.venv/bin/python" "the checkout's .venv"
    return
  fi
  printf '%s\t%s\n' python3 "no venv found: python3 on PATH"
}

IFS=$'\t' read -r PYTHON PYTHON_FROM < <(pick_python)
echo "deploy_local.sh: Python $PYTHON ($PYTHON_FROM)" >&2
MISSING=$("$PYTHON" -c 'import importlib.util as u
print(" ".join(m for m in ("fedkit_core", "flwr", "tomli_w") if u.find_spec(m) is None))' 2>&1) ||
  MISSING="fedkit_core flwr tomli_w (it did not run: $MISSING)"
if [ -n "$MISSING" ]; then
  echo "error: $PYTHON lacks $MISSING: install fedkit with Flower into its environment," \
    "pip install 'fedkit[flower]' (from a checkout: pip install -e '.[flower]'), or set PYTHON" \
    "to an interpreter that has them" >&2
  exit 2
fi
if [ "$DRY_RUN" = 1 ]; then
  exit 0
fi
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
CONTROL_PORT=$(free_port)
SUPERLINK=127.0.0.1:$LINK_PORT  # the Fleet address: what the SuperNodes (hospitals) reach
CONTROL=127.0.0.1:$CONTROL_PORT  # the operator address: run submission, node registration
KEYS=$WORK/keys
FLWR="$(dirname "$(command -v "$PYTHON")")/flwr"
if [ "${INSECURE:-0}" = 1 ]; then
  LINK_TLS=(--insecure)
  NODE_TLS=(--insecure)
else  # TLS, and node authentication with the hospitals' keys fixed at start
  "$PYTHON" "$HERE/throwaway_keys.py" "$KEYS" $((NODES + 1))  # node$NODES: the outsider's
  for k in $(seq 0 $((NODES - 1))); do  # the operator's list: one key a line, named
    printf '%s hospital-%s\n' "$(cut -d' ' -f1,2 "$KEYS/node$k.pub")" "$k"
  done >"$KEYS/nodes.pub"
  LINK_TLS=(--ca-cert "$KEYS/ca.crt" --cert "$KEYS/server.crt" --key "$KEYS/server.key")
  LINK_TLS+=(--node-keys "$KEYS/nodes.pub" --node-log "$WORK/node-log")
  NODE_TLS=(--ca-cert "$KEYS/ca.crt")
fi
start superlink "$PYTHON" -m fedkit_core.cli flower superlink --address "$SUPERLINK" \
  --control-address "$CONTROL" "${LINK_TLS[@]}"
for port in "$LINK_PORT" "$CONTROL_PORT"; do  # until the SuperLink accepts connections
  for _ in $(seq 150); do
    if "$PYTHON" -c "import socket; socket.create_connection(('127.0.0.1', $port), 1)" 2>/dev/null; then
      break
    fi
    sleep 0.2
  done
done

connection() {  # connection FOLDER ADDRESS: a Flower configuration (FLWR_HOME) for ADDRESS
  "$PYTHON" -c 'import sys; from pathlib import Path
from fedkit_core.engines.flower.deploy import Tls, write_connection
write_connection(Path(sys.argv[1]), sys.argv[2], Tls(ca_cert=Path(sys.argv[3])))' \
    "$1" "$2" "$KEYS/ca.crt"
}

outsider() {  # outsider NAME ADDRESS ARGS...: `flwr ARGS` against ADDRESS, holding only ca.crt
  local name=$1 address=$2
  shift 2
  connection "$WORK/outsider-$name" "$address"
  local code=0
  FLWR_HOME="$WORK/outsider-$name" "$FLWR" "$@" fedkit --format json \
    >"$WORK/outsider-$name.out" 2>&1 || code=$?
  echo "$name: exit $code: $(tr '\n' ' ' <"$WORK/outsider-$name.out" | cut -c1-300)" \
    >>"$WORK/outsider.txt"
}
if [ "${INTRUDER:-0}" = 1 ] && [ "${INSECURE:-0}" != 1 ]; then
  outsider register-on-fleet "$SUPERLINK" supernode register "$KEYS/node$NODES.pub"
  outsider register-on-control "$CONTROL" supernode register "$KEYS/node$NODES.pub"
  outsider list-on-fleet "$SUPERLINK" supernode list
  start intruder "$PYTHON" -m fedkit_core.cli flower supernode --superlink "$SUPERLINK" \
    --partition-id 0 --port "$(free_port)" "${NODE_TLS[@]}" --auth-key "$KEYS/node$NODES"
fi
STOLEN_KEY=0  # whether a thief plays hospital 0 with a copy of its key
if [ "${STOLEN:-0}" = 1 ] && [ "${INSECURE:-0}" != 1 ]; then
  STOLEN_KEY=1
fi
if [ "$STOLEN_KEY" = 1 ]; then  # the thief connects first, with hospital 0's key
  start thief "$PYTHON" -m fedkit_core.cli flower supernode --superlink "$SUPERLINK" \
    --partition-id 0 --port "$(free_port)" "${NODE_TLS[@]}" --auth-key "$KEYS/node0" \
    ${SUPERNODE_ARGS:-}
  for _ in $(seq 300); do  # until the SuperLink has activated it
    if grep -q "(hospital-0) active from" "$WORK/superlink.log"; then
      break
    fi
    sleep 0.2
  done
  if ! grep -q "(hospital-0) active from" "$WORK/superlink.log"; then
    echo "error: the thief's SuperNode was not activated within 60 s" >&2
    exit 1
  fi
fi
for k in $(seq 0 $((NODES - 1))); do
  AUTH=()
  if [ "${INSECURE:-0}" != 1 ]; then
    AUTH=(--auth-key "$KEYS/node$k")
  fi
  start "supernode$k" "$PYTHON" -m fedkit_core.cli flower supernode --superlink "$SUPERLINK" \
    --partition-id "$k" --port "$(free_port)" "${NODE_TLS[@]}" "${AUTH[@]}" \
    ${SUPERNODE_ARGS:-}
done
if [ "${INTRUDER:-0}" = 1 ] && [ "${INSECURE:-0}" != 1 ]; then  # at a hospital's node
  connection "$WORK/operator" "$CONTROL"
  FLWR_HOME="$WORK/operator" "$FLWR" supernode list fedkit --format json >"$WORK/nodes.json"
  FIRST=$("$PYTHON" -c 'import json, sys
print(json.load(open(sys.argv[1]))["nodes"][0]["node-id"])' "$WORK/nodes.json")
  outsider unregister-on-fleet "$SUPERLINK" supernode unregister "$FIRST"
  outsider unregister-on-control "$CONTROL" supernode unregister "$FIRST"
  outsider list-runs-on-fleet "$SUPERLINK" list
  code=0  # and a run submitted to the SuperNodes' address
  fedkit flower submit --superlink "$SUPERLINK" "${NODE_TLS[@]}" --nodes "$NODES" --no-wait \
    -q >"$WORK/outsider-submit.out" 2>&1 || code=$?
  echo "submit-on-fleet: exit $code: $(tr '\n' ' ' <"$WORK/outsider-submit.out" | cut -c1-300)" \
    >>"$WORK/outsider.txt"
fi

fedkit flower submit --superlink "$CONTROL" "${NODE_TLS[@]}" --nodes "$NODES" \
  --config "$HERE/deploy_local.yaml" --out "$OUT" "$@"
if [ "${INTRUDER:-0}" = 1 ] && [ -f "$WORK/intruder.log" ]; then
  echo "---- outsider (what each attempt got)"
  cat "$WORK/outsider.txt"
  echo "---- intruder.log (why it stopped)"
  grep -E "Exit Code|Failed to" "$WORK/intruder.log" || true
  echo "---- nodes (flwr supernode list on the operator address)"
  FLWR_HOME="$WORK/operator" "$FLWR" supernode list fedkit --format json
fi
if [ "$STOLEN_KEY" = 1 ]; then
  echo "---- superlink (the operator's console: activations)"
  grep -E "\) active from|WARNING: a second SuperNode" "$WORK/superlink.log" || true
  echo "---- supernode0.log (why hospital 0's own node stopped)"
  grep -E "Exit Code|Failed to" "$WORK/supernode0.log" || true
fi
