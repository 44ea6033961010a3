//! Helpers for the RabbitMQ and NATS JetStream tests: the local brokers,
//! unique name prefixes, and a sweep of streams left by earlier test runs.

use std::sync::atomic::{AtomicBool, Ordering};

use anarchon::store::{self, DynStore, StoreOptions};
use futures::StreamExt;

use super::services;

pub const AMQP_ADDR: &str = "127.0.0.1:5672";
pub const NATS_ADDR: &str = "127.0.0.1:4222";
/// Test prefixes start with this, so old test streams can be swept.
pub const TEST_PREFIX: &str = "anatest_";

/// A name prefix of its own for one test (at most 29 bytes).
pub fn prefix() -> String {
    format!(
        "{TEST_PREFIX}{:012x}",
        rand::random::<u64>() & 0xffff_ffff_ffff
    )
}

pub fn amqp_url(prefix: &str, extra: &str) -> String {
    format!("amqp://guest:guest@{AMQP_ADDR}/%2f?prefix={prefix}{extra}")
}

pub fn nats_url(prefix: &str, extra: &str) -> String {
    format!("nats://{NATS_ADDR}?prefix={prefix}{extra}")
}

pub fn rabbitmq_up() -> bool {
    services::require("RabbitMQ", AMQP_ADDR)
}

pub fn nats_up() -> bool {
    services::require("NATS", NATS_ADDR)
}

/// A RabbitMQ store with its own prefix; `extra` is appended to the URL query.
pub async fn rabbitmq(extra: &str) -> Option<DynStore> {
    if !rabbitmq_up() {
        return None;
    }
    let url = amqp_url(&prefix(), extra);
    Some(store::open(&url, &StoreOptions::default()).await.unwrap())
}

/// A NATS store with its own prefix (so its own stream).
pub async fn nats(extra: &str) -> Option<DynStore> {
    if !nats_up() {
        return None;
    }
    sweep_old_test_streams().await;
    let url = nats_url(&prefix(), extra);
    Some(store::open(&url, &StoreOptions::default()).await.unwrap())
}

/// Deletes the streams of earlier test runs (named `ANATEST_…`, created
/// more than 30 minutes ago), once per test process.
pub async fn sweep_old_test_streams() {
    static DONE: AtomicBool = AtomicBool::new(false);
    if DONE.swap(true, Ordering::SeqCst) {
        return;
    }
    let Ok(client) = async_nats::connect(NATS_ADDR).await else {
        return;
    };
    let js = async_nats::jetstream::new(client);
    let cutoff = anarchon::claim::host_now_ms() / 1000 - 1800;
    let mut old = Vec::new();
    let mut streams = js.streams();
    while let Some(Ok(info)) = streams.next().await {
        let name = info.config.name.clone();
        if name.starts_with(&TEST_PREFIX.to_ascii_uppercase())
            && info.created.unix_timestamp() < cutoff
        {
            old.push(name);
        }
    }
    for name in old {
        let _ = js.delete_stream(&name).await;
    }
}

/// Deletes every queue left by tests (`anatest_…`). Gates are durable
/// queues, and a broker restart recovers every one of them: thousands of
/// leftovers make a restart slow, and beyond the broker's file handle limit
/// its recovery can stall. Needs `rabbitmqctl` (to list queues).
pub async fn sweep_test_queues() {
    sweep_queues(TEST_PREFIX).await
}

/// Deletes the queues whose names start with `prefix`.
pub async fn sweep_queues(prefix: &str) {
    let Ok(out) = std::process::Command::new("rabbitmqctl")
        .args(["list_queues", "name", "--quiet", "--no-table-headers"])
        .output()
    else {
        return;
    };
    let names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|n| n.starts_with(prefix))
        .map(str::to_owned)
        .collect();
    if names.is_empty() {
        return;
    }
    let Ok(conn) = lapin::Connection::connect(
        &format!("amqp://guest:guest@{AMQP_ADDR}/%2f"),
        lapin::ConnectionProperties::default(),
    )
    .await
    else {
        return;
    };
    let mut ch = None;
    for name in &names {
        if ch.is_none() {
            ch = conn.create_channel().await.ok();
        }
        let Some(c) = &ch else { return };
        if c.queue_delete(name, Default::default()).await.is_err() {
            // A failed delete closes the channel: open another.
            ch = None;
        }
    }
    let _ = conn.close(200, "swept").await;
}
