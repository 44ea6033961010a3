package anarchon

import (
	"strings"
	"time"

	pb "github.com/anarchon/anarchon/clients/go/anarchonv1"
)

// Outcome of a claim. Contention is an outcome, never an error.
type Outcome string

const (
	Won     Outcome = "WON"     // the caller holds the run
	Lost    Outcome = "LOST"    // once backends: someone else's claim was stored first
	Running Outcome = "RUNNING" // another live holder has a current lease
	Done    Outcome = "DONE"    // the run finished (Reason: succeeded, failed, interrupted)
	Late    Outcome = "LATE"    // too late to start this slot; nothing written
	Overlap Outcome = "OVERLAP" // overlap=SKIP and another run of the job is running
)

func trimEnum(name, prefix string) string { return strings.TrimPrefix(name, prefix) }

// Holder is the runtime that holds a run.
type Holder struct {
	Node     string
	Instance uint64
}

func holderOf(h *pb.Holder) *Holder {
	if h == nil || h.Node == "" {
		return nil
	}
	return &Holder{Node: h.Node, Instance: h.Instance}
}

// Claim is the answer to a claim.
type Claim struct {
	Job     string
	SlotMs  int64
	Outcome Outcome
	// Only when won.
	Token        string
	Attempt      uint32
	Fencing      uint64
	LeaseUntilMs int64 // store clock
	ValidFor     time.Duration
	// Deadline is a safe local deadline: when the request was sent + ValidFor.
	Deadline time.Time
	Holder   *Holder
	Backend  string
	Reason   string
	NowMs    int64
}

// Won reports whether the caller holds the run.
func (c *Claim) Won() bool { return c != nil && c.Outcome == Won }

func claimOf(job string, slot int64, r *pb.ClaimResponse, sent time.Time) *Claim {
	valid := time.Duration(r.GetValidForMs()) * time.Millisecond
	return &Claim{
		Job: job, SlotMs: slot,
		Outcome:      Outcome(trimEnum(r.GetOutcome().String(), "OUTCOME_")),
		Token:        r.GetToken(),
		Attempt:      r.GetAttempt(),
		Fencing:      r.GetFencing(),
		LeaseUntilMs: r.GetLeaseUntilMs(),
		ValidFor:     valid,
		Deadline:     sent.Add(valid),
		Holder:       holderOf(r.GetHolder()),
		Backend:      r.GetBackend(),
		Reason:       r.GetReason(),
		NowMs:        r.GetNowMs(),
	}
}

// Renewal is the answer to a renew.
type Renewal struct {
	LeaseUntilMs int64
	Attempt      uint32
	Fencing      uint64
	ValidFor     time.Duration
	Deadline     time.Time
}

// Run is one run of a job (History). State: RUNNING, SUCCEEDED, FAILED,
// INTERRUPTED, CLAIMED.
type Run struct {
	SlotMs       int64
	Attempt      uint32
	State        string
	Holder       *Holder
	ClaimedAtMs  int64
	FinishedAtMs int64
	LeaseUntilMs int64
	Fencing      uint64
}

// Peer is a runtime as seen by the sidecar. State: ALIVE, UNREACHABLE,
// EXPIRED, LEFT. Link: DIRECT, RELAYED, NONE (UNSPECIFIED for the sidecar itself).
type Peer struct {
	Node     string
	Instance uint64
	Restarts uint32
	Address  string
	State    string
	Link     string
	Beat     uint64
	BeatAge  time.Duration
	Labels   map[string]string
	NodeName string
}

func peerOf(p *pb.Peer) Peer {
	if p == nil {
		return Peer{}
	}
	return Peer{
		Node: p.Node, Instance: p.Instance, Restarts: p.Restarts, Address: p.Address,
		State:    trimEnum(p.State.String(), "PEER_STATE_"),
		Link:     trimEnum(p.Link.String(), "LINK_"),
		Beat:     p.Beat,
		BeatAge:  time.Duration(p.BeatAgeMs) * time.Millisecond,
		Labels:   p.Labels,
		NodeName: p.NodeName,
	}
}

// Peers is a snapshot of the mesh: the sidecar's own runtime and its peers.
type Peers struct {
	Self  Peer
	Peers []Peer
}

// PeerEvent is one event of WatchPeers. Kind: SNAPSHOT, JOINED, ALIVE,
// UNREACHABLE, EXPIRED, RESTARTED, LEFT. The last event before the channel
// closes has Err set if the stream failed (not when ctx was cancelled).
type PeerEvent struct {
	Kind string
	Peer Peer
	Err  error
}
