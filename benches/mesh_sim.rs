//! Mesh simulation: N runtimes in a full mesh on a virtual clock, driving the
//! real `PeerTable` and real signed marks. Measures bytes per link per
//! heartbeat, CPU per heartbeat per runtime, and detection time after a
//! runtime dies, against the declared expiry.
//!
//!     cargo bench --bench mesh_sim -- [SIZES…]      (default: 16 64 256)

use std::sync::Arc;
use std::time::{Duration, Instant};

use anarchon::mesh::marks::sign_mark;
use anarchon::mesh::table::{PeerTable, TableConfig};
use anarchon::mesh::Identity;
use anarchon::proto as pb;
use prost::Message;

const HB_MS: u64 = 1000;
const EXPIRY_MS: u64 = 10_000;
const STEP_MS: u64 = 10;

struct Node {
    id: Identity,
    table: PeerTable,
    beat: u64,
    /// Beat phase within the heartbeat, in ms.
    phase: u64,
    alive: bool,
}

fn pct(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let i = ((v.len() as f64 - 1.0) * q).round() as usize;
    v[i.min(v.len().saturating_sub(1))]
}

fn simulate(n: usize, kills: usize) {
    let t0 = Instant::now() + Duration::from_secs(3600);
    let cfg = TableConfig {
        expiry: Duration::from_millis(EXPIRY_MS),
        max_runtimes: 4096,
    };
    let mut nodes: Vec<Node> = (0..n)
        .map(|i| {
            let id = Identity::ephemeral(1);
            let table = PeerTable::new(cfg, &id.node, 1);
            Node {
                id,
                table,
                beat: 0,
                phase: (i as u64 * 7919) % HB_MS,
                alive: true,
            }
        })
        .collect();
    let mut bytes_per_frame = Vec::new();
    let mut cpu = Duration::ZERO;
    let mut cpu_beats = 0u64;
    let mut detections: Vec<f64> = Vec::new();
    // Warm up for 3 heartbeats, then kill `kills` runtimes one after another,
    // each at a different phase, and watch the others expire it.
    let warmup = 3 * HB_MS;
    let per_kill = EXPIRY_MS + 3 * HB_MS;
    let total = warmup + kills as u64 * per_kill;
    let mut victim_at: Option<(usize, u64)> = None;
    let mut detected: Vec<bool> = vec![false; n];
    let mut next_kill = 0usize;
    let mut now_ms = 0u64;
    while now_ms <= total {
        let now = t0 + Duration::from_millis(now_ms);
        // Kill the next victim a little off-phase.
        if now_ms >= warmup && victim_at.is_none() && next_kill < kills {
            let v = (next_kill * 37 + 5) % n;
            nodes[v].alive = false;
            victim_at = Some((v, now_ms));
            detected = vec![false; n];
            next_kill += 1;
        }
        // Runtimes whose beat is due beat and send a frame to every link.
        let mut frames: Vec<(usize, Arc<pb::SyncFrame>)> = Vec::new();
        for (i, node) in nodes.iter_mut().enumerate() {
            if !node.alive || now_ms % HB_MS != node.phase - node.phase % STEP_MS {
                continue;
            }
            node.beat += 1;
            let m = sign_mark(
                &node.id,
                node.beat,
                false,
                "10.0.0.1:50051",
                &Default::default(),
            );
            node.table.set_own(m, now);
            let frame = pb::SyncFrame {
                frame: Some(pb::sync_frame::Frame::Marks(pb::Marks {
                    marks: node.table.frame_marks(now),
                })),
            };
            if now_ms >= warmup {
                bytes_per_frame.push(frame.encoded_len() as f64);
            }
            frames.push((i, Arc::new(frame)));
        }
        for (from, frame) in &frames {
            let from_node = nodes[*from].id.node.clone();
            let Some(pb::sync_frame::Frame::Marks(marks)) = &frame.frame else {
                continue;
            };
            for (i, node) in nodes.iter_mut().enumerate() {
                if i == *from || !node.alive {
                    continue;
                }
                let started = Instant::now();
                for m in &marks.marks {
                    let _ = node.table.ingest(m, Some(&from_node), now);
                }
                cpu += started.elapsed();
                cpu_beats += 1;
            }
        }
        // Each runtime ticks every quarter heartbeat.
        if now_ms.is_multiple_of(HB_MS / 4) {
            if let Some((v, killed_at)) = victim_at {
                let victim = nodes[v].id.node.clone();
                for (i, node) in nodes.iter_mut().enumerate() {
                    if !node.alive || detected[i] {
                        continue;
                    }
                    node.table.tick(now);
                    let expired = node
                        .table
                        .peer(&victim, now)
                        .is_some_and(|p| p.state == pb::PeerState::Expired as i32);
                    if expired {
                        detected[i] = true;
                        detections.push((now_ms - killed_at) as f64);
                    }
                }
                if now_ms - killed_at >= per_kill - HB_MS {
                    // Bring the victim back for the next round (a new instance).
                    let id = Identity::ephemeral(1);
                    nodes[v] = Node {
                        table: PeerTable::new(cfg, &id.node, 1),
                        id,
                        beat: 0,
                        phase: nodes[v].phase,
                        alive: true,
                    };
                    victim_at = None;
                }
            }
        }
        now_ms += STEP_MS;
    }
    let links = n - 1;
    let frame_bytes = pct(&mut bytes_per_frame.clone(), 0.5);
    let cpu_per_hb_per_runtime = cpu.as_secs_f64() / (cpu_beats as f64 / links as f64) * 1e3;
    let mut d = detections.clone();
    println!(
        "| {n} | {links} | {:.0} | {:.1} | {:.3} | {:.0} | {:.0} | {:.0} | {:.0} |",
        frame_bytes,
        frame_bytes * links as f64 / 1024.0,
        cpu_per_hb_per_runtime,
        pct(&mut d, 0.0),
        pct(&mut d, 0.5),
        pct(&mut d, 0.99),
        pct(&mut d, 1.0),
    );
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![16, 64, 256]
    } else {
        sizes
    };
    println!("heartbeat {HB_MS} ms, expiry {EXPIRY_MS} ms, full mesh, tick every heartbeat/4, virtual clock step {STEP_MS} ms");
    println!("| runtimes | links per runtime | bytes per link per heartbeat | KiB sent per runtime per heartbeat | CPU ms per heartbeat per runtime (ingest) | detection min ms | p50 | p99 | max |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for n in sizes {
        simulate(n, if n >= 256 { 4 } else { 10 });
    }
}
