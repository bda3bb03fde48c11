# The README's two commands: make demo, make test.
#
# make test runs go test -json through internal/cmd/testlog, which prints a
# line per top-level test as it ends and per package, the whole output of
# what failed, and the tests still running after 30s without a line; it
# exits non-zero when go test does or when anything failed.
GO ?= go

# The oldest Go release the module supports: the go line of go.mod. make
# test-oldest-go runs make test with it (the go command downloads that
# toolchain through the module proxy when it is not in the module cache),
# with -short, which leaves out the slowest tests (slowTest in
# mutex_test.go: those of a second or more, about five minutes of
# waiting): make test, with the current Go, has run them.
OLDEST_GO ?= go1.24.13

.PHONY: demo test test-oldest-go build-oldest-go bench bench-peers redis-server mariadb check test-galera test-galera-running torture torture-galera mutants verification

mariadb:
	bash scripts/mariadb.sh install

demo: mariadb
	$(GO) run ./examples/workers

test: mariadb
	$(GO) vet ./...
	@unformatted=$$(gofmt -l .); if [ -n "$$unformatted" ]; then echo "gofmt: $$unformatted"; exit 1; fi
	$(GO) run ./internal/cmd/testlog $(GO) test -json -race -count=1 -timeout 10m $(TESTFLAGS) ./...

test-oldest-go:
	$(MAKE) test GO='env GOTOOLCHAIN=$(OLDEST_GO) go' TESTFLAGS=-short

# What CI checks with the oldest Go: go vet, and every package and test
# built (a -run pattern that no test name matches runs none).
build-oldest-go:
	$(MAKE) test GO='env GOTOOLCHAIN=$(OLDEST_GO) go' TESTFLAGS='-run ^NoTest_'

# The linearizability checker with its nemesis (internal/torture; make test
# runs it for 20s): client processes under faults for DURATION, with SEED
# (0: from the clock), on a throwaway server of its own. A failure prints
# the seed, the nemesis's schedule and the smallest illegal sub-history,
# and writes the whole history to a file; TORTURE_FLAGS adds flags, e.g.
# '-torture.out=DIR' (keep the history), '-torture.nemesis=stop,kill',
# '-torture.summary=FILE' (a JSON summary for make verification),
# '-torture.dsn-tz=+05:00' (every other client's DSN in another time_zone).
# NEMESIS is its faults: every one, the server's clock stepped with
# libfaketime (clock) included; the 20 s run of make test leaves clock out
# (the flag's default).
DURATION ?= 10m
SEED ?= 0
NEMESIS ?= stop,kill,killconn,latency,cut,drop,server,clock
torture: mariadb
	$(GO) test -race -count=1 -timeout 0 -run '^TestTorture$$' -v ./internal/torture/ \
		-torture.duration=$(DURATION) -torture.seed=$(SEED) -torture.nemesis=$(NEMESIS) $(TORTURE_FLAGS)

# The same on a throwaway 3-node Galera cluster (scripts/galera.sh, in a
# directory of this run's own, stopped and removed however the run ends):
# client process p talks to node p % 3 through its own fault proxy, LockTx
# is left out (Galera does not support it), and besides the client faults
# the nemesis SIGKILLs a node and restarts it, or cuts one node off the
# group communication (gmcast.isolate), one node at a time. Not part of
# make test or make test-galera.
torture-galera: mariadb
	$(GO) vet -tags galera ./internal/torture/
	@DSYNC_GALERA_DIR=$$(mktemp -d "$${TMPDIR:-/tmp}/dsync-galera.XXXXXX") && export DSYNC_GALERA_DIR && \
	trap 'bash scripts/galera.sh stop' EXIT && trap 'exit 130' INT TERM && \
	bash scripts/galera.sh start && \
	$(GO) test -race -count=1 -tags galera -timeout 0 -run '^TestTortureGalera$$' -v ./internal/torture/ \
		-torture.duration=$(DURATION) -torture.seed=$(SEED) $(TORTURE_FLAGS)

# The checker's power: each mutant of internal/torture/mutants (one defect
# fixed earlier, re-introduced in a temporary copy of the tree) under a
# torture run of DURATION (default 2m here) with SEED (default 3);
# SUMMARY_DIR=docs/verification keeps each run's summary for make
# verification.
mutants: mariadb
	DURATION=$(if $(filter command line environment,$(origin DURATION)),$(DURATION),2m) \
		SEED=$(if $(filter command line environment,$(origin SEED)),$(SEED),3) GO='$(GO)' bash scripts/mutants.sh

# docs/VERIFICATION.md from the hand-written text of
# docs/verification/VERIFICATION.md.tmpl and the runs' summaries,
# docs/verification/*.json (written by -torture.summary=FILE, and by make
# mutants with SUMMARY_DIR=docs/verification).
verification:
	$(GO) run ./internal/cmd/verification -dir docs/verification \
		-template docs/verification/VERIFICATION.md.tmpl -out docs/VERIFICATION.md

bench: mariadb
	$(GO) test -run '^$$' -bench . -benchtime 2s -count 5 .

# dsync against its peers (bench/, a module of its own): starts a throwaway
# MariaDB, two redis-servers and an embedded etcd on 127.0.0.1, runs every
# scenario and writes docs/BENCHMARKS.md and docs/benchmarks.svg. Extra
# flags in BENCH_FLAGS, e.g. make bench-peers BENCH_FLAGS='-quick'.
bench-peers: mariadb redis-server
	cd bench && $(GO) run . -out ../docs \
		-command "make bench-peers$(if $(BENCH_FLAGS), BENCH_FLAGS='$(BENCH_FLAGS)')" $(BENCH_FLAGS)

# Debian's redis-server package, for bench-peers; no service is started.
redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
		sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
		echo "installing redis-server from Debian's packages" >&2; \
		$$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends redis-server >/dev/null; }

# The Galera tests (galera_test.go, build tag galera) against a throwaway
# 3-node cluster on 127.0.0.1 (scripts/galera.sh), in a directory of this
# run's own, stopped and removed however the tests end.
test-galera: mariadb
	@DSYNC_GALERA_DIR=$$(mktemp -d "$${TMPDIR:-/tmp}/dsync-galera.XXXXXX") && export DSYNC_GALERA_DIR && \
	trap 'bash scripts/galera.sh stop' EXIT && trap 'exit 130' INT TERM && \
	bash scripts/galera.sh start && \
	$(MAKE) test-galera-running

# The Galera tests against the cluster scripts/galera.sh started in
# $DSYNC_GALERA_DIR (which it leaves running); .ci/run starts the cluster
# beside the oldest-Go run and then runs these.
test-galera-running: mariadb
	$(GO) vet -tags galera ./...
	bash scripts/galera.sh status >/dev/null
	$(GO) test -race -count=1 -tags galera -run 'Galera' -timeout 15m -v .
