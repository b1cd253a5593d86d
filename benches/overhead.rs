//! Overhead of the throttle itself: the admission hot path, the middleware in process (the
//! network replaced by a middleware that answers at once) and on loopback, and 10,000 waiters
//! on one throttle.
//!
//! ```text
//! cargo bench --bench overhead                     # criterion, ~3 minutes, then the summaries below
//! cargo bench --bench overhead --features metrics  # the same, every metric recorded
//! ```
//!
//! With the `metrics` feature a minimal in-memory recorder is installed first (atomic
//! counters and gauges, histograms as an atomic count and sum, as an exporter's would be), so
//! the figures include recording every metric of every request.
//!
//! Besides criterion's timings it prints:
//! * allocations per `acquire` + drop on a warmed-up throttle (a counting global allocator;
//!   the bench fails if the hot path allocates);
//! * the middleware's throughput as a fraction of the bare client's, from interleaved rounds;
//! * drain time and peak heap for 10,000 tasks queued on one throttle.

#[path = "nginx/upstream.rs"]
mod upstream;

use std::alloc::{GlobalAlloc, Layout, System};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, Throughput};
use governor::Quota;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_throttle::{NoRetry, Permit, Scope, Throttle};

// ---------------------------------------------------------------------------------------------
// A counting allocator.

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
static PEAK_BYTES: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to `System` unchanged; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            count_alloc(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            count_alloc(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
            count_alloc(new_size);
        }
        p
    }
}

fn count_alloc(size: usize) {
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    let live = LIVE_BYTES.fetch_add(size, Ordering::Relaxed) + size;
    PEAK_BYTES.fetch_max(live, Ordering::Relaxed);
}

#[global_allocator]
static GLOBAL: Counting = Counting;

// ---------------------------------------------------------------------------------------------
// Throttles whose limits never bind.

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("non-zero")
}

/// In-flight cap only.
fn permit_only() -> Throttle {
    Throttle::builder().max_in_flight(1024).build().unwrap()
}

/// In-flight cap, a sliding window and a token bucket, none of which binds, in one scope.
fn all_limits() -> Throttle {
    all_limits_per(Scope::global())
}

/// As [`all_limits`], with `scope`.
fn all_limits_per(scope: Scope) -> Throttle {
    Throttle::builder()
        .scope(scope)
        .max_in_flight(1024)
        .sliding_window(1_000_000_000, Duration::from_millis(10))
        .window_guard(Duration::ZERO)
        .token_bucket(Quota::per_second(nz(1_000_000_000)).allow_burst(nz(1_000_000)))
        .build()
        .unwrap()
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn cycle(throttle: &Throttle) {
    let permit: Permit = throttle.acquire(1).await.unwrap();
    drop(std::hint::black_box(permit));
}

/// Allocations per acquire + drop after a warm-up long enough for the sliding window's log to
/// reach its steady size (its window is 10 ms).
fn hot_path_allocations() {
    let rt = current_thread();
    println!("admission hot path, allocations per acquire + drop (warmed up, 100,000 cycles):");
    for (name, throttle) in [
        ("max_in_flight", permit_only()),
        ("all limits", all_limits()),
    ] {
        let per_cycle = rt.block_on(async {
            let warm_until = Instant::now() + Duration::from_millis(300);
            while Instant::now() < warm_until {
                cycle(&throttle).await;
            }
            let before = ALLOCATIONS.load(Ordering::Relaxed);
            for _ in 0..100_000 {
                cycle(&throttle).await;
            }
            (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / 100_000.0
        });
        println!("  {name:14} {per_cycle:.4}");
        // The sliding window's log is a VecDeque: it reallocates only while it grows, which the
        // warm-up covers; anything left would be a per-request allocation.
        assert!(
            per_cycle < 0.001,
            "the admission hot path allocates ({per_cycle} per cycle, {name})"
        );
    }
}

fn admission(c: &mut Criterion) {
    let rt = current_thread();
    let mut group = c.benchmark_group("admission");
    group.throughput(Throughput::Elements(1));
    for (name, throttle) in [
        ("max_in_flight", permit_only()),
        ("all_limits", all_limits()),
    ] {
        group.bench_function(name, |b| b.to_async(&rt).iter(|| cycle(&throttle)));
    }
    group.finish();
}

// ---------------------------------------------------------------------------------------------
// Middleware overhead on loopback.

/// Requests sent at once in one iteration.
const CONCURRENCY: usize = 32;

/// Starts the fast local server on its own thread and runtime (as a separate process would be).
fn start_server() -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        current_thread().block_on(async move {
            let server = upstream::Upstream::start("127.0.0.1:0").await.unwrap();
            tx.send(format!("{}/fast", server.url())).unwrap();
            std::future::pending::<()>().await;
        });
    });
    rx.recv().unwrap()
}

/// Scopes kept alive beside the measured one in the per-authority variant.
const OTHER_SCOPES: u16 = 1000;

/// The clients compared: bare, throttled in one scope, and throttled per authority with
/// [`OTHER_SCOPES`] other scopes alive.
struct Clients {
    bare: ClientWithMiddleware,
    one_scope: ClientWithMiddleware,
    many_scopes: ClientWithMiddleware,
}

fn clients(rt: &tokio::runtime::Runtime) -> Clients {
    let http = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(CONCURRENCY)
        .build()
        .unwrap();
    let with = |t: Throttle| ClientBuilder::new(http.clone()).with(t).build();
    let per_authority = all_limits_per(Scope::per_authority());
    let many_scopes = with(per_authority.clone());
    // Closed loopback ports refuse at once; each authority leaves a scope behind.
    rt.block_on(async {
        for port in 0..OTHER_SCOPES {
            let url = format!("http://127.0.0.1:{}/", 40_000 + port);
            let _ = many_scopes.get(url).with_extension(NoRetry).send().await;
        }
    });
    assert!(per_authority.stats().scopes >= usize::from(OTHER_SCOPES));
    Clients {
        bare: ClientBuilder::new(http.clone()).build(),
        one_scope: with(all_limits()),
        many_scopes,
    }
}

async fn batch(client: &ClientWithMiddleware, url: &str) {
    let requests = (0..CONCURRENCY).map(|_| async {
        let r = client.get(url).send().await.unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    });
    futures::future::join_all(requests).await;
}

fn middleware(c: &mut Criterion, url: &str) {
    let rt = current_thread();
    let clients = clients(&rt);
    let mut group = c.benchmark_group("loopback");
    group.throughput(Throughput::Elements(CONCURRENCY as u64));
    for (name, client) in [
        ("bare", &clients.bare),
        ("throttle_one_scope", &clients.one_scope),
        ("throttle_1000_scopes", &clients.many_scopes),
    ] {
        group.bench_function(name, |b| b.to_async(&rt).iter(|| batch(client, url)));
    }
    group.finish();
}

/// Requests per second of `client` over `batches` batches.
async fn rate(client: &ClientWithMiddleware, url: &str, batches: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..batches {
        batch(client, url).await;
    }
    (batches * CONCURRENCY) as f64 / t.elapsed().as_secs_f64()
}

/// Throughput of each throttled client over the bare one, from interleaved rounds (so that
/// drift of the machine affects all alike): the median of the per-round ratios.
fn interleaved_ratio(url: &str) {
    let rt = current_thread();
    let clients = clients(&rt);
    let rounds = 15;
    let per_round = 100; // batches, so 3,200 requests per client per round
    let mut rates: [Vec<f64>; 3] = Default::default();
    let mut ratios: [Vec<f64>; 2] = Default::default();
    let order = [&clients.bare, &clients.one_scope, &clients.many_scopes];
    rt.block_on(async {
        for client in order {
            rate(client, url, per_round).await;
        }
        for round in 0..rounds {
            let mut r = [0.0; 3];
            // Rotate which goes first.
            for k in 0..3 {
                let i = (round + k) % 3;
                r[i] = rate(order[i], url, per_round).await;
            }
            for i in 0..3 {
                rates[i].push(r[i]);
            }
            ratios[0].push(r[1] / r[0]);
            ratios[1].push(r[2] / r[0]);
        }
    });
    let [bare, one, many] = rates.map(median);
    let [one_ratio, many_ratio] = ratios.map(median);
    println!(
        "loopback throughput, {CONCURRENCY} concurrent requests, median of {rounds} interleaved rounds:"
    );
    println!("  bare client                      {bare:>8.0} requests/s");
    println!("  Throttle, one scope              {one:>8.0} requests/s, ratio {one_ratio:.3}");
    println!(
        "  Throttle, per authority, {OTHER_SCOPES} more {many:>8.0} requests/s, ratio {many_ratio:.3}"
    );
}

// ---------------------------------------------------------------------------------------------
// Middleware overhead in process: the network replaced by a last middleware that answers at
// once, so that the throttle's own work per request is all that differs.

#[path = "common/answer.rs"]
mod answer;
use answer::Answer;

fn in_process_clients() -> (ClientWithMiddleware, ClientWithMiddleware) {
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let bare = ClientBuilder::new(http.clone()).with(Answer).build();
    let throttled = ClientBuilder::new(http)
        .with(all_limits())
        .with(Answer)
        .build();
    (bare, throttled)
}

async fn one_in_process(client: &ClientWithMiddleware) {
    let r = client.get("http://127.0.0.1:9/x").send().await.unwrap();
    r.bytes().await.unwrap();
}

fn in_process(c: &mut Criterion) {
    let rt = current_thread();
    let (bare, throttled) = in_process_clients();
    let mut group = c.benchmark_group("in_process");
    group.throughput(Throughput::Elements(1));
    group.bench_function("bare", |b| b.to_async(&rt).iter(|| one_in_process(&bare)));
    group.bench_function("throttle", |b| {
        b.to_async(&rt).iter(|| one_in_process(&throttled))
    });
    group.finish();
}

// ---------------------------------------------------------------------------------------------
// 10,000 tasks waiting on one throttle.

const WAITERS: usize = 10_000;

/// Queues `WAITERS` tasks behind a throttle whose permits are all held, then releases them
/// and returns the time to drain the queue and the heap growth at its peak.
fn drain_once(rt: &tokio::runtime::Runtime) -> (Duration, usize) {
    rt.block_on(async {
        let throttle = Throttle::builder()
            .max_in_flight(64)
            .token_bucket(Quota::per_second(nz(1_000_000_000)).allow_burst(nz(1_000_000)))
            .build()
            .unwrap();
        let base = LIVE_BYTES.load(Ordering::Relaxed);
        PEAK_BYTES.store(base, Ordering::Relaxed);
        let mut held = Vec::new();
        for _ in 0..64 {
            held.push(throttle.acquire(1).await.unwrap());
        }
        let tasks: Vec<_> = (0..WAITERS)
            .map(|_| {
                let throttle = throttle.clone();
                tokio::spawn(async move {
                    let permit = throttle.acquire(1).await.unwrap();
                    tokio::task::yield_now().await;
                    drop(permit);
                })
            })
            .collect();
        while throttle.stats().queued < WAITERS {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let started = Instant::now();
        held.clear();
        for t in tasks {
            t.await.unwrap();
        }
        let drained = started.elapsed();
        let peak = PEAK_BYTES.load(Ordering::Relaxed).saturating_sub(base);
        assert_eq!(throttle.stats().available_permits, Some(64));
        (drained, peak)
    })
}

fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn scale(c: &mut Criterion) {
    let rt = multi_thread();
    let mut group = c.benchmark_group("scale");
    group.sample_size(10);
    group.throughput(Throughput::Elements(WAITERS as u64));
    group.bench_function("drain_10000_waiters", |b| {
        b.iter_batched(|| (), |()| drain_once(&rt).0, BatchSize::PerIteration)
    });
    group.finish();
}

fn scale_report() {
    let rt = multi_thread();
    let runs: Vec<_> = (0..7).map(|_| drain_once(&rt)).collect();
    let drain = median(runs.iter().map(|r| r.0.as_secs_f64() * 1e3).collect());
    let peak = median(runs.iter().map(|r| r.1 as f64).collect());
    println!("{WAITERS} tasks queued on one throttle (max_in_flight 64), median of 7:");
    println!("  time to drain    {drain:>8.2} ms");
    println!(
        "  peak heap        {:>8.2} MiB ({:.0} bytes per waiting task, tasks included)",
        peak / (1024.0 * 1024.0),
        peak / WAITERS as f64
    );
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

// ---------------------------------------------------------------------------------------------
// With the `metrics` feature: a recorder that keeps every metric in atomics.

#[cfg(feature = "metrics")]
mod recorder {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use metrics::{
        Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString,
        Unit,
    };

    /// A histogram as an atomic count and sum of nanoseconds.
    #[derive(Default)]
    struct Summary {
        count: AtomicU64,
        nanos: AtomicU64,
    }

    impl HistogramFn for Summary {
        fn record(&self, value: f64) {
            self.count.fetch_add(1, Ordering::Relaxed);
            self.nanos
                .fetch_add((value * 1e9) as u64, Ordering::Relaxed);
        }
    }

    struct Atomics;

    impl Recorder for Atomics {
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
            Histogram::from_arc(Arc::new(Summary::default()))
        }
    }

    pub(crate) fn install() {
        metrics::set_global_recorder(Atomics).expect("the first recorder");
        println!("metrics: every metric recorded (in-memory atomic recorder)");
    }
}

fn main() {
    #[cfg(feature = "metrics")]
    recorder::install();
    hot_path_allocations();
    let url = start_server();
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    admission(&mut c);
    in_process(&mut c);
    middleware(&mut c, &url);
    scale(&mut c);
    c.final_summary();
    interleaved_ratio(&url);
    scale_report();
}
