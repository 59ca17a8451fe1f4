#!/usr/bin/env bash
# Shared by scripts/test.sh and scripts/bench.sh (sourced, not run):
#   1. installs what is missing (Debian: redis-server, prometheus for promtool
#      and the server, prometheus-alertmanager for amtool, chromium; Python:
#      moto[server], cfn-lint for the CloudWatch alarms and deploy/, and
#      redis-py for the example sink consumer, in a venv under
#      ~/.cache/leasehold when not importable),
#   2. starts a DynamoDB-compatible server (moto, serialised), redis-server and a
#      three-primary Redis Cluster on
#      free loopback ports, exports their addresses, and stops them on exit.
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
cache="${LEASEHOLD_CACHE:-$HOME/.cache/leasehold}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$cache/target}"
mkdir -p "$cache" "$repo/test-output"

log() { printf '\n== %s\n' "$*" >&2; }

# --- 1. dependencies ---------------------------------------------------------
apt_missing=()
command -v redis-server >/dev/null || apt_missing+=(redis-server)
# One Debian package, two binaries: promtool (rule checks) and the server the
# end-to-end alert test runs (LEASEHOLD_PROMETHEUS below).
{ command -v promtool && command -v prometheus; } >/dev/null || apt_missing+=(prometheus)
# amtool checks the example Alertmanager configuration in alerts/alertmanager/.
command -v amtool >/dev/null || apt_missing+=(prometheus-alertmanager)
# Chromium does not depend on any font; without one the screenshots are boxes.
command -v chromium >/dev/null || apt_missing+=(chromium fonts-dejavu-core)
if ((${#apt_missing[@]})); then
    log "installing Debian packages: ${apt_missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${apt_missing[@]}" >/dev/null
fi

# rust-toolchain.toml names 1.95.0. Nothing can be downloaded here, so a machine
# whose only toolchain is a stable 1.95.0 gets it linked under that name.
if command -v rustup >/dev/null && ! rustup toolchain list | grep -q '^1\.95\.0'; then
    if [[ "$(rustup run stable rustc --version 2>/dev/null)" == "rustc 1.95.0 "* ]]; then
        log "linking the stable toolchain as 1.95.0 (rust-toolchain.toml)"
        rustup toolchain link 1.95.0 "$(rustup run stable rustc --print sysroot)"
    fi
fi

# cargo-deny (crates.io) checks licences, bans and sources; built once per machine.
if ! cargo deny --version >/dev/null 2>&1; then
    log "installing cargo-deny (once per machine, a few minutes)"
    cargo install --locked --quiet cargo-deny@0.20.2
fi

python=python3
if ! "$python" -c 'import moto.server, flask, werkzeug' 2>/dev/null; then
    venv="$cache/venv"
    if ! "$venv/bin/python" -c 'import moto.server, flask, werkzeug' 2>/dev/null; then
        log "installing moto[server] into $venv"
        python3 -m venv "$venv"
        "$venv/bin/pip" install -q "moto[server]"
    fi
    python="$venv/bin/python"
fi

# cfn-lint (PyPI) lints the CloudWatch alarm template in alerts/cloudwatch/ and
# the templates in deploy/; same venv logic as moto: the machine's own when
# importable, else the cached venv.
cfn_lint=cfn-lint
if ! python3 -c 'import cfnlint' 2>/dev/null || ! command -v cfn-lint >/dev/null; then
    venv="$cache/venv"
    if ! "$venv/bin/python" -c 'import cfnlint' 2>/dev/null; then
        log "installing cfn-lint into $venv"
        [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
        "$venv/bin/pip" install -q cfn-lint
    fi
    cfn_lint="$venv/bin/cfn-lint"
fi

# redis-py (PyPI) runs the example sink consumer, examples/consumer/consume.py,
# in leasehold/tests/it/sink_consumer.rs; same venv logic as cfn-lint.
redis_python=python3
if ! python3 -c 'import redis' 2>/dev/null; then
    venv="$cache/venv"
    if ! "$venv/bin/python" -c 'import redis' 2>/dev/null; then
        log "installing redis-py into $venv"
        [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
        "$venv/bin/pip" install -q "redis==8.1.0"
    fi
    redis_python="$venv/bin/python"
fi

# --- 2. servers ----------------------------------------------------------------
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

free_port() { "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_for_port() { # name port
    for _ in $(seq 1 100); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$2") 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "error: $1 did not start on port $2; its log:" >&2
    cat "$repo/test-output/$1.log" >&2 || true
    return 1
}

moto_port=$(free_port)
"$python" scripts/moto_serialized.py "$moto_port" >"$repo/test-output/moto.log" 2>&1 &
pids+=($!)
redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
    >"$repo/test-output/redis.log" 2>&1 &
pids+=($!)
# A three-primary Redis Cluster on loopback for the sink's cluster tests
# (each node with its own directory for nodes.conf, and its bus port chosen
# like the others instead of port + 10000).
cluster_nodes=()
for i in 1 2 3; do
    node_port=$(free_port)
    bus_port=$(free_port)
    node_dir="$repo/test-output/redis-cluster/$i"
    rm -rf "$node_dir" && mkdir -p "$node_dir"
    (cd "$node_dir" && exec redis-server --port "$node_port" --cluster-port "$bus_port" \
        --bind 127.0.0.1 --cluster-enabled yes --cluster-config-file nodes.conf \
        --save '' --appendonly no) >"$repo/test-output/redis-cluster-$i.log" 2>&1 &
    pids+=($!)
    cluster_nodes+=("127.0.0.1:$node_port")
done
wait_for_port moto "$moto_port"
wait_for_port redis "$redis_port"
for i in 1 2 3; do wait_for_port "redis-cluster-$i" "${cluster_nodes[$((i - 1))]#*:}"; done
redis-cli --cluster create "${cluster_nodes[@]}" --cluster-replicas 0 --cluster-yes \
    >"$repo/test-output/redis-cluster-create.log" 2>&1
for _ in $(seq 1 100); do
    if redis-cli -p "${cluster_nodes[0]#*:}" cluster info 2>/dev/null | grep -q 'cluster_state:ok'; then
        break
    fi
    sleep 0.1
done

export LEASEHOLD_TEST_DYNAMODB_ENDPOINT="http://127.0.0.1:$moto_port"
export LEASEHOLD_TEST_REDIS_URL="redis://127.0.0.1:$redis_port"
export LEASEHOLD_TEST_REDIS_CLUSTER_URL="redis+cluster://$(IFS=,; echo "${cluster_nodes[*]}")"
export LEASEHOLD_REQUIRE_SERVICES=1
export LEASEHOLD_TEST_PYTHON="$python"
export LEASEHOLD_TEST_REDIS_PYTHON="$redis_python"
# leasehold/tests/it/redis_acl.rs starts its own redis-server with deploy/redis-acl.conf.
export LEASEHOLD_REDIS_SERVER="$(command -v redis-server)"
export LEASEHOLD_PROMTOOL="$(command -v promtool)"
export LEASEHOLD_CHROMIUM="$(command -v chromium)"
export LEASEHOLD_PROMETHEUS="$(command -v prometheus)"
# Nothing in the tests may reach a real AWS account.
unset AWS_PROFILE AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_SESSION_TOKEN
log "moto on :$moto_port, redis on :$redis_port, redis cluster on ${cluster_nodes[*]}"

