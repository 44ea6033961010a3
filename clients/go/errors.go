package anarchon

import (
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// ReasonKey is the response metadata key carrying a machine-readable reason.
const ReasonKey = "anarchon-reason"

// Sentinel errors for errors.Is. An *Error matches the sentinel of its kind.
var (
	ErrInvalidArgument  = errors.New("anarchon: invalid argument")
	ErrFenced           = errors.New("anarchon: fenced")
	ErrNoLeases         = errors.New("anarchon: the backend has no leases")
	ErrNotFound         = errors.New("anarchon: not found")
	ErrUnavailable      = errors.New("anarchon: unavailable")
	ErrDeadlineExceeded = errors.New("anarchon: deadline exceeded")
	ErrUnauthenticated  = errors.New("anarchon: unauthenticated")
	ErrPermissionDenied = errors.New("anarchon: permission denied")
	ErrExhausted        = errors.New("anarchon: resource exhausted")
	// ErrLeaseLost: a held run's lease was lost (see Hold).
	ErrLeaseLost = errors.New("anarchon: lease lost")
)

// Error is an error answered by the sidecar.
type Error struct {
	Code    codes.Code
	Reason  string // "fenced", "no_leases", the offending field, ... or ""
	Message string
}

func (e *Error) Error() string {
	if e.Reason != "" && !strings.HasPrefix(e.Message, e.Reason) {
		return fmt.Sprintf("anarchon: %s (%s): %s", e.Code, e.Reason, e.Message)
	}
	return fmt.Sprintf("anarchon: %s: %s", e.Code, e.Message)
}

// Is makes errors.Is(err, ErrFenced) and friends work.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrInvalidArgument:
		return e.Code == codes.InvalidArgument
	case ErrFenced:
		return e.Code == codes.FailedPrecondition && e.Reason == "fenced"
	case ErrNoLeases:
		return e.Code == codes.FailedPrecondition && e.Reason == "no_leases"
	case ErrNotFound:
		return e.Code == codes.NotFound
	case ErrUnavailable:
		return e.Code == codes.Unavailable
	case ErrDeadlineExceeded:
		return e.Code == codes.DeadlineExceeded
	case ErrUnauthenticated:
		return e.Code == codes.Unauthenticated
	case ErrPermissionDenied:
		return e.Code == codes.PermissionDenied
	case ErrExhausted:
		return e.Code == codes.ResourceExhausted
	}
	return false
}

// GRPCStatus lets status.FromError / status.Code see the original code.
func (e *Error) GRPCStatus() *status.Status { return status.New(e.Code, e.Message) }

// LeaseLostError is returned by Hold when the lease was lost while fn ran.
type LeaseLostError struct {
	Reason string // "fenced", "unavailable", "stream_broken", ...
	Cause  error  // fn's own error, if it returned one
}

func (e *LeaseLostError) Error() string {
	if e.Cause != nil {
		return fmt.Sprintf("anarchon: lease lost (%s); the work ended with: %v", e.Reason, e.Cause)
	}
	return fmt.Sprintf("anarchon: lease lost (%s)", e.Reason)
}

func (e *LeaseLostError) Is(target error) bool { return target == ErrLeaseLost }
func (e *LeaseLostError) Unwrap() error        { return e.Cause }

// Reason returns the machine-readable reason of an anarchon error, or "".
func Reason(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	var l *LeaseLostError
	if errors.As(err, &l) {
		return l.Reason
	}
	return ""
}

// fromRPC maps a gRPC error and its trailer to *Error.
func fromRPC(err error, trailer metadata.MD) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	e := &Error{Code: st.Code(), Message: st.Message()}
	if v := trailer.Get(ReasonKey); len(v) > 0 {
		e.Reason = v[0]
	} else if e.Code == codes.FailedPrecondition {
		// The reason is also the first word of the message.
		first := strings.TrimSpace(strings.SplitN(e.Message, ":", 2)[0])
		if first == "fenced" || first == "no_leases" {
			e.Reason = first
		}
	}
	return e
}
