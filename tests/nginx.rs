//! The throttle against a real server nobody here wrote: nginx with `limit_req` and
//! `limit_conn` (benches/nginx/), on loopback, in real time.
//!
//! `.ci/run` starts nginx with `benches/nginx/start.sh` before the tests. Without it (nginx not
//! installed or not started) this test prints why and passes, unless the environment variable
//! `REQWEST_THROTTLE_REQUIRE_NGINX` is set (as `.ci/run` does). The test starts the small
//! upstream nginx proxies to itself. It asserts outcomes only, never a duration.

#[path = "../benches/nginx/upstream.rs"]
mod upstream;

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use governor::Quota;
use reqwest_middleware::ClientBuilder;
use reqwest_throttle::Throttle;
use upstream::{
    fresh_key, nginx_is_up, Upstream, NGINX_BURST, NGINX_PARALLEL, NGINX_RATE_PER_S,
    NGINX_UPSTREAM, NGINX_URL,
};

const REQUESTS: usize = 300;
const CALLERS: usize = 40;

/// `limit_req rate=R burst=B nodelay` admits B + 1 at once, then one every 1/R: a GCRA with
/// burst B + 1. The throttle's bucket keeps one cell of margin (burst B) for the difference
/// between when the client sends and when nginx counts (see README, "Performance").
fn nginx_quota() -> Quota {
    Quota::per_second(NonZeroU32::new(NGINX_RATE_PER_S).unwrap())
        .allow_burst(NonZeroU32::new(NGINX_BURST).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttle_keeps_nginx_limits() {
    let http = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(CALLERS)
        .build()
        .unwrap();
    if !nginx_is_up(&http).await {
        let required = std::env::var_os("REQWEST_THROTTLE_REQUIRE_NGINX").is_some();
        assert!(
            !required,
            "no nginx on {NGINX_URL} and REQWEST_THROTTLE_REQUIRE_NGINX is set"
        );
        eprintln!(
            "skipped: no nginx on {NGINX_URL} (install nginx-light and run benches/nginx/start.sh)"
        );
        return;
    }
    let upstream = match Upstream::start(NGINX_UPSTREAM).await {
        Ok(u) => u,
        Err(e) => {
            eprintln!("skipped: cannot bind the upstream on {NGINX_UPSTREAM}: {e}");
            return;
        }
    };

    // 1. The server: nginx tells its two limits apart.
    let key = fresh_key("nginx-parallel");
    let streams: Vec<_> = (0..NGINX_PARALLEL + 1)
        .map(|_| {
            let (http, key) = (http.clone(), key.clone());
            tokio::spawn(async move {
                let r = http
                    .get(format!("{NGINX_URL}/v1/stream"))
                    .header("authorization", key)
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                let kind = r.headers().get("rate_limit_type").cloned();
                let retry_after = r.headers().get("retry-after").cloned();
                r.bytes().await.unwrap();
                (status, kind, retry_after)
            })
        })
        .collect();
    let mut refused = Vec::new();
    for s in streams {
        let (status, kind, retry_after) = s.await.unwrap();
        if status == 429 {
            refused.push((kind, retry_after));
        } else {
            assert_eq!(status, 200);
            assert!(kind.is_none(), "a 200 carries no rate_limit_type");
        }
    }
    assert!(!refused.is_empty(), "limit_conn refused none of 11 streams");
    for (kind, retry_after) in &refused {
        assert_eq!(kind.as_ref().unwrap(), "parallel_requests");
        assert_eq!(retry_after.as_ref().unwrap(), "1");
    }
    let key = fresh_key("nginx-rate");
    let burst: Vec<_> = (0..2 * NGINX_BURST + 2)
        .map(|_| {
            let (http, key) = (http.clone(), key.clone());
            tokio::spawn(async move {
                // HEAD-free and fast: refused requests never reach the upstream.
                let r = http
                    .get(format!("{NGINX_URL}/v1/chat"))
                    .header("authorization", key)
                    .send()
                    .await
                    .unwrap();
                (
                    r.status().as_u16(),
                    r.headers().get("rate_limit_type").cloned(),
                )
            })
        })
        .collect();
    let mut rate_refused = 0;
    for b in burst {
        let (status, kind) = b.await.unwrap();
        if status == 429 {
            rate_refused += 1;
            let kind = kind.unwrap();
            assert!(
                kind == "requests_per_second" || kind == "parallel_requests",
                "{kind:?}"
            );
        }
    }
    assert!(rate_refused > 0, "nginx refused none of a burst of 42");

    // 2. The throttle, configured to nginx's limits: nothing refused, nothing lost.
    upstream.counts.reset();
    let throttle = Throttle::builder()
        .token_bucket(nginx_quota())
        .max_in_flight(NGINX_PARALLEL as usize)
        .build()
        .unwrap();
    let client = ClientBuilder::new(http.clone())
        .with(throttle.clone())
        .build();
    let key = fresh_key("nginx-throttle");
    let next = Arc::new(AtomicUsize::new(0));
    let callers: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (client, next, key) = (client.clone(), next.clone(), key.clone());
            tokio::spawn(async move {
                let mut failures = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= REQUESTS {
                        return failures;
                    }
                    let route = if i % 5 == 4 { "v1/stream" } else { "v1/chat" };
                    match client
                        .get(format!("{NGINX_URL}/{route}"))
                        .header("authorization", &key)
                        .send()
                        .await
                    {
                        Ok(r) => {
                            let status = r.status();
                            match r.bytes().await {
                                Ok(_) if status == 200 => {}
                                Ok(_) => failures.push(format!("request {i}: {status}")),
                                Err(e) => failures.push(format!("request {i}: body: {e}")),
                            }
                        }
                        Err(e) => failures.push(format!("request {i}: {e}")),
                    }
                }
            })
        })
        .collect();
    let mut failures = Vec::new();
    for c in callers {
        failures.extend(c.await.unwrap());
    }
    let stats = throttle.stats();
    assert!(
        failures.is_empty(),
        "{} failures: {failures:?}",
        failures.len()
    );
    assert_eq!(stats.responses_429, 0, "nginx refused some: {stats:?}");
    assert_eq!(stats.sent, REQUESTS as u64, "{stats:?}");
    assert_eq!(stats.in_flight, 0, "{stats:?}");
    assert_eq!(stats.queued, 0, "{stats:?}");
    assert_eq!(
        stats.available_permits,
        Some(NGINX_PARALLEL as usize),
        "every permit returned"
    );
    assert_eq!(upstream.counts.requests(), REQUESTS as u64);
    assert!(
        upstream.counts.peak() <= NGINX_PARALLEL,
        "upstream saw {} in progress",
        upstream.counts.peak()
    );
    upstream.shutdown().await;
}
