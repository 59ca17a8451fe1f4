#!/usr/bin/env bash
# Every benchmark, with the servers they need (see scripts/services.sh).
# Figures are printed; BENCHMARKS.md records them with these commands.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/services.sh"
export LEASEHOLD_BENCH_REDIS_URL="$LEASEHOLD_TEST_REDIS_URL"

log "keeper: 10,000 leases on the in-memory store"
cargo bench -p leasehold-control --bench keeper
log "stream throughput: raw read, parse only, a pipelined-XADD peer and leasehold into memory and Redis, on 1 and 100 streams; RSS per held stream; control-plane writes"
cargo bench -p leasehold --bench stream_throughput
log "backfill: a 10 s gap at 1,000 events/s read back from a Binance-shaped history"
cargo bench -p leasehold --bench backfill
log "order books: cost per update with and without checksums (recorded sessions), time from a cut to a re-synchronised book"
cargo bench -p leasehold --bench book
log "fail-over: graceful hand-off and crash takeover"
cargo bench -p leasehold --bench failover
log "connections: CPU and memory per stream at 1 and 500 streams per connection"
cargo bench -p leasehold --bench connections
log "connect limits: cold start and rolling restart of 10,000 streams under Binance's limits (simulated)"
cargo bench -p leasehold-devcluster --bench connect_limits
log "balancing: lease moves on scale-out, crash and cold start"
cargo bench -p leasehold-devcluster --bench balance
log "sidecar: CPU per 10,000 events/s, /metrics render with 1,000 streams"
cargo bench -p leasehold-sidecar --bench sidecar
log "sidecar memory: a simulated hour at 10,000 events/s in each export mode"
cargo bench -p leasehold-sidecar --bench memory
log "broker pool: claim latency, request handling, idle worker memory"
cargo bench -p leasehold --bench broker_pool
log "broker pool: KMS decrypt cost added to a claim (moto on loopback)"
cargo bench -p leasehold-broker --bench kms_decrypt
log "lease-table reads by the dashboard and the observer, before and after"
cargo bench -p leasehold --bench read_cost
log "dashboard: render with 10,000 streams"
cargo bench -p leasehold-dashboard --bench render
