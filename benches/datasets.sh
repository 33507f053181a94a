#!/usr/bin/env bash
# Datasets: building (load + publish) against restoring, per scale, with the
# standard tool side by side: `cp -a` of the same PGDATA followed by `sync`
# (what a restore must at least do; pgfleet also checks every file's
# SHA-256 and drops the copy from the page cache).
#
#   bash benches/datasets.sh [SCALE ...]        (default: 100)
#
# Each scale: one run that builds the dataset (a fresh store), then RESTORES
# runs that restore it, each followed by the cp -a + sync of the published
# PGDATA. Needs root (or a user that may run PostgreSQL) and the release
# build (`make release`). Results go to stdout; copy them into BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
restores=${RESTORES:-3}
scales=("${@:-100}")
work=$(mktemp -d /var/tmp/pgfleet-bench-datasets.XXXXXX)
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"
bin=./target/release
field() { python3 -c "import json,sys; d=json.load(open(sys.argv[1]))['cells'][0]['environment']['dataset']; print(d.get(sys.argv[2], ''))" "$1" "$2"; }
echo "| scale | dataset | load s | publish s | build s | restore s (median of $restores) | MB/s | cp -a + sync s | restore / cp | load / restore |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for scale in "${scales[@]}"; do
  cat > "$work/s.yaml" <<YAML
name: datasets-s$scale
fleet:
  - name: local
    count: 1
workloads:
  - kind: pgbench
    scale: $scale
    transactions: 100
    clients: 1
YAML
  rm -rf "$work/data"
  $bin/pgfleet --store "$work/db" run "$work/s.yaml" --out "$work/build" --data-dir "$work/data" >/dev/null 2>&1
  r="$work/build/report.json"
  [ "$(field "$r" how)" = built ] || { echo "scale $scale: the first run did not build" >&2; exit 1; }
  load=$(field "$r" load_seconds); publish=$(field "$r" publish_seconds); bytes=$(field "$r" bytes)
  fp=$(field "$r" fingerprint)
  rs=(); cps=()
  for i in $(seq "$restores"); do
    rm -rf "$work/out$i"
    # Each side starts from the device: nothing of the dataset cached.
    sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
    $bin/pgfleet --store "$work/db" run "$work/s.yaml" --out "$work/out$i" --data-dir "$work/data" >/dev/null 2>&1
    r="$work/out$i/report.json"
    [ "$(field "$r" how)" = restored ] || { echo "scale $scale: run $i did not restore" >&2; exit 1; }
    rs+=("$(field "$r" restore_seconds)")
    sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
    t0=$(date +%s.%N)
    cp -a "$work/data/datasets/$fp/data" "$work/cp"
    sync
    t1=$(date +%s.%N)
    cps+=("$(python3 -c "print($t1 - $t0)")")
    rm -rf "$work/cp"
  done
  python3 - "$scale" "$fp" "$load" "$publish" "$bytes" "${rs[*]}" "${cps[*]}" <<'PY'
import statistics, sys
scale, fp, load, publish, nbytes = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
rs = [float(x) for x in sys.argv[6].split()]
cps = [float(x) for x in sys.argv[7].split()]
r, c = statistics.median(rs), statistics.median(cps)
print(f"| {scale} | {nbytes/2**30:.1f} GiB | {load:.1f} | {publish:.1f} | {load+publish:.1f} | {r:.1f} ({', '.join(f'{x:.1f}' for x in rs)}) | {nbytes/1e6/r:.0f} | {c:.1f} | {r/c:.2f}x | {load/r:.1f}x |")
PY
done
