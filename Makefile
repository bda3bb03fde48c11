# The README's two commands: make demo, make test.
GO ?= go

.PHONY: demo test bench mariadb check

mariadb:
	bash scripts/mariadb.sh install

demo: mariadb
	$(GO) run ./examples/workers

test: mariadb
	$(GO) vet ./...
	@unformatted=$$(gofmt -l .); if [ -n "$$unformatted" ]; then echo "gofmt: $$unformatted"; exit 1; fi
	$(GO) test -race -count=1 -timeout 10m ./...

bench: mariadb
	$(GO) test -run '^$$' -bench . -benchtime 2s -count 5 .
