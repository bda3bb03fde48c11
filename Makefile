# The README's two commands: make demo, make test.
GO ?= go

# The oldest Go release the module supports: the go line of go.mod. make
# test-oldest-go runs make test with it (the go command downloads that
# toolchain through the module proxy when it is not in the module cache).
OLDEST_GO ?= go1.24.13

.PHONY: demo test test-oldest-go bench mariadb check test-galera

mariadb:
	bash scripts/mariadb.sh install

demo: mariadb
	$(GO) run ./examples/workers

test: mariadb
	$(GO) vet ./...
	@unformatted=$$(gofmt -l .); if [ -n "$$unformatted" ]; then echo "gofmt: $$unformatted"; exit 1; fi
	$(GO) test -race -count=1 -timeout 10m ./...

test-oldest-go:
	$(MAKE) test GO='env GOTOOLCHAIN=$(OLDEST_GO) go'

bench: mariadb
	$(GO) test -run '^$$' -bench . -benchtime 2s -count 5 .

# The Galera tests (galera_test.go, build tag galera) against a throwaway
# 3-node cluster on 127.0.0.1 (scripts/galera.sh), in a directory of this
# run's own, stopped and removed however the tests end.
test-galera: mariadb
	$(GO) vet -tags galera ./...
	@DSYNC_GALERA_DIR=$$(mktemp -d "$${TMPDIR:-/tmp}/dsync-galera.XXXXXX") && export DSYNC_GALERA_DIR && \
	trap 'bash scripts/galera.sh stop' EXIT && trap 'exit 130' INT TERM && \
	bash scripts/galera.sh start && \
	$(GO) test -race -count=1 -tags galera -run 'Galera' -timeout 15m -v .
