//! Mesh simulation on a virtual clock, driving the real `PeerTable`, real
//! signed marks, the real link deltas (`mesh::gossip::Outbox`) and the real
//! link choice (`mesh::fanout::choose`), with real encoded frames.
//!
//! Measures, per runtime: bytes sent per second, CPU per second (building
//! frames, taking them in — signature checks included — and ticking the
//! table), links; and, per killed runtime, when each other runtime sees it
//! `EXPIRED`, with the relay hops between them. It also watches that no
//! live runtime is ever seen `EXPIRED` (and counts `UNREACHABLE` sightings)
//! from a sample of observers.
//!
//!     cargo bench --bench mesh_sim -- [--full] [SIZES…]   (default: 16 64 256 1000)
//!
//! `--full` is the mesh before issue 20: every runtime links with every
//! other and sends every mark it knows each heartbeat.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use anarchon::mesh::fanout;
use anarchon::mesh::gossip::{GossipConfig, Outbox};
use anarchon::mesh::marks::sign_mark;
use anarchon::mesh::node::{RELAY_MARKS_PER_HEARTBEAT, RELAY_TICKS_PER_HB};
use anarchon::mesh::table::{PeerTable, TableConfig};
use anarchon::mesh::Identity;
use anarchon::proto as pb;
use prost::Message;

const HB_MS: u64 = 1000;
const EXPIRY_MS: u64 = 10_000;
const STEP_MS: u64 = 10;
const MAX_LINKS: usize = 8;
const RESHUFFLE_HB: u64 = 30;
const WARMUP_HB: u64 = 8;
const OBSERVERS: usize = 8;

struct Node {
    id: Identity,
    table: PeerTable,
    beat: u64,
    /// Beat phase within the heartbeat, in ms (a multiple of the step).
    phase: u64,
    alive: bool,
    outboxes: HashMap<usize, Outbox>,
    /// When a frame last came from each runtime, in ms.
    heard: HashMap<usize, u64>,
}

/// This process's CPU time (user + system), from `/proc/self/stat`, in
/// clock ticks of 10 ms.
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // utime and stime are fields 14 and 15 (1-based), i.e. 11 and 12 here.
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

fn pct(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let i = ((v.len() as f64 - 1.0) * q).round() as usize;
    v[i.min(v.len() - 1)]
}

fn new_node(i: usize, cfg: TableConfig, full: bool) -> Node {
    let id = Identity::ephemeral(1);
    // As the sidecar does: the gain its links' deltas assume.
    let gain = if full {
        Duration::ZERO
    } else {
        GossipConfig::new(Duration::from_millis(HB_MS), cfg.expiry).min_gain
    };
    let table = PeerTable::new(cfg, &id.node, 1).with_min_gain(gain);
    Node {
        id,
        table,
        beat: 0,
        phase: ((i as u64 * 7919) % HB_MS) / STEP_MS * STEP_MS,
        alive: true,
        outboxes: HashMap::new(),
        heard: HashMap::new(),
    }
}

/// Undirected links: a link exists when either end chose the other.
fn links(nodes: &[Node], full: bool, epoch: u64) -> Vec<BTreeSet<usize>> {
    let n = nodes.len();
    let mut adj = vec![BTreeSet::new(); n];
    if full {
        for (i, a) in adj.iter_mut().enumerate() {
            a.extend((0..n).filter(|&j| j != i));
        }
        return adj;
    }
    let index: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, x)| (x.id.node.as_str(), i))
        .collect();
    for (i, x) in nodes.iter().enumerate() {
        let chosen = fanout::choose(
            &x.id.node,
            nodes.iter().map(|y| y.id.node.as_str()),
            MAX_LINKS,
            epoch,
        );
        for c in chosen {
            let j = index[c.as_str()];
            adj[i].insert(j);
            adj[j].insert(i);
        }
    }
    adj
}

fn hops_from(adj: &[BTreeSet<usize>], from: usize) -> Vec<usize> {
    let mut d = vec![usize::MAX; adj.len()];
    d[from] = 0;
    let mut q = VecDeque::from([from]);
    while let Some(x) = q.pop_front() {
        for &y in &adj[x] {
            if d[y] == usize::MAX {
                d[y] = d[x] + 1;
                q.push_back(y);
            }
        }
    }
    d
}

fn simulate(n: usize, kills: usize, full: bool) {
    let t0 = Instant::now() + Duration::from_secs(3600);
    let expiry = Duration::from_millis(EXPIRY_MS);
    let hb = Duration::from_millis(HB_MS);
    let cfg = TableConfig {
        expiry,
        max_runtimes: 4096,
    };
    let gossip = GossipConfig::new(hb, expiry);
    // MESH_SIM_GOSSIP=0: every link refreshes every runtime on its own (the
    // rule before relay trees, still spoken to older sidecars).
    let trees = std::env::var("MESH_SIM_GOSSIP").map_or(true, |v| v != "0");
    // MESH_SIM_RELAY=0: relayed beats go only with the heartbeat's frame,
    // not between heartbeats as soon as they are taken.
    let relay_now = trees && std::env::var("MESH_SIM_RELAY").map_or(true, |v| v != "0");
    // As the sidecar does: what its links brought is relayed down the trees
    // every quarter heartbeat (one signature batch per frame, not one per
    // mark), each runtime at its own phase.
    let relay_every = HB_MS / RELAY_TICKS_PER_HB;
    let mut pending: Vec<BTreeSet<String>> = vec![BTreeSet::new(); n];
    let mut pending_asks: Vec<Vec<String>> = vec![Vec::new(); n];
    let relay_budget = std::env::var("MESH_SIM_BUDGET")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(RELAY_MARKS_PER_HEARTBEAT);
    let mut nodes: Vec<Node> = (0..n).map(|i| new_node(i, cfg, full)).collect();
    let mut names: Vec<String> = nodes.iter().map(|x| x.id.node.clone()).collect();
    let mut adj = links(&nodes, full, 0);
    let mut epoch = 0u64;

    // Wall time inside the runtimes' own work (building frames, taking them
    // in, ticking), and the measured window's wall and process CPU time: the
    // CPU figure is the process CPU times the share of the window spent in
    // the runtimes' work, so that other processes on the machine (which
    // stretch wall time) do not inflate it.
    let mut cpu = Duration::ZERO;
    let mut window: Option<(Instant, Duration)> = None;
    let mut sent_bytes = 0u64;
    let mut measured_ms = 0u64;
    let mut detections: Vec<(f64, usize)> = Vec::new();
    let mut early = 0usize;
    let mut unreachable_sightings = 0u64;
    let mut expired_sightings = 0u64;
    let mut sightings = 0u64;
    let mut max_live_age = 0i64;
    let mut marks_in = 0u64;
    let mut marks_taken = 0u64;

    let warmup = std::env::var("MESH_SIM_WARMUP_HB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(WARMUP_HB)
        * HB_MS;
    let per_kill = EXPIRY_MS + 3 * HB_MS;
    let total = warmup + kills as u64 * per_kill;
    let mut victim: Option<(usize, u64, Vec<usize>)> = None;
    let mut detected = vec![false; n];
    let mut next_kill = 0usize;
    let mut now_ms = 0u64;
    while now_ms <= total {
        let now = t0 + Duration::from_millis(now_ms);
        let measuring = now_ms >= warmup;
        if now_ms == warmup {
            window = Some((Instant::now(), process_cpu()));
        }
        if !full && now_ms > 0 && now_ms.is_multiple_of(RESHUFFLE_HB * HB_MS) {
            epoch += 1;
            adj = links(&nodes, full, epoch);
        }
        if measuring && victim.is_none() && next_kill < kills {
            let v = (next_kill * 37 + 5) % n;
            nodes[v].alive = false;
            victim = Some((v, now_ms, hops_from(&adj, v)));
            detected = vec![false; n];
            next_kill += 1;
        }
        // Runtimes whose beat is due beat and send a frame on every link.
        let mut frames: Vec<(usize, usize, pb::SyncFrame)> = Vec::new();
        for i in 0..n {
            if !relay_now || !nodes[i].alive || now_ms % relay_every != nodes[i].phase % relay_every
            {
                continue;
            }
            let started = Instant::now();
            let taken: Vec<String> = std::mem::take(&mut pending[i]).into_iter().collect();
            let asks = std::mem::take(&mut pending_asks[i]);
            let node = &mut nodes[i];
            for (&j, ob) in node.outboxes.iter_mut() {
                if !adj[i].contains(&j) {
                    continue;
                }
                let out = ob.relay(&node.table, now, &taken, &[], &asks);
                if anarchon::mesh::gossip::is_empty(&out) {
                    continue;
                }
                let frame = pb::SyncFrame {
                    frame: Some(pb::sync_frame::Frame::Marks(out)),
                };
                if measuring {
                    sent_bytes += frame.encoded_len() as u64;
                }
                frames.push((i, j, frame));
            }
            if measuring {
                cpu += started.elapsed();
            }
        }
        for i in 0..n {
            if !nodes[i].alive || now_ms % HB_MS != nodes[i].phase {
                continue;
            }
            let started = Instant::now();
            let node = &mut nodes[i];
            node.beat += 1;
            let m = sign_mark(
                &node.id,
                node.beat,
                false,
                "10.0.0.1:50051",
                &Default::default(),
            );
            node.table.set_own(m, now);
            let budget = (relay_budget / adj[i].len().max(1)).max(32);
            for &j in &adj[i] {
                let marks = if full {
                    pb::Marks {
                        marks: node.table.frame_marks(now),
                        ..Default::default()
                    }
                } else {
                    let ob = node
                        .outboxes
                        .entry(j)
                        .or_insert_with(|| Outbox::new(&names[j], gossip, now).with_trees(trees));
                    ob.frame(&node.table, now, budget)
                };
                if anarchon::mesh::gossip::is_empty(&marks) {
                    continue;
                }
                let frame = pb::SyncFrame {
                    frame: Some(pb::sync_frame::Frame::Marks(marks)),
                };
                if measuring {
                    sent_bytes += frame.encoded_len() as u64;
                }
                frames.push((i, j, frame));
            }
            if measuring {
                cpu += started.elapsed();
            }
        }
        for (from, to, frame) in frames {
            if !nodes[to].alive {
                continue;
            }
            let from_node = &names[from];
            let Some(pb::sync_frame::Frame::Marks(marks)) = frame.frame else {
                continue;
            };
            let started = Instant::now();
            let node = &mut nodes[to];
            node.heard.insert(from, now_ms);
            if !full {
                node.outboxes
                    .entry(from)
                    .or_insert_with(|| Outbox::new(from_node, gossip, now).with_trees(trees))
                    .note_received(&marks, now);
            }
            let outcomes = node.table.ingest_frame(&marks.marks, Some(from_node), now);
            if measuring {
                marks_in += outcomes.len() as u64;
                marks_taken += outcomes.iter().filter(|o| o.is_ok()).count() as u64;
            }
            if relay_now {
                pending[to].extend(
                    marks
                        .marks
                        .iter()
                        .zip(&outcomes)
                        .filter(|(_, o)| o.is_ok())
                        .map(|(m, _)| m.node.clone()),
                );
            }
            if measuring {
                cpu += started.elapsed();
            }
        }
        // Each runtime ticks every quarter heartbeat.
        if now_ms.is_multiple_of(HB_MS / 4) {
            let started = Instant::now();
            let index: HashMap<&str, usize> = names
                .iter()
                .enumerate()
                .map(|(i, x)| (x.as_str(), i))
                .collect();
            let silent_after = gossip.silent_after.as_millis() as u64;
            for (i, node) in nodes.iter_mut().enumerate().filter(|(_, x)| x.alive) {
                node.table.tick(now);
                if !relay_now {
                    continue;
                }
                // As the sidecar's beat loop does: copies `fallback_after`
                // old are asked for on every link, with the next relay, and
                // so are those a link brought that is gone or went silent.
                let heard = &node.heard;
                let quiet = |via: &str| {
                    index.get(via).is_none_or(|j| {
                        !adj[i].contains(j)
                            || heard
                                .get(j)
                                .is_none_or(|t| now_ms.saturating_sub(*t) >= silent_after)
                    })
                };
                let asks = node.table.due_asks(now, gossip.fallback_after, hb, quiet);
                pending_asks[i].extend(asks);
            }
            if measuring {
                cpu += started.elapsed();
            }
            if let Some((v, killed_at, hops)) = &victim {
                let victim_node = nodes[*v].id.node.clone();
                for (i, node) in nodes.iter().enumerate() {
                    if !node.alive || detected[i] {
                        continue;
                    }
                    let expired = node
                        .table
                        .peer(&victim_node, now)
                        .is_some_and(|p| p.state == pb::PeerState::Expired as i32);
                    if expired {
                        detected[i] = true;
                        let at = (now_ms - killed_at) as f64;
                        if at < (EXPIRY_MS - HB_MS) as f64 {
                            early += 1;
                        }
                        detections.push((at, hops[i]));
                    }
                }
                // Live runtimes as a sample of observers see them.
                if measuring {
                    let live: std::collections::HashSet<&str> = nodes
                        .iter()
                        .filter(|x| x.alive)
                        .map(|x| x.id.node.as_str())
                        .collect();
                    for o in 0..OBSERVERS.min(n) {
                        let obs = (o * 131 + 17) % n;
                        if !nodes[obs].alive {
                            continue;
                        }
                        for p in nodes[obs].table.peers(now) {
                            if !live.contains(p.node.as_str()) {
                                continue;
                            }
                            sightings += 1;
                            max_live_age = max_live_age.max(p.beat_age_ms);
                            if p.state == pb::PeerState::Unreachable as i32 {
                                unreachable_sightings += 1;
                            } else if p.state == pb::PeerState::Expired as i32 {
                                expired_sightings += 1;
                            }
                        }
                    }
                }
                if now_ms - killed_at >= per_kill - HB_MS {
                    // Bring the victim back for the next round (a new runtime).
                    let v = *v;
                    let phase = nodes[v].phase;
                    nodes[v] = new_node(v, cfg, full);
                    nodes[v].phase = phase;
                    names[v] = nodes[v].id.node.clone();
                    for node in nodes.iter_mut() {
                        node.outboxes.remove(&v);
                        node.heard.remove(&v);
                    }
                    victim = None;
                }
            }
        }
        if measuring {
            measured_ms += STEP_MS;
        }
        now_ms += STEP_MS;
    }
    let secs = measured_ms as f64 / 1000.0;
    eprintln!(
        "n={n}: marks received {:.0}/s per runtime, taken {:.0}/s ({:.0}% wasted)",
        marks_in as f64 / n as f64 / secs,
        marks_taken as f64 / n as f64 / secs,
        100.0 * (1.0 - marks_taken as f64 / marks_in.max(1) as f64)
    );
    let (wall, proc_cpu) = window.map_or((Duration::ZERO, Duration::ZERO), |(w, c)| {
        (w.elapsed(), process_cpu().saturating_sub(c))
    });
    let share = (cpu.as_secs_f64() / wall.as_secs_f64().max(1e-9)).min(1.0);
    let cpu_ms = proc_cpu.as_secs_f64() * share * 1e3;
    let degrees: Vec<f64> = adj.iter().map(|a| a.len() as f64).collect();
    let d: Vec<f64> = detections.iter().map(|(t, _)| *t).collect();
    let max_hops = detections.iter().map(|(_, h)| *h).max().unwrap_or(0);
    // The bound per detector: expiry + one heartbeat per relay hop.
    let over_bound = detections
        .iter()
        .filter(|(t, h)| *t > (EXPIRY_MS + HB_MS * (*h as u64).max(1)) as f64 + 250.0)
        .count();
    println!(
        "| {n} | {} | {:.0} / {:.0} | {:.1} | {:.2} | {:.0} | {:.0} | {:.0} | {:.0} | {max_hops} | {early} | {over_bound} | {:.2}% | {expired_sightings} | {:.1} |",
        if full { "full" } else { "deltas" },
        pct(&degrees, 0.5),
        pct(&degrees, 1.0),
        sent_bytes as f64 / n as f64 / secs / 1024.0,
        cpu_ms / n as f64 / secs,
        pct(&d, 0.0),
        pct(&d, 0.5),
        pct(&d, 0.99),
        pct(&d, 1.0),
        100.0 * unreachable_sightings as f64 / sightings.max(1) as f64,
        max_live_age as f64 / 1000.0,
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let full = args.iter().any(|a| a == "--full");
    let sizes: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let sizes = if sizes.is_empty() {
        vec![16, 64, 256, 1000]
    } else {
        sizes
    };
    println!(
        "heartbeat {HB_MS} ms, expiry {EXPIRY_MS} ms, max_links {MAX_LINKS}, tick every heartbeat/4, \
         virtual clock step {STEP_MS} ms, warm-up {WARMUP_HB} heartbeats"
    );
    println!("| runtimes | mode | links p50 / max | KiB/s sent per runtime | CPU ms/s per runtime | detection min ms | p50 | p99 | max | hops max | earlier than expiry−hb | later than expiry+hops×hb | live seen UNREACHABLE | live seen EXPIRED | oldest live beat seen, s |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for n in sizes {
        simulate(
            n,
            if n >= 1000 {
                1
            } else if n >= 256 {
                2
            } else {
                6
            },
            full,
        );
    }
}
