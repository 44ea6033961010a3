//! A bounded smoke run of the fuzz bodies (`anarchon::fuzzing`) in the
//! ordinary test command: random bytes, mutations of valid messages, and
//! random scripts of signed marks. Coverage-guided runs use `cargo fuzz`
//! (`scripts/fuzz-smoke.sh`, see docs/FUZZING.md). Any panic fails the test.

use anarchon::proto as pb;
use prost::Message;
use rand::{Rng, SeedableRng};

fn mutate(rng: &mut impl Rng, mut v: Vec<u8>) -> Vec<u8> {
    for _ in 0..rng.gen_range(1..4) {
        match rng.gen_range(0..4) {
            0 if !v.is_empty() => {
                let i = rng.gen_range(0..v.len());
                v[i] = rng.gen();
            }
            1 => {
                let i = rng.gen_range(0..=v.len());
                v.insert(i, rng.gen());
            }
            2 if !v.is_empty() => {
                let i = rng.gen_range(0..v.len());
                v.truncate(i);
            }
            _ => v.extend((0..rng.gen_range(0..16)).map(|_| rng.gen::<u8>())),
        }
    }
    v
}

#[test]
fn requests_never_panic() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xA11C);
    let valid = pb::ClaimRequest {
        job: "nightly-report".into(),
        slot_ms: 5,
        token: "a".repeat(32),
        lease_ms: 100,
        max_late_ms: 1,
        overlap: 2,
        max_attempts: 3,
        wait_ms: 4,
    }
    .encode_to_vec();
    for i in 0..20_000u32 {
        let mut data = vec![(i % 5) as u8];
        if i % 2 == 0 {
            data.extend(mutate(&mut rng, valid.clone()));
        } else {
            data.extend((0..rng.gen_range(0..64)).map(|_| rng.gen::<u8>()));
        }
        anarchon::fuzzing::requests(&data);
    }
}

#[test]
fn sync_frames_never_panic() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5EED);
    let id = anarchon::mesh::Identity::from_seed([3; 32], 1);
    let mark = anarchon::mesh::marks::sign_mark(&id, 7, false, "127.0.0.1:1", &Default::default());
    let frame = pb::SyncFrame {
        frame: Some(pb::sync_frame::Frame::Marks(pb::Marks {
            marks: vec![mark.clone(), mark],
            ..Default::default()
        })),
    }
    .encode_to_vec();
    for i in 0..3_000u32 {
        let data: Vec<u8> = match i % 3 {
            // Random scripts of signed marks (odd first byte).
            0 => std::iter::once(1u8)
                .chain((0..8 * rng.gen_range(1..24)).map(|_| rng.gen::<u8>()))
                .collect(),
            1 => mutate(&mut rng, frame.clone()),
            _ => (0..rng.gen_range(0..128))
                .map(|_| rng.gen::<u8>())
                .map(|b| b & 0xfe)
                .collect(),
        };
        anarchon::fuzzing::sync_frames(&data);
    }
}
