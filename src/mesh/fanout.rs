//! Bounded fan-out: which runtimes this one links with, as a pure function.
//!
//! Each runtime dials at most `max_links / 2` peers chosen by rendezvous
//! hashing (the highest `hash(pair)` scores; the hash of a pair is the same
//! from both ends, so choices are stable and spread evenly), plus
//! `max_links / 8` (at least one) random peers drawn again every
//! `reshuffle` (a few random links keep the diameter small, as in a random
//! regular graph, and heal a partition the hashing alone might keep). The
//! others dial it in turn, so a runtime holds about `max_links` links; the
//! rest of the mesh reaches it through relay.

use std::collections::hash_map::DefaultHasher;
use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};

/// The rendezvous score of a pair, the same from either end.
pub fn pair_score(a: &str, b: &str) -> u64 {
    let (lo, hi) = if a < b { (a, b) } else { (b, a) };
    let mut h = DefaultHasher::new();
    lo.hash(&mut h);
    hi.hash(&mut h);
    h.finish()
}

fn seeded(node: &str, seed: u64) -> u64 {
    let mut h = DefaultHasher::new();
    seed.hash(&mut h);
    node.hash(&mut h);
    h.finish()
}

/// How many peers a runtime dials by hashing and at random.
pub fn split(max_links: usize) -> (usize, usize) {
    let random = (max_links / 8).max(1).min(max_links);
    let hashed = (max_links / 2).saturating_sub(random).max(1);
    (hashed, random)
}

/// The peers `me` dials among `candidates`: the `max_links / 2` best pair
/// scores (less the random ones) plus the random ones for this `epoch`.
/// Deterministic in its inputs, so the choice is unit-tested and simulated.
pub fn choose<'a>(
    me: &str,
    candidates: impl IntoIterator<Item = &'a str>,
    max_links: usize,
    epoch: u64,
) -> BTreeSet<String> {
    let (hashed, random) = split(max_links);
    let mut all: Vec<&str> = candidates.into_iter().filter(|c| *c != me).collect();
    all.sort_unstable();
    all.dedup();
    let mut by_score: Vec<(u64, &str)> = all.iter().map(|c| (pair_score(me, c), *c)).collect();
    by_score.sort_unstable_by(|a, b| b.cmp(a));
    let mut out: BTreeSet<String> = by_score
        .iter()
        .take(hashed)
        .map(|(_, c)| (*c).to_owned())
        .collect();
    let seed = seeded(me, epoch);
    let mut rest: Vec<(u64, &str)> = by_score
        .iter()
        .skip(hashed)
        .map(|(_, c)| (seeded(c, seed), *c))
        .collect();
    rest.sort_unstable();
    out.extend(rest.into_iter().take(random).map(|(_, c)| c.to_owned()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet, VecDeque};

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{:032x}", i * 7919 + 1)).collect()
    }

    /// Links as an undirected graph: a link exists when either end chose it.
    fn graph(nodes: &[String], max_links: usize, epoch: u64) -> HashMap<&str, HashSet<&str>> {
        let mut g: HashMap<&str, HashSet<&str>> = HashMap::new();
        for n in nodes {
            for c in choose(n, nodes.iter().map(|s| s.as_str()), max_links, epoch) {
                let c = nodes.iter().find(|x| **x == c).unwrap();
                g.entry(n).or_default().insert(c);
                g.entry(c).or_default().insert(n);
            }
        }
        g
    }

    fn eccentricity(g: &HashMap<&str, HashSet<&str>>, from: &str) -> Option<usize> {
        let mut dist: HashMap<&str, usize> = HashMap::from([(from, 0)]);
        let mut q = VecDeque::from([from]);
        while let Some(n) = q.pop_front() {
            for m in &g[n] {
                if !dist.contains_key(m) {
                    dist.insert(m, dist[n] + 1);
                    q.push_back(m);
                }
            }
        }
        (dist.len() == g.len()).then(|| dist.values().copied().max().unwrap_or(0))
    }

    #[test]
    fn a_thousand_runtimes_stay_connected_with_bounded_links_and_a_small_diameter() {
        let nodes = names(1000);
        let g = graph(&nodes, 8, 1);
        let max_degree = g.values().map(|s| s.len()).max().unwrap();
        let mean = g.values().map(|s| s.len()).sum::<usize>() as f64 / g.len() as f64;
        assert!(max_degree <= 16, "max links {max_degree}");
        assert!((4.0..=10.0).contains(&mean), "mean links {mean}");
        for n in nodes.iter().step_by(97) {
            let e = eccentricity(&g, n).expect("connected");
            assert!(e <= 8, "eccentricity {e}");
        }
    }

    #[test]
    fn small_meshes_link_everyone_they_can_and_choices_are_stable() {
        let nodes = names(3);
        let c = choose(&nodes[0], nodes.iter().map(|s| s.as_str()), 8, 1);
        assert_eq!(c.len(), 2);
        assert!(!c.contains(&nodes[0]));
        assert_eq!(
            c,
            choose(&nodes[0], nodes.iter().rev().map(|s| s.as_str()), 8, 1)
        );
        // The hashed part does not move with the epoch; the random part may.
        let big = names(100);
        let (hashed, _) = split(8);
        let a = choose(&big[0], big.iter().map(|s| s.as_str()), 8, 1);
        let b = choose(&big[0], big.iter().map(|s| s.as_str()), 8, 2);
        assert!(a.intersection(&b).count() >= hashed);
    }
}
