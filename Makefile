# The README's two commands: `make run` (quickstart) and `make test` (the
# fast tier); `make test-all` (every tier) is what .ci/run runs.
# .config/nextest.toml says which test is in which tier; BENCHMARKS.md
# ("Test suite") how long they take.
CARGO ?= cargo

.PHONY: run quickstart postgres test test-all test-times build release lint bench clean

## Quickstart: build what it needs and run scenarios/quickstart.yaml
## (a fresh clone: under 6 minutes on 2 cores, the build and PostgreSQL 18's
## install included; BENCHMARKS.md, "First run"). The install (network and
## disk) runs beside the build (CPU): -j3 leaves cargo two jobs meanwhile.
run:
	$(MAKE) --no-print-directory -j3 quickstart postgres
	./target/quickstart/pgfleet run scenarios/quickstart.yaml --out runs/quickstart

## The two binaries, in the quickstart profile (Cargo.toml: optimized less,
## built in a third of a release build's time).
quickstart:
	$(CARGO) build --profile quickstart --locked -p pgfleet-controller -p pgfleet-agent --bins

## PostgreSQL 18, the version clusters run by default: Debian's 18.6 under
## /opt/pgfleet/postgres (about a minute, root, once; reused after).
postgres:
	bash deploy/postgres/install.sh 18

## The fast tier: unit and in-process tests, PostgreSQL fact tests (minutes).
## The binaries are built with the tests, so with their dev-dependencies'
## features (tokio's test-util): built alone they would differ, and every
## crate on tokio would be compiled twice.
test: postgres
	$(CARGO) build --workspace --bins --tests --locked
	$(CARGO) nextest run --workspace --locked --no-fail-fast

## Every tier: adds multi-process runs, serve, containers, manifests,
## Prometheus, traces, PostgreSQL 18 and the long property test; then the
## lease-timed tests alone (profile `timed`, .config/nextest.toml). Both
## run even when the first fails.
## (The client-only pgfleet first: the full one must be target/debug's last.)
test-all: postgres
	$(CARGO) build -p pgfleet-controller --no-default-features --bins --locked
	mkdir -p target/client && cp target/debug/pgfleet target/client/pgfleet
	$(CARGO) build --workspace --all-targets --locked
	status=0; \
	PGFLEET_FUZZ_CASES=$${PGFLEET_FUZZ_CASES:-300000} $(CARGO) nextest run --workspace --locked --no-fail-fast --profile all || status=1; \
	$(CARGO) nextest run --workspace --locked --no-fail-fast --profile timed || status=1; \
	exit $$status

## The slowest tests of the last `make test-all` (JUnit from nextest).
test-times:
	python3 .ci/test-times.py 15

build:
	$(CARGO) build --workspace --bins

release:
	$(CARGO) build --workspace --bins --release

## What CI checks besides the tests.
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	$(CARGO) clippy -p pgfleet-controller --no-default-features --lib --bins --locked -- -D warnings

## pgfleet vs pgbench on the same toast-slice points (see BENCHMARKS.md).
bench: release
	bash benches/toast-slice-vs-pgbench.sh

clean:
	rm -rf runs pgfleet-data
