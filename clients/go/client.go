package anarchon

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	pb "github.com/anarchon/anarchon/clients/go/anarchonv1"
)

// DefaultTarget is the sidecar's default gRPC address.
const DefaultTarget = "127.0.0.1:50051"

// Client talks to one sidecar. It is safe for concurrent use.
type Client struct {
	conn   *grpc.ClientConn
	claims pb.ClaimsClient
	mesh   pb.MeshClient
	token  string
}

type options struct {
	token string
	creds credentials.TransportCredentials
	dial  []grpc.DialOption
}

// Option configures Dial.
type Option func(*options)

// WithToken sends "authorization: Bearer <token>" on every call (for a
// sidecar started with --auth-token-file).
func WithToken(token string) Option { return func(o *options) { o.token = token } }

// WithTLS connects over TLS with these credentials (e.g.
// credentials.NewClientTLSFromFile(ca, "")). Without it the connection is
// plaintext, which suits a sidecar on loopback.
func WithTLS(creds credentials.TransportCredentials) Option {
	return func(o *options) { o.creds = creds }
}

// WithDialOptions adds raw grpc.DialOptions.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dial = append(o.dial, opts...) }
}

// Dial connects to a sidecar (lazily: the first call establishes the
// connection). target is "host:port", e.g. DefaultTarget.
func Dial(target string, opts ...Option) (*Client, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	dial := []grpc.DialOption{}
	if o.creds != nil {
		dial = append(dial, grpc.WithTransportCredentials(o.creds))
	} else {
		dial = append(dial, grpc.WithInsecure())
	}
	dial = append(dial, o.dial...)
	conn, err := grpc.Dial(target, dial...)
	if err != nil {
		return nil, err
	}
	return &Client{conn: conn, claims: pb.NewClaimsClient(conn), mesh: pb.NewMeshClient(conn), token: o.token}, nil
}

// Close closes the connection; open Holds lose their stream (and with it
// their lease).
func (c *Client) Close() error { return c.conn.Close() }

// Conn is the underlying connection, for the generated stubs in anarchonv1.
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

func (c *Client) ctx(ctx context.Context) context.Context {
	if c.token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.token)
}

// ClaimOption sets an optional field of a claim (Claim and Hold).
type ClaimOption func(*pb.ClaimRequest)

// WithLease asks for this lease length (0 = the sidecar's default).
func WithLease(d time.Duration) ClaimOption {
	return func(r *pb.ClaimRequest) { r.LeaseMs = d.Milliseconds() }
}

// WithMaxLate sets how late after the slot a run may still be started.
func WithMaxLate(d time.Duration) ClaimOption {
	return func(r *pb.ClaimRequest) { r.MaxLateMs = d.Milliseconds() }
}

// WithOverlapSkip: do not start a run while another run of the job is running.
func WithOverlapSkip() ClaimOption {
	return func(r *pb.ClaimRequest) { r.Overlap = pb.Overlap_OVERLAP_SKIP }
}

// WithOverlapAllow: runs of different slots may overlap.
func WithOverlapAllow() ClaimOption {
	return func(r *pb.ClaimRequest) { r.Overlap = pb.Overlap_OVERLAP_ALLOW }
}

// WithMaxAttempts sets the attempts allowed before the run is INTERRUPTED.
func WithMaxAttempts(n uint32) ClaimOption {
	return func(r *pb.ClaimRequest) { r.MaxAttempts = n }
}

// WithWait blocks (lease backends) until the run can be won or d has passed.
func WithWait(d time.Duration) ClaimOption {
	return func(r *pb.ClaimRequest) { r.WaitMs = d.Milliseconds() }
}

// WithClaimToken resends a claim with this token (32 hex) whose answer was lost.
func WithClaimToken(token string) ClaimOption {
	return func(r *pb.ClaimRequest) { r.Token = token }
}

func claimRequest(job string, slotMs int64, opts []ClaimOption) *pb.ClaimRequest {
	req := &pb.ClaimRequest{Job: job, SlotMs: slotMs}
	for _, o := range opts {
		o(req)
	}
	return req
}

// SlotOf converts a time to a slot (epoch milliseconds).
func SlotOf(t time.Time) int64 { return t.UnixMilli() }

// Claim asks who owns (job, slotMs). Slot 0 is a lock not tied to time.
func (c *Client) Claim(ctx context.Context, job string, slotMs int64, opts ...ClaimOption) (*Claim, error) {
	req := claimRequest(job, slotMs, opts)
	var trailer metadata.MD
	sent := time.Now()
	r, err := c.claims.Claim(c.ctx(ctx), req, grpc.Trailer(&trailer))
	if err != nil {
		return nil, fromRPC(err, trailer)
	}
	return claimOf(job, slotMs, r, sent), nil
}

// Renew extends the lease of a run the caller holds (lease 0 = default).
// errors.Is(err, ErrFenced) when the token no longer holds the run.
func (c *Client) Renew(ctx context.Context, job string, slotMs int64, token string, lease time.Duration) (*Renewal, error) {
	var trailer metadata.MD
	sent := time.Now()
	r, err := c.claims.Renew(c.ctx(ctx), &pb.RenewRequest{
		Job: job, SlotMs: slotMs, Token: token, LeaseMs: lease.Milliseconds(),
	}, grpc.Trailer(&trailer))
	if err != nil {
		return nil, fromRPC(err, trailer)
	}
	valid := time.Duration(r.ValidForMs) * time.Millisecond
	return &Renewal{LeaseUntilMs: r.LeaseUntilMs, Attempt: r.Attempt, Fencing: r.Fencing,
		ValidFor: valid, Deadline: sent.Add(valid)}, nil
}

// Release finishes a held run, SUCCEEDED or FAILED. Idempotent for the same token.
func (c *Client) Release(ctx context.Context, job string, slotMs int64, token string, succeeded bool) error {
	result := pb.ReleaseResult_RELEASE_RESULT_FAILED
	if succeeded {
		result = pb.ReleaseResult_RELEASE_RESULT_SUCCEEDED
	}
	var trailer metadata.MD
	_, err := c.claims.Release(c.ctx(ctx), &pb.ReleaseRequest{
		Job: job, SlotMs: slotMs, Token: token, Result: result,
	}, grpc.Trailer(&trailer))
	return fromRPC(err, trailer)
}

// History lists runs of job, newest slot first: at most limit (0 = 20), and
// only slots before beforeSlotMs when it is non-nil.
func (c *Client) History(ctx context.Context, job string, limit uint32, beforeSlotMs *int64) ([]Run, error) {
	var trailer metadata.MD
	r, err := c.claims.History(c.ctx(ctx), &pb.HistoryRequest{
		Job: job, Limit: limit, BeforeSlotMs: beforeSlotMs,
	}, grpc.Trailer(&trailer))
	if err != nil {
		return nil, fromRPC(err, trailer)
	}
	runs := make([]Run, 0, len(r.Runs))
	for _, x := range r.Runs {
		runs = append(runs, Run{
			SlotMs: x.SlotMs, Attempt: x.Attempt,
			State:       trimEnum(x.State.String(), "RUN_STATE_"),
			Holder:      holderOf(x.Holder),
			ClaimedAtMs: x.ClaimedAtMs, FinishedAtMs: x.FinishedAtMs,
			LeaseUntilMs: x.LeaseUntilMs, Fencing: x.Fencing,
		})
	}
	return runs, nil
}

// Peers is a snapshot of the sidecar's mesh view.
func (c *Client) Peers(ctx context.Context) (*Peers, error) {
	var trailer metadata.MD
	r, err := c.mesh.ListPeers(c.ctx(ctx), &pb.ListPeersRequest{}, grpc.Trailer(&trailer))
	if err != nil {
		return nil, fromRPC(err, trailer)
	}
	out := &Peers{Self: peerOf(r.Self)}
	for _, p := range r.Peers {
		out.Peers = append(out.Peers, peerOf(p))
	}
	return out, nil
}

// WatchOption configures WatchPeers.
type WatchOption func(*pb.WatchPeersRequest)

// IncludeExpired also reports expired runtimes in the snapshot.
func IncludeExpired() WatchOption {
	return func(r *pb.WatchPeersRequest) { r.IncludeExpired = true }
}

// WatchPeers streams peer events: one SNAPSHOT per known runtime, then one
// event per change. The channel closes when ctx is cancelled or the stream
// ends; if the stream failed, the last event has Err set.
func (c *Client) WatchPeers(ctx context.Context, opts ...WatchOption) (<-chan PeerEvent, error) {
	req := &pb.WatchPeersRequest{}
	for _, o := range opts {
		o(req)
	}
	stream, err := c.mesh.WatchPeers(c.ctx(ctx), req)
	if err != nil {
		return nil, fromRPC(err, nil)
	}
	ch := make(chan PeerEvent, 16)
	go func() {
		defer close(ch)
		for {
			ev, err := stream.Recv()
			if err != nil {
				if ctx.Err() == nil {
					select {
					case ch <- PeerEvent{Err: fromRPC(err, stream.Trailer())}:
					case <-ctx.Done():
					}
				}
				return
			}
			select {
			case ch <- PeerEvent{Kind: trimEnum(ev.Kind.String(), "PEER_EVENT_KIND_"), Peer: peerOf(ev.Peer)}:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}
