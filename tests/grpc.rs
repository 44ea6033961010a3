//! End-to-end gRPC tests against an in-process sidecar on port 0.

mod common;

use std::time::{Duration, Instant};

use anarchon::claim::*;
use anarchon::error::status_reason;
use anarchon::proto as pb;
use anarchon::store::{self, StoreOptions};
use common::inproc::InProc;
use tonic::Code;

fn req(job: &str, slot: i64) -> pb::ClaimRequest {
    pb::ClaimRequest {
        job: job.into(),
        slot_ms: slot,
        ..Default::default()
    }
}

fn won(r: &pb::ClaimResponse) -> bool {
    r.outcome == pb::Outcome::Won as i32
}

fn now() -> i64 {
    host_now_ms()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_renew_release_history() {
    let s = InProc::start(|_| {}).await;
    let mut c = s.claims().await;
    let slot = now();
    let a = c.claim(req("report", slot)).await.unwrap().into_inner();
    assert!(won(&a), "{a:?}");
    assert_eq!((a.attempt, a.backend.as_str()), (1, "sqlite"));
    assert_eq!(a.token.len(), 32);
    // The 30 s lease is promised only as far as the self-fence reaches:
    // one expiry (1 s) less its margin, counted from the last refresh of
    // this sidecar's liveness record (every expiry/4). docs/safety.md.
    assert!(
        a.valid_for_ms >= 1000 - 100 - 250 - 50 && a.valid_for_ms <= 900,
        "{a:?}"
    );
    let holder = a.holder.clone().unwrap();
    assert_eq!(holder.node.len(), 32);

    // Another caller is told RUNNING and never sees the token.
    let b = c.claim(req("report", slot)).await.unwrap().into_inner();
    assert_eq!(b.outcome, pb::Outcome::Running as i32);
    assert!(b.token.is_empty());
    assert_eq!(b.holder, Some(holder));

    // A resend of the same token is WON again, same attempt.
    let mut again = req("report", slot);
    again.token = a.token.clone();
    let r = c.claim(again).await.unwrap().into_inner();
    assert!(won(&r));
    assert_eq!((r.attempt, r.fencing), (a.attempt, a.fencing));

    let renewed = c
        .renew(pb::RenewRequest {
            job: "report".into(),
            slot_ms: slot,
            token: a.token.clone(),
            lease_ms: 60_000,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(renewed.lease_until_ms > a.lease_until_ms);
    // The store lease is 60 s; what is promised stops at the self-fence.
    assert!(
        renewed.valid_for_ms > 500 && renewed.valid_for_ms <= 900,
        "{renewed:?}"
    );

    let rel = pb::ReleaseRequest {
        job: "report".into(),
        slot_ms: slot,
        token: a.token.clone(),
        result: pb::ReleaseResult::Succeeded as i32,
    };
    c.release(rel.clone()).await.unwrap();
    c.release(rel).await.unwrap(); // idempotent

    let done = c.claim(req("report", slot)).await.unwrap().into_inner();
    assert_eq!(done.outcome, pb::Outcome::Done as i32);
    assert_eq!(done.reason, "succeeded");

    // A stale token is fenced, with the machine-readable reason.
    let st = c
        .renew(pb::RenewRequest {
            job: "report".into(),
            slot_ms: slot,
            token: a.token.clone(),
            lease_ms: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(st.code(), Code::FailedPrecondition);
    assert_eq!(status_reason(&st).as_deref(), Some("fenced"));
    let st = c
        .renew(pb::RenewRequest {
            job: "report".into(),
            slot_ms: slot + 1,
            token: a.token.clone(),
            lease_ms: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(st.code(), Code::NotFound);

    let h = c
        .history(pb::HistoryRequest {
            job: "report".into(),
            limit: 10,
            before_slot_ms: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(h.runs.len(), 1);
    assert_eq!(h.runs[0].state, pb::RunState::Succeeded as i32);
    assert!(h.complete);
    assert!(!h.retention.is_empty());
}

/// Every bad input is INVALID_ARGUMENT naming the field, and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_changes_nothing() {
    let s = InProc::start(|c| c.max_lease_ms = 60_000).await;
    let mut c = s.claims().await;
    let slot = now();
    // A good request with one field made bad.
    let ok = |bad: fn(&mut pb::ClaimRequest)| {
        let mut r = req("ok", slot);
        bad(&mut r);
        r
    };
    let cases: Vec<(&str, pb::ClaimRequest)> = vec![
        ("job", req("", slot)),
        ("job", req(&"x".repeat(201), slot)),
        ("job", req("bad job", slot)),
        ("job", req("<script>", slot)),
        ("slot_ms", req("ok", -1)),
        ("lease_ms", ok(|r| r.lease_ms = -1)),
        ("lease_ms", ok(|r| r.lease_ms = 60_001)),
        ("lease_ms", ok(|r| r.lease_ms = i64::MAX)),
        ("token", ok(|r| r.token = "not-hex".into())),
        ("token", ok(|r| r.token = "A".repeat(32))),
        ("overlap", ok(|r| r.overlap = 42)),
        ("max_late_ms", ok(|r| r.max_late_ms = -1)),
        ("wait_ms", ok(|r| r.wait_ms = -1)),
    ];
    for (field, r) in cases {
        let st = c.claim(r.clone()).await.unwrap_err();
        assert_eq!(st.code(), Code::InvalidArgument, "{field}: {st:?}");
        assert!(
            st.message().contains(field),
            "{field} not named in {:?}",
            st.message()
        );
        assert_eq!(status_reason(&st).as_deref(), Some(field));
        // Hold validates the same way.
        let st = c.hold(r).await.unwrap_err();
        assert_eq!(st.code(), Code::InvalidArgument);
    }
    let st = c
        .release(pb::ReleaseRequest {
            job: "ok".into(),
            slot_ms: slot,
            token: "a".repeat(32),
            result: 99,
        })
        .await
        .unwrap_err();
    assert_eq!(st.code(), Code::InvalidArgument);
    assert!(st.message().contains("result"));
    // Nothing was written for the job the bad requests named.
    let h = c
        .history(pb::HistoryRequest {
            job: "ok".into(),
            limit: 10,
            before_slot_ms: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(h.runs.is_empty(), "{:?}", h.runs);
    // And the slot is still free.
    assert!(won(&c.claim(req("ok", slot)).await.unwrap().into_inner()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_renews_and_a_broken_stream_hands_the_run_over() {
    let s = InProc::start(|_| {}).await;
    let mut c = s.claims().await;
    let slot = now();
    let mut r = req("held", slot);
    r.lease_ms = 300;
    let mut stream = c.hold(r).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.kind, pb::HoldEventKind::Claimed as i32);
    let claim = first.claim.unwrap();
    assert!(won(&claim));
    assert!(claim.valid_for_ms > 0 && claim.valid_for_ms <= 300);
    // Renewals keep it alive past several lease lengths.
    let mut renewals = 0;
    let until = Instant::now() + Duration::from_millis(900);
    while Instant::now() < until {
        let ev = stream.message().await.unwrap().unwrap();
        assert_eq!(ev.kind, pb::HoldEventKind::Renewed as i32);
        assert!(ev.valid_for_ms > 0);
        renewals += 1;
    }
    assert!(renewals >= 3, "renewed {renewals} times");
    let other = c.claim(req("held", slot)).await.unwrap().into_inner();
    assert_eq!(other.outcome, pb::Outcome::Running as i32);
    // The worker dies without a Release: the lease ends at once.
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let r = c.claim(req("held", slot)).await.unwrap().into_inner();
        if won(&r) {
            assert_eq!(r.attempt, 2);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "run not handed over after the hold stream broke"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_reports_lost_lease_and_release() {
    let s = InProc::start(|_| {}).await;
    let mut c = s.claims().await;
    let slot = now();
    let mut r = req("lost", slot);
    r.lease_ms = 300;
    let mut stream = c.hold(r).await.unwrap().into_inner();
    let claim = stream.message().await.unwrap().unwrap().claim.unwrap();
    assert!(won(&claim));
    // Someone else takes the run over in the store, treating our holder as dead.
    let store = store::open(&s.backend, &StoreOptions::default())
        .await
        .unwrap();
    let mut dead = DeadHolders::none();
    let h = claim.holder.clone().unwrap();
    dead.mark_dead(Holder {
        node: h.node,
        instance: h.instance,
    });
    let spec = ClaimSpec {
        job: Job::parse("lost").unwrap(),
        slot_ms: slot,
        token: Token::generate(),
        holder: Holder {
            node: "thief".into(),
            instance: 1,
        },
        lease_ms: 30_000,
        max_late_ms: 60_000,
        overlap: Overlap::Allow,
        max_attempts: 3,
    };
    let taken = store.claim(&spec, &dead).await.unwrap();
    assert_eq!((taken.outcome, taken.attempt), (Outcome::Won, 2));
    let lost = loop {
        let ev = stream
            .message()
            .await
            .unwrap()
            .expect("stream ended without LOST_LEASE");
        if ev.kind != pb::HoldEventKind::Renewed as i32 {
            break ev;
        }
    };
    assert_eq!(lost.kind, pb::HoldEventKind::LostLease as i32);
    assert_eq!(lost.reason, "fenced");
    assert!(
        stream.message().await.unwrap().is_none(),
        "the stream ends after LOST_LEASE"
    );

    // A hold that is released reports RELEASED and ends.
    let mut r = req("released", slot);
    r.lease_ms = 300;
    let mut stream = c.hold(r).await.unwrap().into_inner();
    let claim = stream.message().await.unwrap().unwrap().claim.unwrap();
    c.release(pb::ReleaseRequest {
        job: "released".into(),
        slot_ms: slot,
        token: claim.token,
        result: pb::ReleaseResult::Failed as i32,
    })
    .await
    .unwrap();
    let ev = loop {
        let ev = stream.message().await.unwrap().unwrap();
        if ev.kind != pb::HoldEventKind::Renewed as i32 {
            break ev;
        }
    };
    assert_eq!(ev.kind, pb::HoldEventKind::Released as i32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_ms_wins_right_after_release_and_honours_deadline() {
    let s = InProc::start(|_| {}).await;
    let mut c = s.claims().await;
    // A lock (slot 0) is free again once released, so a waiter can win it.
    let lock = c.claim(req("waitlock", 0)).await.unwrap().into_inner();
    assert!(won(&lock));
    let mut waiter = s.claims().await;
    let w = tokio::spawn(async move {
        let mut r = req("waitlock", 0);
        r.wait_ms = 10_000;
        let out = waiter.claim(r).await.unwrap().into_inner();
        (out, Instant::now())
    });
    // Not a wait for a condition: nothing outside the sidecar shows that
    // the waiter is parked in its wait. 300 ms lets it get there; if it
    // has not, it wins at once after the release and the test still holds.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released_at = Instant::now();
    c.release(pb::ReleaseRequest {
        job: "waitlock".into(),
        slot_ms: 0,
        token: lock.token,
        result: pb::ReleaseResult::Succeeded as i32,
    })
    .await
    .unwrap();
    let (out, at) = w.await.unwrap();
    assert!(won(&out), "{out:?}");
    assert_eq!(out.attempt, 1, "a relock is a new run");
    assert!(out.fencing > lock.fencing);
    let delay = at.duration_since(released_at);
    assert!(
        delay < Duration::from_millis(100),
        "waiter won {delay:?} after the release"
    );

    // A wait longer than the client's deadline answers RUNNING before it.
    let mut r = tonic::Request::new(pb::ClaimRequest {
        wait_ms: 10_000,
        ..req("waitlock", 0)
    });
    r.set_timeout(Duration::from_millis(500));
    let t = Instant::now();
    let out = c.claim(r).await.unwrap().into_inner();
    assert_eq!(out.outcome, pb::Outcome::Running as i32);
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(500),
        "{took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reflection_metrics_and_readiness() {
    let s = InProc::start(|_| {}).await;
    let ch = s.channel().await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(ch.clone());
    let st = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        st.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    let mut c = s.claims().await;
    c.claim(req("metered", now())).await.unwrap();
    c.claim(req("metered", 5)).await.unwrap(); // LATE
    let body = common::http_get(s.admin, "/metrics", None).await;
    assert!(
        body.contains("anarchon_claims_total{outcome=\"WON\",backend=\"sqlite\"} 1"),
        "{body}"
    );
    assert!(
        body.contains("anarchon_claims_total{outcome=\"LATE\",backend=\"sqlite\"} 1"),
        "{body}"
    );
    assert!(
        body.contains("anarchon_rpc_duration_seconds_bucket"),
        "{body}"
    );
    assert!(common::http_get(s.admin, "/readyz", None)
        .await
        .starts_with("ready"));
    assert!(common::http_get(s.admin, "/healthz", None)
        .await
        .starts_with("ok"));
    // Reflection lists our services.
    let msg = reflection_v1_services(ch).await;
    assert!(
        msg.contains("anarchon.v1.Claims") && msg.contains("anarchon.v1.Mesh"),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_stop_ends_held_leases() {
    let mut s = InProc::start(|_| {}).await;
    let mut c = s.claims().await;
    let slot = now();
    let a = c.claim(req("leaving", slot)).await.unwrap().into_inner();
    assert!(won(&a));
    let backend = s.backend.clone();
    s.stop().await;
    let store = store::open(&backend, &StoreOptions::default())
        .await
        .unwrap();
    let spec = ClaimSpec {
        job: Job::parse("leaving").unwrap(),
        slot_ms: slot,
        token: Token::generate(),
        holder: Holder {
            node: "next".into(),
            instance: 1,
        },
        lease_ms: 30_000,
        max_late_ms: 60_000,
        overlap: Overlap::Allow,
        max_attempts: 3,
    };
    let b = store.claim(&spec, &DeadHolders::none()).await.unwrap();
    assert_eq!(
        (b.outcome, b.attempt),
        (Outcome::Won, 2),
        "the leaver's lease must end at once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_answer_with_a_clear_status() {
    let s = InProc::start(|c| {
        c.max_holds_per_client = 2;
        c.max_request_bytes = 4096;
    })
    .await;
    let mut c = s.claims().await;
    // An oversized request is refused before it is decoded.
    let st = c
        .claim(pb::ClaimRequest {
            job: "big".into(),
            token: "a".repeat(10_000),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        matches!(st.code(), Code::OutOfRange | Code::ResourceExhausted),
        "{st:?}"
    );
    assert!(st.message().contains("max_request_bytes"), "{st:?}");
    // Hold streams per client are bounded; closing one frees its place.
    let mut open = Vec::new();
    for i in 0..2 {
        let mut st = c.hold(req(&format!("h{i}"), 0)).await.unwrap().into_inner();
        assert!(won(&st.message().await.unwrap().unwrap().claim.unwrap()));
        open.push(st);
    }
    let st = c.hold(req("h2", 0)).await.unwrap_err();
    assert_eq!(st.code(), Code::ResourceExhausted);
    assert!(st.message().contains("max_holds_per_client"), "{st:?}");
    // Nothing was claimed by the refused hold.
    let h = c
        .history(pb::HistoryRequest {
            job: "h2".into(),
            limit: 5,
            before_slot_ms: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(h.runs.is_empty());
    drop(open.pop());
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match c.hold(req("h2", 0)).await {
            Ok(resp) => {
                let mut stream = resp.into_inner();
                assert!(won(&stream
                    .message()
                    .await
                    .unwrap()
                    .unwrap()
                    .claim
                    .unwrap()));
                break;
            }
            Err(e) => {
                assert_eq!(e.code(), Code::ResourceExhausted);
                assert!(
                    Instant::now() < deadline,
                    "the closed hold's place was never freed"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// A codec that sends and receives raw bytes, to send what no generated
/// client would: a body that is not valid protobuf.
#[derive(Clone, Copy, Default)]
struct RawCodec;

struct RawEncoder;
struct RawDecoder;

impl tonic::codec::Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use prost::bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawDecoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        use prost::bytes::Buf;
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

/// The `anarchon_errors_total{kind}` sample, 0 when absent.
fn errors_total(metrics: &str, kind: &str) -> u64 {
    let prefix = format!("anarchon_errors_total{{kind=\"{kind}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Issue 21 (9): what standard tools and other people's clients meet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_tools_reflection_health_metrics_and_bad_bodies() {
    let s = InProc::start(|c| c.max_request_bytes = 4096).await;
    let ch = s.channel().await;

    // Health: the Mesh service has its own SERVING status.
    let mut health = tonic_health::pb::health_client::HealthClient::new(ch.clone());
    for service in ["", "anarchon.v1.Claims", "anarchon.v1.Mesh"] {
        let st = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap_or_else(|e| panic!("Check({service:?}): {e:?}"))
            .into_inner();
        assert_eq!(
            st.status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
            "{service}"
        );
    }

    // Reflection v1alpha (Python grpcio-reflection, grpc-requests) and v1
    // both list our services and grpc.health.v1.Health.
    {
        use tonic_reflection::pb::v1alpha::{
            server_reflection_client::ServerReflectionClient,
            server_reflection_request::MessageRequest, ServerReflectionRequest,
        };
        let mut refl = ServerReflectionClient::new(ch.clone());
        let reqs = tokio_stream::iter(vec![
            ServerReflectionRequest {
                host: String::new(),
                message_request: Some(MessageRequest::ListServices(String::new())),
            },
            ServerReflectionRequest {
                host: String::new(),
                message_request: Some(MessageRequest::FileContainingSymbol(
                    "grpc.health.v1.Health".into(),
                )),
            },
        ]);
        let mut resp = refl
            .server_reflection_info(reqs)
            .await
            .expect("reflection v1alpha is served")
            .into_inner();
        let list = format!("{:?}", resp.message().await.unwrap().unwrap());
        for svc in [
            "anarchon.v1.Claims",
            "anarchon.v1.Mesh",
            "grpc.health.v1.Health",
        ] {
            assert!(list.contains(svc), "v1alpha lists no {svc}: {list}");
        }
        let file = format!("{:?}", resp.message().await.unwrap().unwrap());
        assert!(file.contains("FileDescriptorResponse"), "{file}");
    }
    let list = reflection_v1_services(ch.clone()).await;
    assert!(list.contains("grpc.health.v1.Health"), "{list}");

    // A body that is not protobuf: INVALID_ARGUMENT, counted.
    let before = common::http_get(s.admin, "/metrics", None).await;
    let mut raw = tonic::client::Grpc::new(ch.clone());
    raw.ready().await.unwrap();
    let st = raw
        .unary(
            tonic::Request::new(vec![0xff, 0xff, 0xff]),
            tonic::codegen::http::uri::PathAndQuery::from_static("/anarchon.v1.Claims/Claim"),
            RawCodec,
        )
        .await
        .unwrap_err();
    assert_eq!(st.code(), Code::InvalidArgument, "{st:?}");
    assert!(st.message().contains("protobuf"), "{st:?}");
    let after = common::http_get(s.admin, "/metrics", None).await;
    assert_eq!(
        errors_total(&after, "invalid_argument"),
        errors_total(&before, "invalid_argument") + 1,
        "{after}"
    );

    // Too large: the status names the config key.
    let mut c = s.claims().await;
    let st = c
        .claim(pb::ClaimRequest {
            job: "x".repeat(1 << 20),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(st.message().contains("max_request_bytes"), "{st:?}");

    // /metrics: Prometheus text 0.0.4 by default, with HELP and TYPE lines
    // that name the counters' samples; OpenMetrics when asked.
    c.claim(req("metered", now())).await.unwrap();
    let (head, text) = common::http_get_with(s.admin, "/metrics", &[]).await;
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    assert!(text.contains("# HELP anarchon_claims_total "), "{text}");
    assert!(
        text.contains("# TYPE anarchon_claims_total counter"),
        "{text}"
    );
    assert!(!text.contains("# EOF"), "{text}");
    let (head, om) = common::http_get_with(
        s.admin,
        "/metrics",
        &["Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"],
    )
    .await;
    assert!(head.contains("application/openmetrics-text"), "{head}");
    assert!(om.contains("# TYPE anarchon_claims counter"), "{om}");
    assert!(om.trim_end().ends_with("# EOF"), "{om}");
}

/// Issue 21 (2, 4, 5) through gRPC: a renew without a lease keeps the
/// claimed one; a wrong token is `not_holder`, not a takeover; re-taking a
/// released lock is attempt 1 and leaves anarchon_takeovers_total alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_wrong_token_and_relock_through_grpc() {
    // A long expiry: the self-fence then never caps a 5 s lease's valid_for.
    let s = InProc::start(|c| c.expiry_ms = 30_000).await;
    let mut c = s.claims().await;
    let a = c
        .claim(pb::ClaimRequest {
            lease_ms: 5_000,
            ..req("renewkeep", 0)
        })
        .await
        .unwrap()
        .into_inner();
    assert!(won(&a));
    let r = c
        .renew(pb::RenewRequest {
            job: "renewkeep".into(),
            slot_ms: 0,
            token: a.token.clone(),
            lease_ms: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.valid_for_ms, 5_000, "{r:?}");

    let st = c
        .release(pb::ReleaseRequest {
            job: "renewkeep".into(),
            slot_ms: 0,
            token: "f".repeat(32),
            result: pb::ReleaseResult::Succeeded as i32,
        })
        .await
        .unwrap_err();
    assert_eq!(st.code(), Code::FailedPrecondition);
    assert_eq!(status_reason(&st).as_deref(), Some("fenced"));
    assert!(st.message().contains("not_holder"), "{st:?}");
    assert_eq!(
        st.metadata()
            .get("anarchon-fence-reason")
            .and_then(|v| v.to_str().ok()),
        Some("not_holder")
    );

    c.release(pb::ReleaseRequest {
        job: "renewkeep".into(),
        slot_ms: 0,
        token: a.token.clone(),
        result: pb::ReleaseResult::Succeeded as i32,
    })
    .await
    .unwrap();
    let again = c.claim(req("renewkeep", 0)).await.unwrap().into_inner();
    assert!(won(&again));
    assert_eq!(again.attempt, 1, "a relock is a new run: {again:?}");
    assert!(again.fencing > a.fencing);
    let m = common::http_get(s.admin, "/metrics", None).await;
    assert!(m.contains("anarchon_takeovers_total 0"), "{m}");
}

/// The services gRPC reflection (v1) lists, as the debug text of its answer.
async fn reflection_v1_services(ch: tonic::transport::Channel) -> String {
    use tonic_reflection::pb::v1::{
        server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, ServerReflectionRequest,
    };
    let reqs = tokio_stream::iter(vec![ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    }]);
    let mut resp = ServerReflectionClient::new(ch)
        .server_reflection_info(reqs)
        .await
        .unwrap()
        .into_inner();
    format!("{:?}", resp.message().await.unwrap().unwrap())
}

/// `listen_unix`: the same services on a Unix socket beside the TCP
/// listener, on the same store, with the same auth and the same per-client
/// Hold limit (every Unix-socket client counts as the loopback client); the
/// socket file is gone once the sidecar has stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applications_reach_the_sidecar_over_its_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("anarchon.sock");
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let (sock2, token2) = (sock.clone(), token.clone());
    let mut s = InProc::start(move |c| {
        c.listen_unix = sock2;
        c.auth_token_file = Some(token2);
        c.max_holds_per_client = 1;
    })
    .await;
    let opts = |server: &str, token: Option<&std::path::Path>| anarchon::cli::ClientOpts {
        server: server.into(),
        json: false,
        auth_token_file: token.map(|t| t.to_owned()),
        tls_ca: None,
        tls_client_cert: None,
        tls_client_key: None,
    };
    let unix = format!("unix:{}", sock.display());
    // Without the token: refused on the socket as on TCP.
    let (mut anon, _) = anarchon::cli::client::connect(&opts(&unix, None))
        .await
        .unwrap();
    // A slot a moment old. (It was the start of the current minute, which a
    // claim sent in a minute's last milliseconds reached more than the
    // default 60 s of lateness after: `LATE`, once in a CI run.)
    let slot = now();
    let st = anon.claim(req("uds", slot)).await.unwrap_err();
    assert_eq!(st.code(), Code::Unauthenticated, "{st:?}");
    // With it: won over the socket; the same slot over TCP is the same run.
    let (mut c, mut m) = anarchon::cli::client::connect(&opts(&unix, Some(&token)))
        .await
        .unwrap();
    let r = c.claim(req("uds", slot)).await.unwrap().into_inner();
    assert!(won(&r), "{r:?}");
    let tcp = s.addr.to_string();
    let (mut t, _) = anarchon::cli::client::connect(&opts(&tcp, Some(&token)))
        .await
        .unwrap();
    let r2 = t.claim(req("uds", slot)).await.unwrap().into_inner();
    assert_eq!(r2.outcome, pb::Outcome::Running as i32, "{r2:?}");
    // The mesh's application calls answer there too.
    m.list_peers(pb::ListPeersRequest::default()).await.unwrap();
    // One Hold stream per client: a second one over the socket is refused.
    let mut held = c.hold(req("uds-hold", slot)).await.unwrap().into_inner();
    assert!(won(&held.message().await.unwrap().unwrap().claim.unwrap()));
    let st = c.hold(req("uds-hold-2", slot)).await.unwrap_err();
    assert_eq!(st.code(), Code::ResourceExhausted, "{st:?}");
    drop(held);
    drop((anon, c, m, t));
    assert!(sock.exists());
    s.stop().await;
    assert!(!sock.exists(), "the socket file outlived the sidecar");
}

/// The error of a `listen_unix` bind of `path` that must be refused; it
/// names the key.
fn bind_refused(path: &std::path::Path) -> String {
    let e = anarchon::server::UnixSocket::bind(path, false)
        .err()
        .expect("the bind should have been refused")
        .to_string();
    assert!(e.contains("listen_unix"), "{e}");
    e
}

/// `listen_unix` never removes what is not a stale socket: a regular file
/// and a socket a live server answers on are refused, naming the key, and
/// left as they were; a socket file nobody answers on is replaced.
#[tokio::test]
async fn listen_unix_replaces_only_a_stale_socket() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-socket");
    std::fs::write(&file, "keep me").unwrap();
    let e = bind_refused(&file);
    assert!(e.contains("not a socket"), "{e}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");

    let live = dir.path().join("live.sock");
    let first = anarchon::server::UnixSocket::bind(&live, false).unwrap();
    let e = bind_refused(&live);
    assert!(e.contains("answers"), "{e}");
    assert!(live.exists());
    drop(first);
    assert!(!live.exists());

    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(stale.exists(), "a dropped std listener leaves its file");
    let again = anarchon::server::UnixSocket::bind(&stale, false).unwrap();
    assert_eq!(again.path(), stale.as_path());
    assert!(std::os::unix::net::UnixStream::connect(&stale).is_ok());
}

/// The socket's mode is set, not left to the umask: 0600 (its user only),
/// or 0660 with `listen_unix_group`; it reaches its path only with that
/// mode (bound as PATH.tmp, which is gone afterwards), and it answers.
#[tokio::test]
async fn listen_unix_sets_the_socket_mode() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    for (group, want) in [(false, 0o600), (true, 0o660)] {
        let path = dir.path().join(format!("group-{group}.sock"));
        let socket = anarchon::server::UnixSocket::bind(&path, group).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, want, "group={group}");
        let mut tmp = path.clone().into_os_string();
        tmp.push(".tmp");
        assert!(!std::path::Path::new(&tmp).exists(), "{tmp:?} was left");
        assert!(std::os::unix::net::UnixStream::connect(&path).is_ok());
        drop(socket);
        assert!(!path.exists());
    }
    // A regular file where the temporary name goes is refused and kept.
    let path = dir.path().join("blocked.sock");
    std::fs::write(dir.path().join("blocked.sock.tmp"), "keep me").unwrap();
    let e = bind_refused(&path);
    assert!(e.contains("not a socket"), "{e}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("blocked.sock.tmp")).unwrap(),
        "keep me"
    );
    assert!(!path.exists());
}
