#!/usr/bin/env bash
# Installs PostgreSQL N as Debian builds it, on any Linux host, beside the
# host's own packages: a minimal root file system of the Debian suite that
# carries N (debootstrap), whose server and tools are then made to load that
# root's own libraries (patchelf: its dynamic loader and a run path), so
# they run on the host directly: no chroot, no container. PostgreSQL finds
# its share and lib directories relative to its binaries, so the install
# works where it lies.
#
#   deploy/postgres/install.sh VERSION [--root DIR] [--force]
#
# VERSION: 15 (bookworm), 17 (trixie), 18 (forky: 18.6 with lz4, zstd and
# liburing) or 19 (experimental: 19~rc1). Installs under
# DIR/VERSION (default /opt/pgfleet/postgres, or $PGFLEET_PG_INSTALLS),
# binaries in DIR/VERSION/usr/lib/postgresql/VERSION/bin, where
# `pgfleet-agent --pg-version VERSION` and a class's `postgres: {version:
# VERSION}` find them. An install is reused (DIR/VERSION/.complete); --force
# makes it again. Needs root, debootstrap and patchelf (installed if
# missing), and Debian's archive ($DEBIAN_MIRROR). About a minute and 310 MB.
set -euo pipefail
version=""
root="${PGFLEET_PG_INSTALLS:-/opt/pgfleet/postgres}"
force=0
while [ $# -gt 0 ]; do
  case "$1" in
    --root) root="$2"; shift 2 ;;
    --force) force=1; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) echo "unknown option: $1 (see --help)" >&2; exit 2 ;;
    *) version="$1"; shift ;;
  esac
done
case "$version" in
  15) suite=bookworm ;;
  17) suite=trixie ;;
  18) suite=forky ;;
  19) suite=sid ;;
  *) echo "give a PostgreSQL major version: 15, 17, 18 or 19 (see --help)" >&2; exit 2 ;;
esac
dest="$root/$version"
bin="$dest/usr/lib/postgresql/$version/bin"
if [ "$force" = 0 ] && [ -f "$dest/.complete" ] && [ -x "$bin/postgres" ]; then
  echo "PostgreSQL $version is installed at $bin"
  exit 0
fi
[ "$(id -u)" = 0 ] || { echo "run as root (debootstrap)" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive
for tool in debootstrap patchelf; do
  command -v "$tool" >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends "$tool" >/dev/null; }
done
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
mkdir -p "$root"
work="$(mktemp -d "$root/.building-$version.XXXXXX")"
trap 'rm -rf "$work"' EXIT
echo "== debootstrap $suite into $work (about a minute)"
packages="postgresql-$version,postgresql-client-$version"
# 19 is a release candidate in `experimental`: the base from sid, the
# server from experimental.
[ "$version" = 19 ] && packages="postgresql-common,postgresql-client-common,ssl-cert"
if ! debootstrap --variant=minbase --include="$packages" "$suite" "$work" "$mirror" \
    /usr/share/debootstrap/scripts/sid >"$work.log" 2>&1; then
  tail -20 "$work.log" >&2
  echo "debootstrap failed (log: $work.log); set DEBIAN_MIRROR to another mirror if this one is unreachable" >&2
  exit 1
fi
if [ "$version" = 19 ]; then
  echo "deb $mirror experimental main" > "$work/etc/apt/sources.list.d/experimental.list"
  mount --bind /proc "$work/proc"
  trap 'umount "$work/proc" 2>/dev/null || true; rm -rf "$work"' EXIT
  # Signatures are checked; a Release file's Valid-Until is not, as sid's
  # and experimental's lapse within days and a mirror's copy may be older
  # than this host's clock.
  chroot "$work" apt-get -o Acquire::Check-Valid-Until=false update -qq >/dev/null
  # The package makes no cluster of its own (it would fail in a chroot).
  echo "create_main_cluster = false" >> "$work/etc/postgresql-common/createcluster.conf"
  chroot "$work" apt-get install -y -qq --no-install-recommends -t experimental \
    "postgresql-19" "postgresql-client-19" >/dev/null
  umount "$work/proc"
fi
rm -f "$work.log"
# No cluster of the package's own, no caches, no docs.
rm -rf "$work"/var/lib/postgresql/"$version"/main "$work"/etc/postgresql/"$version"/main \
       "$work"/var/cache/apt/archives/*.deb "$work"/var/lib/apt/lists/* \
       "$work"/usr/share/doc/* "$work"/usr/share/man/*
# Relocate: every program of the install loads the root's own loader and
# libraries; the modules (lib/*.so) find them through the programs' run path.
interp="$(readlink -f "$work/lib64/ld-linux-x86-64.so.2")"
interp="$dest${interp#"$work"}"
libs="$dest/usr/lib/x86_64-linux-gnu:$dest/lib/x86_64-linux-gnu"
for f in "$work/usr/lib/postgresql/$version/bin/"*; do
  if [ -f "$f" ] && head -c 4 "$f" | grep -q ELF; then
    patchelf --set-interpreter "$interp" --force-rpath --set-rpath "$libs" "$f"
  fi
done
for f in "$work/usr/lib/postgresql/$version/lib/"*.so; do
  patchelf --force-rpath --set-rpath "$libs" "$f" 2>/dev/null || true
done
chmod -R a+rX "$work"
rm -rf "$dest"
mv "$work" "$dest"
trap - EXIT
"$bin/postgres" --version >/dev/null || { echo "the relocated postgres does not run" >&2; exit 1; }
touch "$dest/.complete"
echo "PostgreSQL $("$bin/postgres" --version | sed 's/.*) //') installed at $bin"
