//! The Redis store in a fleet: a fair share of the in-flight cap between processes, the
//! failure policy while Redis is stopped, scripts reloaded after a restart, leases of a
//! killed process freed by their TTL, and four processes sharing one quota against the
//! simulated gateway. Each test starts its own `redis-server` (tests/common/redis.rs).
//!
//! Only the fair-share test runs on paused time; the others talk to a real server and wait
//! on real time (bounded by timeouts; no test asserts how long anything took).

#![cfg(feature = "redis")]

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::redis::RedisServer;
use reqwest_throttle::store::{Admission, Limits, OnUnavailable, RedisStore, ScopeId, Store};
use reqwest_throttle::{Throttle, ThrottleError};

/// A store on `server`: short timeout so a stopped Redis is noticed fast.
fn store(server: &RedisServer, policy: OnUnavailable) -> RedisStore {
    RedisStore::builder(server.url())
        .timeout(Some(Duration::from_millis(100)))
        .on_unavailable(policy)
        .build()
        .expect("a valid URL")
}

/// A throttle on `store`: 2 in flight, one global scope.
fn throttle(store: RedisStore) -> Throttle {
    Throttle::builder()
        .max_in_flight(2)
        .scope(reqwest_throttle::Scope::global())
        .store(store)
        .build()
        .expect("valid settings")
}

/// `acquire(1)` must answer within 2 s (the store's timeout is 100 ms).
async fn acquire(t: &Throttle) -> Result<reqwest_throttle::Permit, ThrottleError> {
    tokio::time::timeout(Duration::from_secs(2), t.acquire(1))
        .await
        .expect("admission answered within the bound")
}

/// Leases of the global scope held in Redis now.
fn leases_in_redis(server: &RedisServer) -> usize {
    let keys = server.cli(&["--scan", "--pattern", "*:leases"]);
    keys.lines()
        .map(|k| server.cli(&["ZCARD", k]).parse::<usize>().unwrap_or(0))
        .sum()
}

#[tokio::test(start_paused = true)]
async fn a_process_over_its_fair_share_yields_a_released_slot_to_a_waiting_one() {
    let Some(server) = common::redis::shared() else {
        return;
    };
    let make = || common::redis::exact_store(server);
    let (a, b) = (make(), make());
    let id = ScopeId::from_u128(uuid::Uuid::new_v4().as_u128());
    let limits = Limits::new().with_max_in_flight(Some(4));
    let (sa, sb) = (a.open(id, &limits), b.open(id, &limits));
    let mut held = Vec::new();
    for _ in 0..4 {
        match a.admit(&sa, 1).await.unwrap() {
            Admission::Admitted(lease) => held.push(lease),
            other => panic!("a alone: {other:?}"),
        }
    }
    assert_eq!(b.admit(&sb, 1).await.unwrap(), Admission::InFlightFull);
    a.release(&sa, held.pop().unwrap());
    // b waits; a holds 3 of 4, above its share of 2: the freed slot is b's.
    assert_eq!(a.admit(&sa, 1).await.unwrap(), Admission::InFlightFull);
    assert!(matches!(
        b.admit(&sb, 1).await.unwrap(),
        Admission::Admitted(_)
    ));
}

#[tokio::test]
async fn stopped_redis_applies_each_failure_policy_within_the_timeout_then_resumes() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let local = throttle(store(&server, OnUnavailable::LocalLimits));
    let open = throttle(store(&server, OnUnavailable::FailOpen));
    let closed = throttle(store(&server, OnUnavailable::FailClosed));
    for t in [&local, &open, &closed] {
        drop(acquire(t).await.expect("Redis answers"));
    }
    server.signal("STOP");
    // Local limits: this process's own cap of 2 holds.
    let (p1, p2) = (
        acquire(&local).await.unwrap(),
        acquire(&local).await.unwrap(),
    );
    let third = tokio::time::timeout(Duration::from_millis(300), local.acquire(1)).await;
    assert!(third.is_err(), "the local cap of 2 held a third request");
    drop((p1, p2));
    // Fail open: admitted, counting nothing.
    let permits: Vec<_> = futures::future::join_all((0..5).map(|_| acquire(&open))).await;
    assert!(permits.iter().all(Result::is_ok), "fail open admits all");
    // Fail closed: a typed error.
    match acquire(&closed).await {
        Err(ThrottleError::StoreUnavailable(_)) => {}
        other => panic!("fail closed answered {other:?}"),
    }
    for t in [&local, &open, &closed] {
        assert!(t.stats().store_errors > 0, "store errors counted");
    }
    server.signal("CONT");
    drop(permits);
    // Back on Redis after the pause (at most 5 s): a lease is counted there again.
    back_on_redis(&server, &closed).await;
}

/// Waits (at most 10 s) until an admission of `t` is counted in Redis.
async fn back_on_redis(server: &RedisServer, t: &Throttle) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(permit) = acquire(t).await {
            let counted = leases_in_redis(server) > 0;
            drop(permit);
            if counted {
                return;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "admission never went back to Redis"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_restarted_redis_reloads_the_scripts_and_no_error_reaches_the_caller() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let t = throttle(store(&server, OnUnavailable::LocalLimits));
    drop(acquire(&t).await.unwrap());
    assert_eq!(server.cli(&["SCRIPT", "FLUSH"]), "OK");
    drop(acquire(&t).await.expect("NOSCRIPT answered by reloading"));
    assert_eq!(t.stats().store_errors, 0, "a flushed script is no error");
    // A restart on the same port: the connection breaks, the local limits answer meanwhile.
    let port = server.port;
    drop(server);
    let server = RedisServer::start_on(port).expect("redis-server restarts");
    for _ in 0..20 {
        drop(acquire(&t).await.expect("no error reaches the caller"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    back_on_redis(&server, &t).await;
    assert!(t.stats().store_errors > 0, "the restart was noticed");
}

#[tokio::test]
async fn a_key_holding_something_unexpected_is_a_clear_error_not_a_panic() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let t = throttle(store(&server, OnUnavailable::FailClosed));
    drop(acquire(&t).await.unwrap());
    let leases = server.cli(&["--scan", "--pattern", "*:leases"]);
    let cooldown = leases.replace(":leases", ":cooldown");
    // A cooldown that is not a number, then a leases key of the wrong type.
    assert_eq!(server.cli(&["SET", &cooldown, "garbage"]), "OK");
    match acquire(&t).await {
        Err(ThrottleError::StoreUnavailable(e)) => {
            assert!(e.to_string().contains("corrupt cooldown"), "{e}");
        }
        other => panic!("a corrupt cooldown answered {other:?}"),
    }
    assert_eq!(server.cli(&["DEL", &cooldown]), "1");
    assert_eq!(server.cli(&["DEL", &leases]), "0");
    assert_eq!(server.cli(&["SET", &leases, "x"]), "OK");
    tokio::time::sleep(Duration::from_millis(300)).await; // past the pause after a failure
    match acquire(&t).await {
        Err(ThrottleError::StoreUnavailable(e)) => {
            assert!(e.to_string().contains("WRONGTYPE"), "{e}");
        }
        other => panic!("a leases key of the wrong type answered {other:?}"),
    }
}

#[tokio::test]
async fn every_key_has_an_expiry() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = store(&server, OnUnavailable::FailClosed);
    let limits = Limits::new()
        .with_max_in_flight(Some(1))
        .with_window(reqwest_throttle::store::WindowQuota::new(
            std::num::NonZeroU32::new(5).unwrap(),
            Duration::from_secs(60),
            Duration::ZERO,
        ))
        .with_bucket(reqwest_throttle::Quota::per_minute(
            std::num::NonZeroU32::new(5).unwrap(),
        ));
    let scope = store.open(ScopeId::from_u128(7), &limits);
    let Admission::Admitted(lease) = store.admit(&scope, 2).await.unwrap() else {
        panic!("a fresh scope admits");
    };
    assert_eq!(
        store.admit(&scope, 1).await.unwrap(),
        Admission::InFlightFull
    );
    store
        .close_cooldown(&scope, Duration::from_secs(5))
        .await
        .unwrap();
    store.release(&scope, lease);
    let keys = server.cli(&["--scan"]);
    let keys: Vec<&str> = keys.lines().collect();
    assert_eq!(
        keys.len(),
        6,
        "cooldown, leases, waiting, window log and units, bucket: {keys:?}"
    );
    for key in keys {
        let ttl: i64 = server.cli(&["PTTL", key]).parse().unwrap();
        assert!(ttl > 0, "{key} has no expiry ({ttl})");
    }
}

#[tokio::test]
async fn a_report_of_tokens_remaining_costs_no_round_trip_without_a_token_window() {
    let Some(server) = common::redis::shared() else {
        return;
    };
    let store = RedisStore::new(server.url()).unwrap();
    let limits = Limits::new().with_window(reqwest_throttle::store::WindowQuota::new(
        std::num::NonZeroU32::new(10).unwrap(),
        Duration::from_secs(60),
        Duration::ZERO,
    ));
    let scope = store.open(ScopeId::from_u128(uuid::Uuid::new_v4().as_u128()), &limits);
    let Admission::Admitted(lease) = store.admit(&scope, 1).await.unwrap() else {
        panic!("a fresh scope admits");
    };
    let before = store.commands();
    let report = reqwest_throttle::store::Settlement::tokens_remaining(0);
    store.settle(&scope, lease, report).await.unwrap();
    assert_eq!(store.commands(), before, "no token window: nothing to send");
}

/// The child side of the tests below: runs only when the parent sets the role.
#[test]
fn child_process() {
    let Ok(role) = std::env::var("REQWEST_THROTTLE_TEST_CHILD") else {
        return;
    };
    let url = std::env::var("REQWEST_THROTTLE_TEST_REDIS").unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        match role.as_str() {
            "hold" => {
                let store = RedisStore::builder(url)
                    .lease_ttl(Duration::from_secs(2))
                    .build()
                    .unwrap();
                let t = throttle(store);
                let held = (acquire(&t).await.unwrap(), acquire(&t).await.unwrap());
                println!("held");
                tokio::time::sleep(Duration::from_secs(600)).await;
                drop(held);
            }
            "swarm" => {
                let gateway = std::env::var("REQWEST_THROTTLE_TEST_GATEWAY").unwrap();
                let summary = swarm(&url, &gateway, 45).await;
                println!("summary: {summary}");
            }
            other => panic!("unknown child role {other}"),
        }
    });
}

fn spawn_child(role: &str, server: &RedisServer, gateway: Option<&str>) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_process", "--nocapture", "--quiet"])
        .env("REQWEST_THROTTLE_TEST_CHILD", role)
        .env("REQWEST_THROTTLE_TEST_REDIS", server.url())
        .env("REQWEST_THROTTLE_TEST_GATEWAY", gateway.unwrap_or(""))
        .stdout(Stdio::piped())
        .spawn()
        .expect("the test binary starts again as a child")
}

#[tokio::test]
async fn leases_of_a_killed_process_are_free_again_within_the_ttl() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let mut child = spawn_child("hold", &server, None);
    let out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut lines = std::io::BufRead::lines(out);
    assert!(
        lines.any(|l| l.is_ok_and(|l| l == "held")),
        "the child said it holds its leases"
    );
    assert_eq!(leases_in_redis(&server), 2);
    let t = throttle(RedisStore::new(server.url()).unwrap());
    let refused = tokio::time::timeout(Duration::from_millis(500), t.acquire(1)).await;
    assert!(refused.is_err(), "the child holds both slots");
    child.kill().unwrap(); // SIGKILL: no release is sent.
    child.wait().unwrap();
    // The lease TTL is 2 s: both slots free again well within 10 s.
    let permits = tokio::time::timeout(Duration::from_secs(10), async {
        (t.acquire(1).await.unwrap(), t.acquire(1).await.unwrap())
    })
    .await
    .expect("the killed process's leases expired");
    drop(permits);
}

/// `n` requests from 8 agents through a throttle on Redis with the gateway's limits; the
/// summary as `ok failures 429s`.
async fn swarm(redis: &str, gateway: &str, n: usize) -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let store = RedisStore::new(redis).unwrap();
    let t = Throttle::builder()
        .sliding_window(GATEWAY_WINDOW_LIMIT, GATEWAY_WINDOW)
        .max_in_flight(GATEWAY_PARALLEL as usize)
        .store(store)
        .build()
        .unwrap();
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(t.clone())
        .build();
    let next = AtomicUsize::new(0);
    let ok = AtomicUsize::new(0);
    let agents = (0..8).map(|_| async {
        while next.fetch_add(1, Ordering::Relaxed) < n {
            let r = client
                .get(format!("{gateway}/v1/chat"))
                .header("authorization", "Bearer fleet")
                .send()
                .await;
            if let Ok(r) = r {
                if r.status().is_success() && r.bytes().await.is_ok() {
                    ok.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    });
    futures::future::join_all(agents).await;
    let ok = ok.into_inner();
    format!("{ok} {} {}", n - ok, t.stats().responses_429)
}

const GATEWAY_WINDOW_LIMIT: u32 = 40;
const GATEWAY_WINDOW: Duration = Duration::from_secs(2);
const GATEWAY_PARALLEL: u32 = 6;

#[test]
fn four_processes_share_one_quota_against_the_gateway() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    use reqwest_throttle::testing::{Gateway, GatewayConfig};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _guard = rt.enter();
    let config = GatewayConfig::seed_limits()
        .with_requests_per_window(GATEWAY_WINDOW_LIMIT)
        .with_window(GATEWAY_WINDOW)
        .with_max_parallel(GATEWAY_PARALLEL)
        .with_service_time(Duration::from_millis(20));
    let gateway = Gateway::start(config).unwrap();
    let children: Vec<_> = (0..4)
        .map(|_| spawn_child("swarm", &server, Some(&gateway.url())))
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let summary = text
            .lines()
            .find_map(|l| l.strip_prefix("summary: "))
            .unwrap_or("");
        assert_eq!(summary, "45 0 0", "a child's ok, failures and 429s");
    }
    let stats = gateway.stats();
    assert_eq!(stats.admitted, 180);
    assert_eq!(
        stats.refused_parallel + stats.refused_window,
        0,
        "{stats:?}"
    );
    assert!(stats.max_in_window <= GATEWAY_WINDOW_LIMIT, "{stats:?}");
    assert!(stats.peak_parallel <= GATEWAY_PARALLEL, "{stats:?}");
}

/// The leases key of scope `id` under the default namespace.
fn leases_key(id: ScopeId) -> String {
    format!("reqwest-throttle:{{{:032x}}}:leases", id.as_u128())
}

#[tokio::test]
async fn an_admission_dropped_while_redis_runs_its_script_leases_no_slot() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = RedisStore::builder(server.url())
        .timeout(None)
        .build()
        .unwrap();
    let id = ScopeId::from_u128(uuid::Uuid::new_v4().as_u128());
    let scope = store.open(id, &Limits::new().with_max_in_flight(Some(1)));
    let Admission::Admitted(lease) = store.admit(&scope, 1).await.unwrap() else {
        panic!("a fresh scope admits");
    };
    store.release(&scope, lease);
    server.signal("STOP");
    // Sent, then dropped before Redis answers (a caller's deadline, say).
    let dropped = tokio::time::timeout(Duration::from_millis(200), store.admit(&scope, 1)).await;
    assert!(dropped.is_err(), "a stopped Redis answered");
    server.signal("CONT");
    // Redis runs the dropped admission's script, then this one: the slot is free again.
    let Admission::Admitted(lease) = store.admit(&scope, 1).await.unwrap() else {
        panic!("the dropped admission kept the only slot");
    };
    store.release(&scope, lease);
}

#[tokio::test]
async fn two_scopes_of_one_id_in_one_store_both_send_their_releases() {
    let Some(server) = common::redis::shared() else {
        return;
    };
    // Two throttles on one store, say: each opens the scope of the same key.
    let store = RedisStore::new(server.url()).unwrap();
    let id = ScopeId::from_u128(uuid::Uuid::new_v4().as_u128());
    let limits = Limits::new().with_max_in_flight(Some(2));
    let (first, second) = (store.open(id, &limits), store.open(id, &limits));
    let Admission::Admitted(lease) = store.admit(&first, 1).await.unwrap() else {
        panic!("a fresh scope admits");
    };
    let Admission::Admitted(_held) = store.admit(&second, 1).await.unwrap() else {
        panic!("a second slot");
    };
    store.release(&first, lease);
    // The lease task sends the release (no admission of the first scope follows).
    for _ in 0..100 {
        if server.cli(&["ZCARD", &leases_key(id)]) == "1" {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the first scope's release never reached Redis");
}

#[tokio::test]
async fn releases_pending_when_the_store_is_dropped_still_reach_redis() {
    let Some(server) = common::redis::shared() else {
        return;
    };
    let store = RedisStore::new(server.url()).unwrap();
    let id = ScopeId::from_u128(uuid::Uuid::new_v4().as_u128());
    let scope = store.open(id, &Limits::new().with_max_in_flight(Some(1)));
    let Admission::Admitted(lease) = store.admit(&scope, 1).await.unwrap() else {
        panic!("a fresh scope admits");
    };
    store.release(&scope, lease);
    // A process done with its throttle: the last handles go before the lease task ran.
    drop((scope, store));
    for _ in 0..100 {
        if server.cli(&["ZCARD", &leases_key(id)]) == "0" {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the release was lost with the store");
}

#[tokio::test(start_paused = true)]
async fn with_one_slot_a_process_that_released_it_yields_it_to_a_waiting_one() {
    let Some(server) = common::redis::shared() else {
        return;
    };
    let make = || common::redis::exact_store(server);
    let (a, b) = (make(), make());
    let id = ScopeId::from_u128(uuid::Uuid::new_v4().as_u128());
    let limits = Limits::new().with_max_in_flight(Some(1));
    let (sa, sb) = (a.open(id, &limits), b.open(id, &limits));
    let Admission::Admitted(lease) = a.admit(&sa, 1).await.unwrap() else {
        panic!("a fresh scope admits");
    };
    assert_eq!(b.admit(&sb, 1).await.unwrap(), Admission::InFlightFull);
    a.release(&sa, lease);
    // b waits: a asks first, but the freed slot is b's; then a's, while a waits.
    assert_eq!(a.admit(&sa, 1).await.unwrap(), Admission::InFlightFull);
    let Admission::Admitted(lease) = b.admit(&sb, 1).await.unwrap() else {
        panic!("b waited for the slot a released");
    };
    b.release(&sb, lease);
    assert_eq!(b.admit(&sb, 1).await.unwrap(), Admission::InFlightFull);
    let Admission::Admitted(_) = a.admit(&sa, 1).await.unwrap() else {
        panic!("a waited for the slot b released");
    };
}

#[test]
fn a_lease_ttl_of_zero_is_refused_by_build() {
    let built = RedisStore::builder("redis://127.0.0.1:1")
        .lease_ttl(Duration::ZERO)
        .build();
    let Err(e) = built else {
        panic!("a zero lease TTL was accepted: no lease would hold a slot");
    };
    assert_eq!(
        e.to_string(),
        "rate-limit store unavailable: Redis lease TTL of zero"
    );
}

#[tokio::test]
async fn a_corrupt_key_of_one_scope_leaves_the_other_scopes_on_redis() {
    let Some(server) = common::redis::shared() else {
        return;
    };
    let store = store(server, OnUnavailable::FailClosed);
    let (x, y) = (
        ScopeId::from_u128(uuid::Uuid::new_v4().as_u128()),
        ScopeId::from_u128(uuid::Uuid::new_v4().as_u128()),
    );
    let (sx, sy) = (store.open(x, &Limits::new()), store.open(y, &Limits::new()));
    let cooldown = leases_key(x).replace(":leases", ":cooldown");
    assert_eq!(server.cli(&["SET", &cooldown, "garbage"]), "OK");
    let Err(e) = store.admit(&sx, 1).await else {
        panic!("a corrupt cooldown admitted");
    };
    assert!(e.to_string().contains("corrupt cooldown"), "{e}");
    let Ok(Admission::Admitted(_)) = store.admit(&sy, 1).await else {
        panic!("a healthy scope was refused for another scope's corrupt key");
    };
    assert_eq!(store.errors(), 1);
}
