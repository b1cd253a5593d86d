//! The throttle against the simulated gateway over real loopback HTTP, on a paused tokio clock:
//! the server must never see more than its limits, streaming responses included.

use std::time::Duration;

use reqwest_middleware::ClientBuilder;
use reqwest_throttle::testing::{Gateway, GatewayConfig};
use reqwest_throttle::{Throttle, ThrottleInfo};

const REQUESTS: usize = 120;
const CALLERS: usize = 30;

fn gateway_config() -> GatewayConfig {
    GatewayConfig::seed_limits()
        .with_requests_per_window(20)
        .with_window(Duration::from_secs(2))
        .with_max_parallel(5)
        .with_service_time(Duration::from_millis(50))
        .with_stream_chunks(4)
        .with_stream_chunk_interval(Duration::from_millis(30))
}

/// Runs `REQUESTS` requests from `CALLERS` tasks (every third a streaming response, read to
/// the end) and returns how many succeeded and the largest attempt count.
async fn swarm(gateway: &Gateway, throttle: &Throttle) -> (usize, u32) {
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let client = ClientBuilder::new(http).with(throttle.clone()).build();
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let callers: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (client, next, base) = (client.clone(), next.clone(), gateway.url());
            tokio::spawn(async move {
                let (mut ok, mut most_attempts) = (0, 0);
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= REQUESTS {
                        return (ok, most_attempts);
                    }
                    let route = if i % 3 == 0 { "v1/stream" } else { "v1/chat" };
                    let r = client
                        .post(format!("{base}/{route}"))
                        .header("authorization", "Bearer user-1")
                        .body("{}")
                        .send()
                        .await
                        .unwrap();
                    let attempts = r.extensions().get::<ThrottleInfo>().unwrap().attempts;
                    most_attempts = most_attempts.max(attempts);
                    let success = r.status().is_success();
                    if r.bytes().await.is_ok() && success {
                        ok += 1;
                    }
                }
            })
        })
        .collect();
    let mut totals = (0, 0);
    for c in callers {
        let (ok, attempts) = c.await.unwrap();
        totals = (totals.0 + ok, totals.1.max(attempts));
    }
    totals
}

#[tokio::test(start_paused = true)]
async fn configured_limits_keep_the_server_inside_them() {
    let config = gateway_config();
    let gateway = Gateway::start(config.clone()).unwrap();
    let throttle = Throttle::builder()
        .sliding_window(config.requests_per_window, config.window)
        .max_in_flight(config.max_parallel as usize)
        .build()
        .unwrap();
    let (ok, most_attempts) = swarm(&gateway, &throttle).await;
    let stats = gateway.stats();
    assert_eq!(ok, REQUESTS);
    assert_eq!(most_attempts, 1, "no request needed a retry");
    assert_eq!(stats.responses_429, 0);
    assert_eq!(stats.admitted, REQUESTS as u64);
    // The gateway refuses (429) what is over its limits, so "never over" means: no refusal,
    // and never more requests arriving at once than the cap, refused or not.
    assert_eq!((stats.refused_window, stats.refused_parallel), (0, 0));
    assert!(
        stats.peak_parallel_attempted <= config.max_parallel,
        "{stats:?}"
    );
    assert_eq!(
        stats.max_in_window, config.requests_per_window,
        "the window was used fully"
    );
    assert_eq!(throttle.stats().in_flight, 0);
    assert_eq!(throttle.stats().available_permits, Some(5));
}

#[tokio::test(start_paused = true)]
async fn without_a_quota_the_limits_are_learned_and_nothing_is_lost() {
    let config = gateway_config();
    let gateway = Gateway::start(config.clone()).unwrap();
    let throttle = Throttle::builder()
        .max_in_flight(config.max_parallel as usize)
        .max_retries(20)
        .jitter_seed(7)
        .build()
        .unwrap();
    let (ok, _) = swarm(&gateway, &throttle).await;
    let stats = gateway.stats();
    assert_eq!(ok, REQUESTS, "{stats:?}");
    assert_eq!(
        stats.refused_parallel, 0,
        "max_in_flight matches the server's cap"
    );
    // The shared cooldown: a full window is found out by the callers in flight when it
    // fills and by those let through when it reopens, not by every caller alone. Measured over
    // 20 runs: 24 to 40 refusals for 120 requests (the wall clock in `reset_at` varies it).
    assert!(stats.responses_429 <= REQUESTS as u64 / 2, "{stats:?}");
    assert_eq!(stats.responses_429, throttle.stats().responses_429);
    assert_eq!(throttle.stats().in_flight, 0);
}
