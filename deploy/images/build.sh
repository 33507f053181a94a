#!/usr/bin/env bash
# Builds pgfleet's images without a registry: the base image from Debian
# packages (debootstrap, then `docker import`), then the controller and
# agent images from this directory's Dockerfiles with the given binaries.
#
#   deploy/images/build.sh [--bin-dir target/release] [--tag dev] [--pg-version N]...
#
# Images: pgfleet-base:bookworm (Debian 12 minbase with PostgreSQL 15 server,
# its contrib modules and client (pgbench), lz4, fio, tini), pgfleet-controller:<tag>,
# pgfleet-agent:<tag>, pgfleet-prometheus:<tag> (Debian's Prometheus, for
# deploy/compose). The agent image also carries each --pg-version (default:
# 18, what a class without `postgres: {version}` runs) as
# deploy/postgres/install.sh installs it on this host (made here first when
# missing), at the same path, so pods and local agents run the same build.
# The base is built once and reused; pass --rebuild-base to make it again.
# Needs root (debootstrap) and a Docker daemon.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin_dir="$here/../../target/release"
tag=dev
rebuild_base=0
pg_versions=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bin-dir) bin_dir="$2"; shift 2 ;;
    --tag) tag="$2"; shift 2 ;;
    --rebuild-base) rebuild_base=1; shift ;;
    --pg-version) pg_versions+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
for b in pgfleet pgfleet-agent; do
  [ -x "$bin_dir/$b" ] || { echo "$bin_dir/$b missing: build it (cargo build --release --workspace --bins) or pass --bin-dir" >&2; exit 2; }
done
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
[ "${#pg_versions[@]}" -gt 0 ] || pg_versions=(18)
pg_installs="${PGFLEET_PG_INSTALLS:-/opt/pgfleet/postgres}"
for v in "${pg_versions[@]}"; do
  bash "$here/../postgres/install.sh" "$v" --root "$pg_installs" >/dev/null
done

# A base built before it carried fio (kind fio) is rebuilt.
if [ "$rebuild_base" = 1 ] || ! docker image inspect pgfleet-base:bookworm >/dev/null 2>&1 \
    || ! docker run --rm --entrypoint /usr/bin/test pgfleet-base:bookworm -x /usr/bin/fio; then
  command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; }
  rootfs="$(mktemp -d /var/tmp/pgfleet-rootfs.XXXXXX)"
  trap 'rm -rf "$rootfs"' EXIT
  echo "== debootstrap bookworm into $rootfs (a few minutes)"
  # postgresql-15 holds the server and contrib (pgstattuple...); the client
  # package brings pgbench; fio runs kind fio.
  if ! debootstrap --variant=minbase \
      --include=postgresql-15,postgresql-client-15,liblz4-1,tini,ca-certificates,iproute2,fio \
      bookworm "$rootfs" "$mirror" >"$rootfs.log" 2>&1; then
    tail -20 "$rootfs.log" >&2
    echo "debootstrap failed (full log: $rootfs.log); set DEBIAN_MIRROR to another mirror if this one is unreachable" >&2
    exit 1
  fi
  rm -f "$rootfs.log"
  # No cluster of the package's own, no apt caches, no docs.
  rm -rf "$rootfs"/var/lib/postgresql/15/main "$rootfs"/etc/postgresql/15/main \
         "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
         "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/*
  echo "== docker import pgfleet-base:bookworm"
  tar -C "$rootfs" -c . | docker import - pgfleet-base:bookworm >/dev/null
  rm -rf "$rootfs"
  trap - EXIT
fi

ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT
cp "$bin_dir/pgfleet" "$bin_dir/pgfleet-agent" "$here"/*.Dockerfile "$ctx/"
# The installs, at the path their programs were relocated to.
mkdir -p "$ctx/postgres"
for v in "${pg_versions[@]}"; do
  cp -a "$pg_installs/$v" "$ctx/postgres/$v"
done
echo "== pgfleet-controller:$tag, pgfleet-agent:$tag"
docker build -q -t "pgfleet-controller:$tag" -f "$ctx/controller.Dockerfile" "$ctx" >/dev/null
docker build -q -t "pgfleet-agent:$tag" --build-arg "PG_INSTALLS=$pg_installs" \
  -f "$ctx/agent.Dockerfile" "$ctx" >/dev/null
# Prometheus for deploy/compose, from Debian's package: the installed one's
# binary, else the package downloaded and unpacked.
if dpkg -s prometheus >/dev/null 2>&1; then
  cp /usr/bin/prometheus "$ctx/prometheus"
else
  deb="$(mktemp -d)"
  (cd "$deb" && apt-get download prometheus >/dev/null) || {
    echo "apt-get download prometheus failed: run apt-get update, or install prometheus" >&2; rm -rf "$deb"; exit 1; }
  dpkg-deb -x "$deb"/prometheus_*.deb "$deb/root"
  cp "$deb/root/usr/bin/prometheus" "$ctx/prometheus"
  rm -rf "$deb"
fi
docker build -q -t "pgfleet-prometheus:$tag" -f "$ctx/prometheus.Dockerfile" "$ctx" >/dev/null
echo "built pgfleet-controller:$tag, pgfleet-agent:$tag (PostgreSQL ${pg_versions[*]}) and pgfleet-prometheus:$tag"
