# pg_stride: one entry point for building, testing and running.
#
#   make test      install what is missing, then run every test suite
#   make run       start a local PostgreSQL with pg_stride and run the demo
#   make stop      stop that server
#   make fuzz      random SQL (sqlsmith) against pg_stride for FUZZ_SECONDS (default 900),
#                  FUZZ_PARALLEL_MODE=pool to run the parallel plans in pool workers
#   make install   build (release) and install the extension; installs only what building
#                  needs (scripts/setup --build), no test tools
#   make build     build (debug) for one major
#   make lint      module layers, SQLSTATEs and clippy for one major
#
# PG=15 (default), 17 or 18 picks the PostgreSQL major: 15 is Debian 12's, 17 and 18 are
# built from Debian's source packages on first use (scripts/build-postgres). PG_CONFIG=
# /path/to/pg_config instead targets any installed server, e.g. for `make install`.

SHELL := /bin/bash
PG ?= 15
export PG PG_CONFIG

.PHONY: setup setup-build build lint install test unit pgtest regress fuzz run stop clean

FUZZ_SECONDS ?= 900
FUZZ_PARALLEL_MODE ?= native

setup:
	scripts/setup

setup-build:
	scripts/setup --build

build: setup-build
	. scripts/pg-env && cargo build --no-default-features --features pg$$PG_MAJOR

lint: setup-build
	scripts/lint

install: setup-build
	PGRX_INSTALL_FLAGS=--release scripts/install-extension

unit: setup
	cargo test -p pg_stride_sched

pgtest: setup
	scripts/pgrx-test

# Tests run a debug build: its assertions are part of the tests.
regress: setup
	scripts/install-extension
	regress/run

test: setup
	scripts/test

fuzz: setup
	scripts/install-extension
	regress/fuzz --duration $(FUZZ_SECONDS) --parallel-mode $(FUZZ_PARALLEL_MODE)

run: setup install
	scripts/demo

stop:
	scripts/demo --stop

clean:
	cargo clean
	rm -rf tmp
