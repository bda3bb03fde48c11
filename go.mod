module github.com/dsynclock/dsync

go 1.24.0

require (
	github.com/anishathalye/porcupine v1.3.1
	github.com/cenkalti/backoff/v4 v4.3.0
	github.com/go-sql-driver/mysql v1.10.1
	go.uber.org/goleak v1.3.0
	golang.org/x/sync v0.19.0
)

require filippo.io/edwards25519 v1.2.0 // indirect
