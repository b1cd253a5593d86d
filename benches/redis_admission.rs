//! Admission latency through the Redis store, and Redis commands per request.
//!
//! ```text
//! redis-server --port 6379 --save '' --daemonize yes
//! cargo bench --bench redis_admission -- redis://127.0.0.1:6379
//! ```
//!
//! Uncontended: one caller admits and releases 5,000 times (a sliding window and an in-flight
//! cap that never bind); contended: 32 callers share an in-flight cap of 8. Prints p50 and p99
//! of the time `acquire` takes, and the store's commands per admission (admit + release).

use std::time::{Duration, Instant};

use reqwest_throttle::store::RedisStore;
use reqwest_throttle::{Scope, Throttle};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

async fn run(url: &str, callers: usize, cap: usize, per_caller: usize) {
    let store = RedisStore::builder(url)
        .namespace(format!("bench-{}", std::process::id()))
        .build()
        .expect("a Redis URL");
    let throttle = Throttle::builder()
        .sliding_window(1_000_000, Duration::from_secs(60))
        .max_in_flight(cap)
        .scope(Scope::global())
        .store(store.clone())
        .build()
        .expect("valid settings");
    // Warm up: connect, load the scripts.
    drop(throttle.acquire(1).await.unwrap());
    let before = store.commands();
    let tasks = (0..callers).map(|_| {
        let t = throttle.clone();
        tokio::spawn(async move {
            let mut took = Vec::with_capacity(per_caller);
            for _ in 0..per_caller {
                let start = Instant::now();
                let permit = t.acquire(1).await.unwrap();
                took.push(start.elapsed());
                tokio::task::yield_now().await;
                drop(permit);
            }
            took
        })
    });
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    // Let the last releases go out.
    tokio::time::sleep(Duration::from_millis(100)).await;
    all.sort();
    let commands = (store.commands() - before) as f64 / all.len() as f64;
    println!(
        "{callers:>3} callers, cap {cap:>2}: acquire p50 {:>8.1?}  p99 {:>8.1?}  Redis commands per request {commands:.2}  errors {}",
        percentile(&all, 0.5),
        percentile(&all, 0.99),
        store.errors()
    );
}

#[tokio::main]
async fn main() {
    let url = std::env::args()
        .skip(1)
        .find(|a| a.starts_with("redis://"))
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    run(&url, 1, 8, 5_000).await;
    run(&url, 32, 8, 500).await;
}
