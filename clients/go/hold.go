package anarchon

import (
	"context"
	"sync"
	"time"

	pb "github.com/anarchon/anarchon/clients/go/anarchonv1"
)

// Held is the live state of a run held by Hold. Get it inside fn with
// HeldFrom(ctx).
type Held struct {
	mu       sync.Mutex
	claim    Claim
	renewals int
	lost     string
	released bool
}

// Claim is the claim as of now (lease fields follow the renewals).
func (h *Held) Claim() Claim {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.claim
}

// Renewals counts the lease renewals so far.
func (h *Held) Renewals() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.renewals
}

// LostReason is "" while the lease is held, else why it was lost.
func (h *Held) LostReason() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lost
}

type heldKey struct{}

// HeldFrom returns the run held by the Hold whose fn received ctx, or nil.
func HeldFrom(ctx context.Context) *Held {
	h, _ := ctx.Value(heldKey{}).(*Held)
	return h
}

// releaseTimeout bounds the Release that Hold sends after fn returns.
const releaseTimeout = 10 * time.Second

// Hold claims (job, slotMs) on the sidecar's Hold stream and, if won, runs fn
// while the sidecar renews the lease every lease/3.
//
//   - Not won: fn is not called; Hold returns (false, nil). Use Claim to learn
//     the outcome.
//   - fn returns nil: the run is released SUCCEEDED; (true, nil).
//   - fn returns an error: the run is released FAILED; (true, that error).
//   - The lease is lost (LOST_LEASE from the sidecar, or the stream to it
//     broke): fn's ctx is cancelled at once, nothing is released, and Hold
//     returns (true, *LeaseLostError) — errors.Is(err, ErrLeaseLost) — with
//     fn's own error as its Cause. The work must not be published.
//
// fn's ctx carries the held run: HeldFrom(ctx).Claim().Fencing is the number
// to pass to the resource being protected. Cancelling the outer ctx ends the
// stream without a release, which ends the lease at once (the sidecar treats
// it as a dead worker): Hold then returns a *LeaseLostError with reason
// "cancelled" that also matches ctx's error.
func (c *Client) Hold(ctx context.Context, job string, slotMs int64, fn func(ctx context.Context) error, opts ...ClaimOption) (bool, error) {
	req := claimRequest(job, slotMs, opts)
	streamCtx, closeStream := context.WithCancel(ctx)
	defer closeStream()
	sent := time.Now()
	stream, err := c.claims.Hold(c.ctx(streamCtx), req)
	if err != nil {
		return false, fromRPC(err, nil)
	}
	first, err := stream.Recv()
	if err != nil {
		return false, fromRPC(err, stream.Trailer())
	}
	if first.Kind != pb.HoldEventKind_HOLD_EVENT_KIND_CLAIMED || first.Claim == nil {
		return false, &Error{Message: "unexpected first Hold event " + first.Kind.String()}
	}
	claim := claimOf(job, slotMs, first.Claim, sent)
	if !claim.Won() {
		return false, nil
	}
	held := &Held{claim: *claim}
	inner, cancelInner := context.WithCancel(context.WithValue(ctx, heldKey{}, held))
	defer cancelInner()

	var closing sync.Once
	closed := make(chan struct{})
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		lose := func(reason string) {
			held.mu.Lock()
			if held.lost == "" && !held.released {
				held.lost = reason
			}
			held.mu.Unlock()
			cancelInner()
		}
		for {
			ev, err := stream.Recv()
			if err != nil {
				select {
				case <-closed: // we closed it
				default:
					held.mu.Lock()
					released := held.released
					held.mu.Unlock()
					if !released {
						lose("stream_broken")
					}
				}
				return
			}
			switch ev.Kind {
			case pb.HoldEventKind_HOLD_EVENT_KIND_RENEWED:
				held.mu.Lock()
				held.renewals++
				held.claim.LeaseUntilMs = ev.LeaseUntilMs
				held.claim.ValidFor = time.Duration(ev.ValidForMs) * time.Millisecond
				if ev.HoldValidForMs > 0 {
					// Counted from the send of the Hold request: safe even for
					// an event that sat in a buffer while we were paused.
					held.claim.Deadline = sent.Add(time.Duration(ev.HoldValidForMs) * time.Millisecond)
				} else {
					held.claim.Deadline = time.Now().Add(held.claim.ValidFor)
				}
				held.mu.Unlock()
			case pb.HoldEventKind_HOLD_EVENT_KIND_LOST_LEASE:
				reason := ev.Reason
				if reason == "" {
					reason = "lost"
				}
				lose(reason)
				return
			case pb.HoldEventKind_HOLD_EVENT_KIND_RELEASED:
				held.mu.Lock()
				held.released = true
				held.mu.Unlock()
				return
			}
		}
	}()
	finish := func() {
		closing.Do(func() { close(closed) })
		closeStream()
		<-readerDone
	}

	workErr := fn(inner)

	if ctx.Err() != nil {
		// The caller gave up: no release; closing the stream ends the lease at
		// once and the run goes to the next claimer.
		finish()
		return true, &LeaseLostError{Reason: "cancelled", Cause: firstErr(workErr, ctx.Err())}
	}
	held.mu.Lock()
	lost, released := held.lost, held.released
	held.mu.Unlock()
	if lost != "" {
		finish()
		return true, &LeaseLostError{Reason: lost, Cause: workErr}
	}
	if !released {
		// A fresh context: fn may have left its own ctx in any state.
		rctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		rerr := c.Release(rctx, job, slotMs, claim.Token, workErr == nil)
		cancel()
		if rerr != nil && workErr == nil {
			finish()
			if Reason(rerr) == "fenced" {
				return true, &LeaseLostError{Reason: "fenced"}
			}
			return true, rerr
		}
	}
	finish()
	return true, workErr
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}
