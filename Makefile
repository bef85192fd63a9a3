# pg_stride: one entry point for building, testing and running.
#
#   make test      install what is missing, then run every test suite
#   make run       start a local PostgreSQL with pg_stride and run the demo
#   make stop      stop that server
#   make fuzz      random SQL (sqlsmith) against pg_stride for FUZZ_SECONDS (default 900)
#   make install   build (release) and install the extension into the system PostgreSQL 15

PG_CONFIG ?= /usr/lib/postgresql/15/bin/pg_config

.PHONY: setup build install test unit pgtest regress fuzz run stop clean

FUZZ_SECONDS ?= 900

setup:
	scripts/setup

build: setup
	cargo build --features pg15

install: setup
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
	regress/fuzz --duration $(FUZZ_SECONDS)

run: install
	scripts/demo

stop:
	scripts/demo --stop

clean:
	cargo clean
	rm -rf tmp
