//! Instructions per request through the middleware in process (the network replaced by a last
//! middleware that answers at once), for a count that the machine's load does not change:
//!
//! ```text
//! cargo bench --bench instructions --no-run            # build, note the binary's path
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null BINARY throttle 1000
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null BINARY throttle 11000
//! ```
//!
//! The difference of the two totals (`Collected`), divided by 10,000, is the instructions of
//! one request; `bare` instead of `throttle` gives the client without the throttle. With
//! `--features metrics` an in-memory recorder is installed (as in `benches/overhead.rs`).
//! Run without valgrind it prints the wall time per request.

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use governor::Quota;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_throttle::{Scope, Throttle};

#[path = "common/answer.rs"]
mod answer;
use answer::Answer;

/// In-flight cap, a sliding window and a token bucket, none of which binds.
fn all_limits() -> Throttle {
    let nz = |n| NonZeroU32::new(n).expect("non-zero");
    Throttle::builder()
        .scope(Scope::global())
        .max_in_flight(1024)
        .sliding_window(1_000_000_000, Duration::from_millis(10))
        .window_guard(Duration::ZERO)
        .token_bucket(Quota::per_second(nz(1_000_000_000)).allow_burst(nz(1_000_000)))
        .build()
        .expect("valid limits")
}

#[cfg(feature = "metrics")]
fn install_recorder() {
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, SharedString, Unit};

    struct Atomics;

    impl metrics::Recorder for Atomics {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
            Counter::from_arc(Arc::new(AtomicU64::new(0)))
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::from_arc(Arc::new(AtomicU64::new(0)))
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            // A histogram kept as a gauge of the last value: one atomic store per record.
            struct Last(AtomicU64);
            impl metrics::HistogramFn for Last {
                fn record(&self, value: f64) {
                    self.0
                        .store(value.to_bits(), std::sync::atomic::Ordering::Relaxed);
                }
            }
            Histogram::from_arc(Arc::new(Last(AtomicU64::new(0))))
        }
    }

    metrics::set_global_recorder(Atomics).expect("the first recorder");
}

fn main() {
    #[cfg(feature = "metrics")]
    install_recorder();
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let variant = args.next().unwrap_or_else(|| "throttle".to_owned());
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let client: ClientWithMiddleware = match variant.as_str() {
        "bare" => ClientBuilder::new(http).with(Answer).build(),
        _ => ClientBuilder::new(http)
            .with(all_limits())
            .with(Answer)
            .build(),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    rt.block_on(async {
        for _ in 0..n {
            let r = client.get("http://127.0.0.1:9/x").send().await.unwrap();
            r.bytes().await.unwrap();
        }
    });
    let per = started.elapsed().as_secs_f64() * 1e9 / n as f64;
    println!("{variant}: {n} requests, {per:.0} ns per request");
}
