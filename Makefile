# The README's two commands: `make run` (quickstart) and `make test` (what .ci/run runs).
CARGO ?= cargo

.PHONY: run test build release lint bench clean

## Quickstart: build (release) and run scenarios/quickstart.yaml (~2 minutes).
run: release
	./target/release/pgfleet run scenarios/quickstart.yaml --out runs/quickstart

## Tests: unit tests, real-PostgreSQL tests and end-to-end runs, under nextest.
test:
	$(CARGO) build --workspace --bins --locked
	$(CARGO) nextest run --workspace --locked --no-fail-fast

build:
	$(CARGO) build --workspace --bins

release:
	$(CARGO) build --workspace --bins --release

## What CI checks besides the tests.
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

## pgfleet vs pgbench on the same toast-slice points (see BENCHMARKS.md).
bench: release
	bash benches/toast-slice-vs-pgbench.sh

clean:
	rm -rf runs pgfleet-data
