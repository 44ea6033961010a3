package anarchon_test

// Tests against real sidecars started by clients/test.sh:
//   ANARCHON_A, ANARCHON_B   two sidecars sharing one SQLite file, linked as peers
//   ANARCHON_A_PID           A's process id (the lost-lease tests pause it)
//   ANARCHON_C, ANARCHON_C_TOKEN   a sidecar that requires this bearer token
//   ANARCHON_C_UNIX                C's --listen-unix socket, as unix:PATH

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	anarchon "github.com/anarchon/anarchon/clients/go"
)

func env(t *testing.T, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set: run the tests through clients/test.sh", name)
	}
	return v
}

func dial(t *testing.T, name string, opts ...anarchon.Option) *anarchon.Client {
	t.Helper()
	c, err := anarchon.Dial(env(t, name), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func jobName(t *testing.T) string {
	var b [4]byte
	rand.Read(b[:])
	name := strings.ToLower(strings.ReplaceAll(t.Name(), "_", "-"))
	if len(name) > 40 {
		name = name[:40]
	}
	return "go-" + name + "-" + hex.EncodeToString(b[:])
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func nowMs() int64 { return time.Now().UnixMilli() }

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func claim(t *testing.T, c *anarchon.Client, job string, slot int64, opts ...anarchon.ClaimOption) *anarchon.Claim {
	t.Helper()
	r, err := c.Claim(ctx(t), job, slot, opts...)
	must(t, err)
	return r
}

func TestClaimWonHasEveryField(t *testing.T) {
	a, job, slot := dial(t, "ANARCHON_A"), jobName(t), nowMs()
	c := claim(t, a, job, slot)
	if !c.Won() || c.Outcome != anarchon.Won || len(c.Token) != 32 || c.Attempt != 1 || c.Fencing < 1 {
		t.Fatalf("%+v", c)
	}
	if c.LeaseUntilMs <= c.NowMs || c.ValidFor <= 0 || c.ValidFor > 30*time.Second || c.Backend != "sqlite" {
		t.Fatalf("%+v", c)
	}
	if c.Holder == nil || c.Holder.Node == "" || c.Job != job || c.SlotMs != slot || time.Until(c.Deadline) <= 0 {
		t.Fatalf("%+v", c)
	}
}

func TestContentionIsAnOutcome(t *testing.T) {
	a, b, job := dial(t, "ANARCHON_A"), dial(t, "ANARCHON_B"), jobName(t)
	first := claim(t, a, job, 0)
	second := claim(t, b, job, 0)
	if !first.Won() || second.Outcome != anarchon.Running || second.Token != "" || *second.Holder != *first.Holder {
		t.Fatalf("%+v / %+v", first, second)
	}
}

func TestResendSameToken(t *testing.T) {
	a, job := dial(t, "ANARCHON_A"), jobName(t)
	first := claim(t, a, job, 0)
	again := claim(t, a, job, 0, anarchon.WithClaimToken(first.Token))
	if !again.Won() || again.Token != first.Token || again.Attempt != first.Attempt {
		t.Fatalf("%+v", again)
	}
}

func TestLateAndOverlap(t *testing.T) {
	a, job := dial(t, "ANARCHON_A"), jobName(t)
	if c := claim(t, a, job, 1000, anarchon.WithMaxLate(time.Second)); c.Outcome != anarchon.Late || c.Reason != "too_late" {
		t.Fatalf("%+v", c)
	}
	if c := claim(t, a, job, nowMs(), anarchon.WithOverlapAllow(), anarchon.WithMaxAttempts(2)); !c.Won() {
		t.Fatalf("%+v", c)
	}
	if c := claim(t, a, job, nowMs()+1, anarchon.WithOverlapSkip()); c.Outcome != anarchon.Overlap {
		t.Fatalf("%+v", c)
	}
}

func TestInvalidJobNamesTheField(t *testing.T) {
	a := dial(t, "ANARCHON_A")
	_, err := a.Claim(ctx(t), "bad job!", 0)
	var e *anarchon.Error
	if !errors.Is(err, anarchon.ErrInvalidArgument) || !errors.As(err, &e) || e.Reason != "job" || e.Code != codes.InvalidArgument {
		t.Fatalf("%v", err)
	}
}

func TestRenew(t *testing.T) {
	a, job := dial(t, "ANARCHON_A"), jobName(t)
	c := claim(t, a, job, 0, anarchon.WithLease(2*time.Second))
	r, err := a.Renew(ctx(t), job, 0, c.Token, 5*time.Second)
	must(t, err)
	if r.Attempt != 1 || r.Fencing != c.Fencing || r.LeaseUntilMs <= c.LeaseUntilMs || r.ValidFor <= 4*time.Second {
		t.Fatalf("%+v", r)
	}
}

func TestRenewAfterReleaseIsFenced(t *testing.T) {
	a, job, slot := dial(t, "ANARCHON_A"), jobName(t), nowMs()
	c := claim(t, a, job, slot)
	must(t, a.Release(ctx(t), job, slot, c.Token, true))
	_, err := a.Renew(ctx(t), job, slot, c.Token, 0)
	if !errors.Is(err, anarchon.ErrFenced) || anarchon.Reason(err) != "fenced" {
		t.Fatalf("%v", err)
	}
}

func TestRenewUnknownRunIsNotFound(t *testing.T) {
	a := dial(t, "ANARCHON_A")
	_, err := a.Renew(ctx(t), jobName(t), 12345, strings.Repeat("0", 32), 0)
	if !errors.Is(err, anarchon.ErrNotFound) {
		t.Fatalf("%v", err)
	}
}

func TestReleaseSucceededThenDone(t *testing.T) {
	a, b, job, slot := dial(t, "ANARCHON_A"), dial(t, "ANARCHON_B"), jobName(t), nowMs()
	c := claim(t, a, job, slot)
	must(t, a.Release(ctx(t), job, slot, c.Token, true))
	must(t, a.Release(ctx(t), job, slot, c.Token, true)) // idempotent
	if d := claim(t, b, job, slot); d.Outcome != anarchon.Done || d.Reason != "succeeded" {
		t.Fatalf("%+v", d)
	}
}

func TestReleaseFailedAndHistory(t *testing.T) {
	a, job, base := dial(t, "ANARCHON_A"), jobName(t), nowMs()
	for i := int64(0); i < 3; i++ {
		c := claim(t, a, job, base+i)
		must(t, a.Release(ctx(t), job, base+i, c.Token, i != 2))
	}
	runs, err := a.History(ctx(t), job, 2, nil)
	must(t, err)
	if len(runs) != 2 || runs[0].SlotMs != base+2 || runs[0].State != "FAILED" || runs[1].State != "SUCCEEDED" {
		t.Fatalf("%+v", runs)
	}
	before := base + 1
	older, err := a.History(ctx(t), job, 0, &before)
	must(t, err)
	if len(older) != 1 || older[0].SlotMs != base {
		t.Fatalf("%+v", older)
	}
}

func TestReleaseWrongTokenIsFenced(t *testing.T) {
	a, job := dial(t, "ANARCHON_A"), jobName(t)
	claim(t, a, job, 0)
	if err := a.Release(ctx(t), job, 0, strings.Repeat("f", 32), true); !errors.Is(err, anarchon.ErrFenced) {
		t.Fatalf("%v", err)
	}
}

func TestClaimWaits(t *testing.T) {
	a, b, job := dial(t, "ANARCHON_A"), dial(t, "ANARCHON_B"), jobName(t)
	c := claim(t, a, job, 0)
	go func() {
		time.Sleep(300 * time.Millisecond)
		a.Release(context.Background(), job, 0, c.Token, true)
	}()
	start := time.Now()
	w := claim(t, b, job, 0, anarchon.WithWait(5*time.Second))
	if el := time.Since(start); !w.Won() || el < 200*time.Millisecond || el > 4*time.Second {
		t.Fatalf("%+v after %v", w, el)
	}
}

func TestHoldSuccess(t *testing.T) {
	a, b, job, slot := dial(t, "ANARCHON_A"), dial(t, "ANARCHON_B"), jobName(t), nowMs()
	var renewals int
	won, err := a.Hold(ctx(t), job, slot, func(ctx context.Context) error {
		h := anarchon.HeldFrom(ctx)
		if h == nil || h.Claim().Attempt != 1 || len(h.Claim().Token) != 32 {
			t.Errorf("held: %+v", h)
		}
		time.Sleep(900 * time.Millisecond) // > lease: only renewals keep it
		if c := claim(t, b, job, slot); c.Outcome != anarchon.Running {
			t.Errorf("during hold: %+v", c)
		}
		renewals = h.Renewals()
		return ctx.Err()
	}, anarchon.WithLease(600*time.Millisecond))
	if !won || err != nil || renewals < 2 {
		t.Fatalf("won=%v err=%v renewals=%d", won, err, renewals)
	}
	runs, err := a.History(ctx(t), job, 1, nil)
	must(t, err)
	if runs[0].State != "SUCCEEDED" {
		t.Fatalf("%+v", runs)
	}
}

func TestHoldFailure(t *testing.T) {
	a, job, slot := dial(t, "ANARCHON_A"), jobName(t), nowMs()
	boom := errors.New("boom")
	won, err := a.Hold(ctx(t), job, slot, func(ctx context.Context) error { return boom })
	if !won || err != boom {
		t.Fatalf("won=%v err=%v", won, err)
	}
	runs, err := a.History(ctx(t), job, 1, nil)
	must(t, err)
	if runs[0].State != "FAILED" {
		t.Fatalf("%+v", runs)
	}
}

func TestHoldNotWon(t *testing.T) {
	a, b, job := dial(t, "ANARCHON_A"), dial(t, "ANARCHON_B"), jobName(t)
	claim(t, a, job, 0)
	called := false
	won, err := b.Hold(ctx(t), job, 0, func(context.Context) error { called = true; return nil })
	if won || err != nil || called {
		t.Fatalf("won=%v err=%v called=%v", won, err, called)
	}
}

func TestHoldCancelledEndsTheLease(t *testing.T) {
	a, b, job := dial(t, "ANARCHON_A"), dial(t, "ANARCHON_B"), jobName(t)
	hctx, cancel := context.WithCancel(context.Background())
	won, err := a.Hold(hctx, job, 0, func(ctx context.Context) error {
		cancel() // the caller gives up: the stream ends without a release
		<-ctx.Done()
		return ctx.Err()
	}, anarchon.WithLease(30*time.Second))
	if !won || !errors.Is(err, anarchon.ErrLeaseLost) {
		t.Fatalf("won=%v err=%v", won, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		c := claim(t, b, job, 0)
		if c.Won() {
			if c.Attempt != 2 {
				t.Fatalf("%+v", c)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("never taken over: %+v", c)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestHoldLostLease pauses sidecar A (SIGSTOP) right after a renewal, so the
// 600 ms lease lapses; B takes the run over (attempt 2); once A resumes its
// next renewal is fenced and LOST_LEASE cancels fn's context.
func TestHoldLostLease(t *testing.T) {
	a, b, job := dial(t, "ANARCHON_A"), dial(t, "ANARCHON_B"), jobName(t)
	pid, err := strconv.Atoi(env(t, "ANARCHON_A_PID"))
	must(t, err)
	var taken *anarchon.Claim
	won, err := a.Hold(ctx(t), job, 0, func(ctx context.Context) error {
		h := anarchon.HeldFrom(ctx)
		for h.Renewals() == 0 {
			time.Sleep(5 * time.Millisecond)
		}
		must(t, syscall.Kill(pid, syscall.SIGSTOP))
		func() {
			defer syscall.Kill(pid, syscall.SIGCONT)
			time.Sleep(time.Second)
			taken = claim(t, b, job, 0)
		}()
		select {
		case <-ctx.Done():
			if h.LostReason() != "fenced" {
				t.Errorf("lost reason %q", h.LostReason())
			}
			return ctx.Err()
		case <-time.After(5 * time.Second):
			return errors.New("the lease loss never cancelled fn's context")
		}
	}, anarchon.WithLease(600*time.Millisecond))
	var lost *anarchon.LeaseLostError
	if !won || !errors.As(err, &lost) || lost.Reason != "fenced" || !errors.Is(err, context.Canceled) {
		t.Fatalf("won=%v err=%v", won, err)
	}
	if taken == nil || !taken.Won() || taken.Attempt != 2 {
		t.Fatalf("takeover: %+v", taken)
	}
}

func TestPeers(t *testing.T) {
	a, b := dial(t, "ANARCHON_A"), dial(t, "ANARCHON_B")
	pa, err := a.Peers(ctx(t))
	must(t, err)
	pb, err := b.Peers(ctx(t))
	must(t, err)
	if pa.Self.Node == "" || pa.Self.State != "ALIVE" || pa.Self.Node == pb.Self.Node {
		t.Fatalf("%+v %+v", pa.Self, pb.Self)
	}
	found := false
	for _, p := range pa.Peers {
		if p.Node == pb.Self.Node && p.State == "ALIVE" && p.Instance == pb.Self.Instance {
			found = true
		}
	}
	if !found {
		t.Fatalf("%+v", pa.Peers)
	}
}

func TestWatchPeers(t *testing.T) {
	a, b := dial(t, "ANARCHON_A"), dial(t, "ANARCHON_B")
	other, err := b.Peers(ctx(t))
	must(t, err)
	wctx, cancel := context.WithCancel(ctx(t))
	ch, err := a.WatchPeers(wctx)
	must(t, err)
	for ev := range ch {
		if ev.Err != nil || ev.Kind != "SNAPSHOT" {
			t.Fatalf("%+v", ev)
		}
		if ev.Peer.Node == other.Self.Node {
			break
		}
	}
	cancel()
	for range ch { // drains, then closes
	}
}

// C requires a token, over TCP and over its Unix socket (--listen-unix,
// "unix:PATH", which grpc-go dials as it is).
func TestBearerToken(t *testing.T) {
	for _, name := range []string{"ANARCHON_C", "ANARCHON_C_UNIX"} {
		t.Run(name, func(t *testing.T) {
			good := dial(t, name, anarchon.WithToken(env(t, "ANARCHON_C_TOKEN")))
			if c := claim(t, good, "go-auth-"+name, nowMs()); !c.Won() {
				t.Fatalf("%+v", c)
			}
			bad := dial(t, name)
			if _, err := bad.Claim(ctx(t), "go-auth-"+name, 0); !errors.Is(err, anarchon.ErrUnauthenticated) {
				t.Fatalf("%v", err)
			}
		})
	}
}

func TestOptionsAndSlotOf(t *testing.T) {
	c := dial(t, "ANARCHON_A", anarchon.WithDialOptions(grpc.WithUserAgent("anarchon-go-test")))
	if got := anarchon.SlotOf(time.UnixMilli(1796000000000)); got != 1796000000000 {
		t.Fatal(got)
	}
	wctx, cancel := context.WithCancel(ctx(t))
	defer cancel()
	ch, err := c.WatchPeers(wctx, anarchon.IncludeExpired())
	must(t, err)
	if ev := <-ch; ev.Err != nil || ev.Kind != "SNAPSHOT" {
		t.Fatalf("%+v", ev)
	}
}
