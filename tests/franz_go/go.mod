// franz-go's own integration tests (pkg/kgo, the ones its CI runs against Kafka and
// Redpanda) built against the brokers' Kafka listeners: scripts/setup.sh compiles them
// with `go test -c` from the Go module proxy; tests/test_franz_go.py runs the allow-list.
module strata.local/franzgo

go 1.26.0

require github.com/twmb/franz-go v1.22.3

require (
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	github.com/twmb/franz-go/pkg/kmsg v1.15.1 // indirect
)
