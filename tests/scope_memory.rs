//! The memory bound on scopes: 100,000 distinct keys through one throttle keep at most
//! `max_scopes` scopes alive, and the heap's peak stays bounded. The heap is measured by a
//! counting allocator, so this file holds one test (tests in one binary share the allocator).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use reqwest_throttle::Throttle;

mod common;
use common::FakeServer;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const KEYS: usize = 100_000;
const MAX_SCOPES: usize = 10_000;

/// What one run saw.
struct Seen {
    most_scopes: usize,
    peak_heap: usize,
    overflow_after_cap: bool,
}

/// Sends one request for each of `KEYS` hosts.
async fn distinct_keys(throttle: &Throttle) -> Seen {
    let server = FakeServer::ok();
    let client = server.client(throttle);
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let mut most = 0;
    let mut overflow_after_cap = false;
    for i in 0..KEYS {
        client
            .get(format!("http://h{i}.test/"))
            .send()
            .await
            .unwrap();
        if i % 1000 == 0 {
            server.forget();
            most = most.max(throttle.stats().scopes);
        }
        if i == MAX_SCOPES {
            let labels = throttle.scope_stats();
            overflow_after_cap = labels.iter().any(|s| s.label == "(overflow)");
        }
    }
    Seen {
        most_scopes: most.max(throttle.stats().scopes),
        peak_heap: PEAK.load(Ordering::Relaxed) - base,
        overflow_after_cap,
    }
}

#[tokio::test(start_paused = true)]
async fn one_hundred_thousand_keys_stay_within_the_scope_cap() {
    // Idle after each request (no quota holds a send): forgotten at the cap.
    let idle = Throttle::builder().max_in_flight(4).build().unwrap();
    let idle = distinct_keys(&idle).await;
    // Busy (a one-hour window counts each send): at the cap, new keys share the overflow
    // scope until the first scopes' sends leave their windows.
    let busy = Throttle::builder()
        .sliding_window(1000, Duration::from_secs(3600))
        .max_in_flight(4)
        .build()
        .unwrap();
    let busy = distinct_keys(&busy).await;
    let mib = |b: usize| b as f64 / 1048576.0;
    println!(
        "{KEYS} keys, max_scopes {MAX_SCOPES}: idle scopes: at most {} alive, peak heap \
         +{:.1} MiB; busy scopes: at most {} alive, peak heap +{:.1} MiB",
        idle.most_scopes,
        mib(idle.peak_heap),
        busy.most_scopes,
        mib(busy.peak_heap)
    );
    assert!(idle.most_scopes <= MAX_SCOPES, "{}", idle.most_scopes);
    assert!(!idle.overflow_after_cap, "idle scopes make room");
    assert_eq!(busy.most_scopes, MAX_SCOPES);
    assert!(busy.overflow_after_cap);
    // A scope, with its learner, observer and the charges kept for settlements, costs under
    // 2.4 KiB (measured: 10,000 busy scopes +17.4 MiB): 10,000 of them under 24 MiB.
    for peak in [idle.peak_heap, busy.peak_heap] {
        assert!(peak < 24 << 20, "peak heap growth {peak} bytes");
    }
}
