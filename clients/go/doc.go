// Package anarchon is a client for the anarchon sidecar: it tells a fleet who
// owns a (job, slot) and who is alive.
//
//	c, err := anarchon.Dial("127.0.0.1:50051")
//	...
//	won, err := c.Hold(ctx, "nightly-report", slotMs, func(ctx context.Context) error {
//		return build(ctx, anarchon.HeldFrom(ctx).Claim().Fencing) // ctx ends if the lease is lost
//	})
//
// Contention is an outcome (Claim.Outcome), never an error. Errors are
// *Error values carrying the gRPC code and the sidecar's machine-readable
// reason (the "anarchon-reason" metadata key); test them with errors.Is
// against ErrFenced, ErrNoLeases, ErrNotFound, ErrInvalidArgument, ... and
// ErrLeaseLost.
//
// The generated stubs are in the anarchonv1 subpackage.
package anarchon
