module github.com/anarchon/anarchon/clients/go

go 1.19

// The versions the client is tested with (Debian bookworm's packages, built in
// GOPATH mode by clients/test.sh). Module users: run `go mod tidy` to resolve
// the indirect requirements and write go.sum.
require (
	google.golang.org/grpc v1.33.3
	google.golang.org/protobuf v1.28.1
)
