//! The raw broker step, without anarchon, for comparison with
//! `anarchon bench --backend amqp://… / nats://…` (which measures
//! `Store::claim` and the sidecar).
//!
//! * RabbitMQ: N tasks, one confirm-mode channel each on one connection; each
//!   step declares a new gate queue (durable classic, max-length 1,
//!   reject-publish, x-expires) and publishes one persistent message with
//!   `mandatory`, waiting for the confirm.
//! * NATS: N tasks; each step publishes to a JetStream stream with a new
//!   `Nats-Msg-Id` and waits for the ack.
//!
//! ```text
//! cargo run --release --example broker_bench -- amqp 'amqp://guest:guest@127.0.0.1:5672/%2f' 16 10
//! cargo run --release --example broker_bench -- nats 'nats://127.0.0.1:4222' 16 10
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::publisher_confirm::Confirmation;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};

type R<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[tokio::main]
async fn main() -> R<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (kind, url) = match (args.first(), args.get(1)) {
        (Some(k), Some(u)) => (k.clone(), u.clone()),
        _ => return Err("usage: broker_bench amqp|nats URL [CLIENTS] [SECONDS]".into()),
    };
    let clients: usize = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(16);
    let seconds: f64 = args.get(3).and_then(|v| v.parse().ok()).unwrap_or(10.0);
    let run = format!("{:08x}", rand::random::<u32>());
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    match kind.as_str() {
        "amqp" => {
            let conn = Arc::new(Connection::connect(&url, ConnectionProperties::default()).await?);
            let mut args = FieldTable::default();
            args.insert(
                "x-queue-type".into(),
                AMQPValue::LongString("classic".into()),
            );
            args.insert("x-max-length".into(), AMQPValue::LongLongInt(1));
            args.insert(
                "x-overflow".into(),
                AMQPValue::LongString("reject-publish".into()),
            );
            args.insert("x-expires".into(), AMQPValue::LongLongInt(60_000));
            for c in 0..clients {
                let (conn, args, run) = (conn.clone(), args.clone(), run.clone());
                tasks.push(tokio::spawn(async move {
                    let ch = conn.create_channel().await?;
                    ch.confirm_select(ConfirmSelectOptions::default()).await?;
                    let mut n = 0u64;
                    while Instant::now() < end {
                        let q = format!("rawbench.{run}.{c}.slot.{n}");
                        let opts = QueueDeclareOptions {
                            durable: true,
                            ..Default::default()
                        };
                        ch.queue_declare(&q, opts, args.clone()).await?;
                        let confirm = ch
                            .basic_publish(
                                "",
                                &q,
                                BasicPublishOptions {
                                    mandatory: true,
                                    immediate: false,
                                },
                                b"{\"token\":\"0123456789abcdef0123456789abcdef\"}",
                                BasicProperties::default().with_delivery_mode(2),
                            )
                            .await?
                            .await?;
                        if confirm == Confirmation::Ack(None) {
                            n += 1;
                        }
                    }
                    R::Ok(n)
                }));
            }
        }
        "nats" => {
            let client = async_nats::connect(url.as_str()).await?;
            let js = async_nats::jetstream::new(client);
            let name = format!("RAWBENCH{run}").to_ascii_uppercase();
            js.create_stream(async_nats::jetstream::stream::Config {
                name: name.clone(),
                subjects: vec![format!("rawbench{run}.>")],
                duplicate_window: Duration::from_secs(600),
                max_age: Duration::from_secs(1200),
                ..Default::default()
            })
            .await?;
            for c in 0..clients {
                let (js, run) = (js.clone(), run.clone());
                tasks.push(tokio::spawn(async move {
                    let mut n = 0u64;
                    while Instant::now() < end {
                        let p = async_nats::jetstream::context::Publish::build()
                            .payload(b"{\"token\":\"0123456789abcdef0123456789abcdef\"}"[..].into())
                            .message_id(format!("job-{c}:{n}"));
                        let ack = js
                            .send_publish(format!("rawbench{run}.claims.job-{c}"), p)
                            .await?
                            .await?;
                        if !ack.duplicate {
                            n += 1;
                        }
                    }
                    R::Ok(n)
                }));
            }
            let mut total = 0;
            for t in tasks.drain(..) {
                total += t.await??;
            }
            report(&kind, clients, total, started.elapsed());
            js.delete_stream(&name).await?;
            return Ok(());
        }
        other => return Err(format!("unknown broker {other:?}").into()),
    }
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    report(&kind, clients, total, started.elapsed());
    Ok(())
}

fn report(kind: &str, clients: usize, n: u64, took: Duration) {
    println!(
        "raw {kind}: {clients} clients, {n} steps in {:.1}s = {:.0}/s",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64()
    );
}
