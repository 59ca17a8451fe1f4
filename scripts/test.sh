#!/usr/bin/env bash
# The whole leasehold test suite, on a fresh machine or a warm one:
#   1-2. scripts/services.sh installs what is missing and starts moto and
#        redis-server on free loopback ports (stopped on exit, whatever happens),
#   3.   alerts/: promtool check/test rules, amtool check-config and routing,
#        cfn-lint, the Grafana JSON,
#   4.   deploy/: scripts/check_deploy.sh, then scripts/check_outside_tools.sh
#        (hadolint, checkov, the Docker build context) and a `cargo check` of
#        exactly the build context,
#   5.   cargo fmt --check, cargo deny (licences, bans, sources), cargo clippy
#        -D warnings and every test in the workspace.
# `.ci/run` calls exactly this. Build output goes to $CARGO_TARGET_DIR
# (default ~/.cache/leasehold/target) so repeated runs reuse it.
set -euo pipefail

# `scripts/test.sh --quick`: the tier to run while working, in a few minutes
# and with nothing installed or started: formatting, every unit test, the
# conformance suites against the in-memory backends, and the models. Tests
# that need a service skip without one. The full
# command below stays what the README and CI run.
if [[ "${1:-}" == "--quick" ]]; then
    cd "$(dirname "${BASH_SOURCE[0]}")/.."
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${LEASEHOLD_CACHE:-$HOME/.cache/leasehold}/target}"
    quick() { printf '\n== %s\n' "$*" >&2; "$@"; }
    quick cargo fmt --all --check
    quick cargo test --workspace --locked --lib --bins
    # Each crate's integration tests are one binary, `it`, with a module per
    # scenario file: a filter `<module>::` picks a module's tests (after `--`,
    # several filters pick the tests any of them matches).
    quick cargo test --locked -p leasehold-control --test it conformance::memory::
    quick cargo test --locked -p leasehold-sink --test it sink_conformance::memory::
    quick cargo test --locked -p leasehold-pool --test it bus_conformance::memory::
    # The models at their own depths: each must still find the counterexample
    # of every rule switched off, which a shallower search misses.
    quick cargo test --locked -p leasehold-control --test it -- protocol_model:: session_model::
    quick cargo test --locked -p leasehold-pool --test it -- assign_model:: request_model::
    quick cargo test --locked -p leasehold-stream --test it -- \
        machine_model:: sequence_model:: range_model:: snapshot_model:: handoff_model::
    exit 0
fi
source "$(dirname "${BASH_SOURCE[0]}")/services.sh"

# --- 3. alerts -------------------------------------------------------------------
# Rule syntax and promtool unit tests, the CloudFormation alarms, the dashboard's
# JSON (the cross-check against a real sidecar runs with cargo test below).
log "promtool check rules / test rules"
promtool check rules alerts/prometheus/leasehold.rules.yml alerts/prometheus/runbook_base.rules.yml
promtool test rules alerts/prometheus/tests/*.yml
promtool check config deploy/prometheus.yml
log "amtool check-config / routes test alerts/alertmanager"
amtool check-config alerts/alertmanager/alertmanager.yml
# Critical pages, warning opens a ticket: the receiver each severity reaches.
expect_route() { # receiver label=value...
    local want="$1" got
    shift
    got="$(amtool config routes test --config.file=alerts/alertmanager/alertmanager.yml "$@" 2>/dev/null)"
    if [[ "$got" != "$want" ]]; then
        echo "error: alerts/alertmanager routes {$*} to '$got', expected '$want'" >&2
        return 1
    fi
}
expect_route pager severity=critical alertname=LeaseholdStreamUnowned cluster=prod
expect_route pager severity=critical alertname=LeaseholdBrokerErrorBudgetBurn job=leasehold-broker-pool
expect_route ticket severity=warning alertname=LeaseholdBrokerErrorBudgetBurn job=leasehold-broker-pool
expect_route ticket severity=warning alertname=LeaseholdWorkerDown instance=10.0.1.5:9464
log "cfn-lint alerts/cloudwatch"
"$cfn_lint" alerts/cloudwatch/*.yaml
log "grafana dashboard JSON"
python3 -m json.tool alerts/grafana/leasehold.json >/dev/null

# --- 4. deploy -------------------------------------------------------------------
log "deploy/: cfn-lint, JSON, task definitions and IAM policies against the code"
bash scripts/check_deploy.sh
log "deploy/ and the image with tools from outside: hadolint, checkov, the Docker build context"
bash scripts/check_outside_tools.sh
# The image's `cargo build` compiles from the build context alone: check exactly
# that copy (about a minute; the image itself cannot be built here, see deploy/README.md).
python3 scripts/check_build_context.py --compile

# --- 5. cargo ---------------------------------------------------------------------
log "cargo fmt --check"
cargo fmt --all --check
log "cargo deny check bans licenses sources"
cargo deny --log-level error check bans licenses sources
log "cargo tree: the dashboard pulls in no stream worker, dev cluster or WebSocket crate"
dashboard_tree="$(cargo tree --locked -p leasehold-dashboard -e normal --prefix none)"
if grep -E '^(leasehold-stream|leasehold-devcluster|tokio-tungstenite|tungstenite) ' <<<"$dashboard_tree"; then
    echo "error: leasehold-dashboard depends on the crates above" >&2
    exit 1
fi
log "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
log "cargo test"
# Libraries, binaries and integration tests (benches run from scripts/bench.sh).
cargo test --workspace --locked --no-fail-fast --lib --bins --tests 2>&1 | tee "$repo/test-output/cargo-test.log"
# One closing line over every test binary, in the plain form CI reads.
awk '/^test result:/ { p += $4; f += $6; i += $8 } END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, i }' \
    "$repo/test-output/cargo-test.log"
