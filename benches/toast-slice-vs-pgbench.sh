#!/usr/bin/env bash
# pgfleet vs pgbench on the same toast-slice points, same cluster, alternating;
# then pgfleet's own overhead (controller + agent CPU) over a quickstart run.
#
#   bash benches/toast-slice-vs-pgbench.sh [SECONDS_PER_RUN] [ROUNDS]
#
# Needs root (or a user that may run PostgreSQL) and the release build
# (`make release`). Results go to stdout; copy them into BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
rounds=${2:-5}

echo "## Latency: pgfleet loop vs pgbench -M prepared"
echo
cargo run --quiet --release -p pgfleet-agent --example toast_vs_pgbench -- "$secs" "$rounds"

echo
echo "## Overhead: controller and agent CPU during scenarios/quickstart.yaml"
echo
tick=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
out=$(mktemp -d)
start=$(date +%s.%N)
./target/release/pgfleet --store "$out/pgfleet.db" run scenarios/quickstart.yaml --out "$out/report" 2>"$out/stderr" &
ctl=$!
ctl_cpu=0; agent_cpu=0
while kill -0 "$ctl" 2>/dev/null; do
  c=$(cpu "$ctl"); [ -n "$c" ] && ctl_cpu=$c
  a=$(pgrep -f "pgfleet-agent run" | head -n1 || true)
  if [ -n "$a" ]; then v=$(cpu "$a"); [ -n "$v" ] && agent_cpu=$v; fi
  sleep 0.5
done
wait "$ctl" || true
end=$(date +%s.%N)
calls=$(python3 -c "import json;print(sum(r['metrics']['calls'] for r in json.load(open('$out/report/report.json'))['results']))")
python3 - "$start" "$end" "$ctl_cpu" "$agent_cpu" "$tick" "$calls" <<'PY'
import sys
start, end, ctl, agent, tick, calls = map(float, sys.argv[1:])
wall = end - start
print(f"| wall s | controller CPU s | agent CPU s (incl. its client loop) | measured calls | agent CPU µs/call |")
print(f"|---|---|---|---|---|")
print(f"| {wall:.1f} | {ctl/tick:.2f} ({ctl/tick/wall*100:.1f} % of one core) | {agent/tick:.2f} | {int(calls)} | {agent/tick/calls*1e6:.1f} |")
PY
rm -rf "$out"
