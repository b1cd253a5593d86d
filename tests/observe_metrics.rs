//! The `metrics` feature: every metric recorded where documented, with its unit, and labels
//! only for named scopes. A debugging recorder is installed for the test's thread only.
#![cfg(feature = "metrics")]

mod common;

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use common::{refuses_once, refuses_parallel_once, status, FakeServer};
use metrics::Unit;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use reqwest_throttle::{CircuitBreaker, LearnedLimits, NoRetry, Throttle};

const S: Duration = Duration::from_secs(1);
const URL: &str = "http://api.test/v1";

type Labels = Vec<(String, String)>;

/// What a recorder holds, summed over snapshots (a snapshot resets counters and gauges).
struct Recorded {
    snapshotter: Snapshotter,
    counters: HashMap<(String, Labels), u64>,
    gauges: HashMap<(String, Labels), f64>,
    histograms: HashMap<(String, Labels), Vec<f64>>,
    units: HashMap<String, Option<Unit>>,
}

impl Recorded {
    fn take(&mut self) {
        for (key, unit, _, value) in self.snapshotter.snapshot().into_vec() {
            let (_, key) = key.into_parts();
            let mut labels: Labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            let name = key.name().to_owned();
            self.units.insert(name.clone(), unit);
            let id = (name, labels);
            match value {
                DebugValue::Counter(n) => *self.counters.entry(id).or_default() += n,
                DebugValue::Gauge(v) => *self.gauges.entry(id).or_default() += v.0,
                DebugValue::Histogram(v) => self
                    .histograms
                    .entry(id)
                    .or_default()
                    .extend(v.into_iter().map(|f| f.0)),
            }
        }
    }

    fn id(name: &str, labels: &[(&str, &str)]) -> (String, Labels) {
        let mut labels: Labels = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        labels.sort();
        (format!("reqwest_throttle_{name}"), labels)
    }

    fn counter(&mut self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.take();
        self.counters
            .get(&Self::id(name, labels))
            .copied()
            .unwrap_or(0)
    }

    fn gauge(&mut self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.take();
        self.gauges
            .get(&Self::id(name, labels))
            .copied()
            .unwrap_or(0.0)
    }

    fn histogram(&mut self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        self.take();
        self.histograms
            .get(&Self::id(name, labels))
            .cloned()
            .unwrap_or_default()
    }
}

/// Runs `test` on a paused current-thread runtime with a fresh recorder for this thread.
fn with_recorder<F: Future<Output = ()>>(test: impl FnOnce(Recorded) -> F) {
    let recorder = DebuggingRecorder::new();
    let recorded = Recorded {
        snapshotter: recorder.snapshotter(),
        counters: HashMap::new(),
        gauges: HashMap::new(),
        histograms: HashMap::new(),
        units: HashMap::new(),
    };
    // IO too, for the transport-error test.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || rt.block_on(test(recorded)));
}

fn named_api() -> reqwest_throttle::ThrottleBuilder {
    let example = reqwest::Request::new(reqwest::Method::GET, URL.parse().unwrap());
    Throttle::builder()
        .jitter(false)
        .name_scope("api", &example)
}

const API: (&str, &str) = ("scope", "api");

#[test]
fn a_refused_then_answered_request_is_counted_in_its_named_scope() {
    with_recorder(|mut m| async move {
        let throttle = named_api().max_in_flight(4).build().unwrap();
        let server = FakeServer::new(|i, _| match i {
            0 => common::json(
                429,
                &[("retry-after", "1"), ("rate_limit_type", "rpm")],
                "{}",
            ),
            _ => common::json(200, &[], "{}"),
        })
        .with_delay(S / 10);
        let client = server.client(&throttle);
        let answer = client.get(URL).send().await.unwrap();
        assert_eq!(answer.status(), 200);
        assert_eq!(m.gauge("in_flight", &[API]), 1.0, "until the body is read");
        answer.bytes().await.unwrap();
        common::settle().await;
        assert_eq!(m.counter("requests_total", &[API]), 1);
        assert_eq!(m.counter("attempts_total", &[API]), 2);
        assert_eq!(m.counter("retries_total", &[API]), 1);
        assert_eq!(m.counter("responses_429_total", &[API]), 1);
        assert_eq!(m.counter("answers_total", &[API, ("class", "4xx")]), 1);
        assert_eq!(m.counter("answers_total", &[API, ("class", "2xx")]), 1);
        assert_eq!(m.counter("answers_total", &[API, ("class", "5xx")]), 0);
        assert_eq!(m.gauge("in_flight", &[API]), 0.0);
        assert_eq!(m.gauge("queued", &[API]), 0.0);
        assert_eq!(m.gauge("cooldown_closed", &[API]), 0.0, "reopened at 1 s");
        assert_eq!(m.histogram("answer_seconds", &[API]), [0.1, 0.1]);
        // The retry waited out the cooldown in its retry wait, not in the queue.
        assert_eq!(m.histogram("queue_seconds", &[API]), [0.0, 0.0]);
        // Nothing went to the unnamed series.
        assert_eq!(m.counter("requests_total", &[]), 0);
    });
}

#[test]
fn unnamed_scopes_share_one_series_without_a_scope_label() {
    with_recorder(|mut m| async move {
        let throttle = named_api().build().unwrap();
        let client = FakeServer::ok().client(&throttle);
        for url in ["http://a.test/", "http://b.test/", "http://c.test/"] {
            client.get(url).send().await.unwrap();
        }
        assert_eq!(m.counter("requests_total", &[]), 3);
        assert_eq!(m.counter("answers_total", &[("class", "2xx")]), 3);
        assert_eq!(m.counter("requests_total", &[API]), 0);
        let labels: Vec<_> = m.counters.keys().flat_map(|(_, l)| l.clone()).collect();
        assert!(
            labels.iter().all(|(k, _)| k == "class" || k == "reason"),
            "{labels:?}"
        );
    });
}

#[test]
fn the_in_flight_and_queued_gauges_and_the_time_queued() {
    with_recorder(|mut m| async move {
        let throttle = Throttle::builder().max_in_flight(1).build().unwrap();
        let client = FakeServer::ok().with_delay(S).client(&throttle);
        let calls: Vec<_> = (0..3)
            .map(|_| {
                let client = client.clone();
                tokio::spawn(async move { client.get(URL).send().await.unwrap() })
            })
            .collect();
        tokio::time::sleep(S / 2).await;
        assert_eq!(m.gauge("in_flight", &[]), 1.0);
        assert_eq!(m.gauge("queued", &[]), 2.0);
        for call in calls {
            drop(call.await.unwrap());
        }
        assert_eq!(m.gauge("in_flight", &[]), 0.0);
        assert_eq!(m.gauge("queued", &[]), 0.0);
        let mut queued = m.histogram("queue_seconds", &[]);
        queued.sort_by(f64::total_cmp);
        assert_eq!(queued, [0.0, 1.0, 2.0]);
    });
}

#[test]
fn the_cooldown_gauge_is_one_while_closed() {
    with_recorder(|mut m| async move {
        let throttle = Throttle::builder().build().unwrap();
        let client = refuses_once("5").client(&throttle);
        let r = client
            .get(URL)
            .with_extension(NoRetry)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 429);
        assert_eq!(m.gauge("cooldown_closed", &[]), 1.0);
        tokio::time::sleep(5 * S).await;
        common::settle().await;
        assert_eq!(m.gauge("cooldown_closed", &[]), 0.0);
    });
}

#[test]
fn stop_reasons_are_counted_by_reason() {
    with_recorder(|mut m| async move {
        let throttle = Throttle::builder().max_retries(0).build().unwrap();
        let server = FakeServer::new(|i, _| status(if i == 0 { 503 } else { 429 }));
        let client = server.client(&throttle);
        client.get(URL).send().await.unwrap();
        let retry_disabled = Throttle::builder().build().unwrap();
        let client = server.client(&retry_disabled);
        client
            .get(URL)
            .with_extension(NoRetry)
            .send()
            .await
            .unwrap();
        let reason = |r| [("reason", r)];
        assert_eq!(m.counter("stops_total", &reason("retries_exhausted")), 1);
        assert_eq!(m.counter("stops_total", &reason("retry_disabled")), 1);
        assert_eq!(m.counter("stops_total", &reason("deadline")), 0);
    });
}

#[test]
fn a_transport_error_is_an_answer_of_class_error() {
    with_recorder(|mut m| async move {
        let throttle = Throttle::builder().build().unwrap();
        let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
            .with(throttle)
            .build();
        // Port 1 on loopback refuses at once.
        let sent = client
            .get("http://127.0.0.1:1/")
            .with_extension(NoRetry)
            .send()
            .await;
        assert!(sent.is_err());
        assert_eq!(m.counter("answers_total", &[("class", "error")]), 1);
        assert_eq!(m.histogram("answer_seconds", &[]).len(), 1);
    });
}

#[test]
fn every_metric_is_described_with_its_unit() {
    with_recorder(|mut m| async move {
        let throttle = Throttle::builder().max_in_flight(1).build().unwrap();
        let client = refuses_once("1").client(&throttle);
        client.get(URL).send().await.unwrap();
        m.take();
        let mut units: Vec<_> = m
            .units
            .iter()
            .map(|(name, unit)| (name.as_str(), *unit))
            .collect();
        units.sort_by_key(|(name, _)| *name);
        let count = Some(Unit::Count);
        let seconds = Some(Unit::Seconds);
        assert_eq!(
            units,
            [
                ("reqwest_throttle_answer_seconds", seconds),
                ("reqwest_throttle_answers_total", count),
                ("reqwest_throttle_attempts_total", count),
                ("reqwest_throttle_circuit_state", None),
                ("reqwest_throttle_cooldown_closed", count),
                ("reqwest_throttle_in_flight", count),
                ("reqwest_throttle_learned_max_in_flight", count),
                ("reqwest_throttle_learned_rate", Some(Unit::CountPerSecond)),
                ("reqwest_throttle_queue_seconds", seconds),
                ("reqwest_throttle_queued", count),
                ("reqwest_throttle_requests_total", count),
                ("reqwest_throttle_responses_429_total", count),
                ("reqwest_throttle_retries_total", count),
                ("reqwest_throttle_stops_total", count),
            ]
        );
    });
}

#[test]
fn the_learned_cap_gauge_starts_at_the_cap_and_follows_what_is_learned() {
    with_recorder(|mut m| async move {
        let throttle = named_api().max_in_flight(8).build().unwrap();
        let refusing = refuses_parallel_once().client(&throttle);
        let get = || refusing.get(URL).with_extension(NoRetry).send();
        assert_eq!(get().await.unwrap().status(), 429);
        assert_eq!(m.gauge("learned_max_in_flight", &[API]), 4.0, "8, halved");
        for _ in 0..10 {
            assert_eq!(get().await.unwrap().status(), 200);
        }
        assert_eq!(m.gauge("learned_max_in_flight", &[API]), 5.0);
        assert_eq!(m.gauge("learned_rate", &[API]), 0.0, "no rate learned");
        // Unnamed scopes are summed: two more scopes with the configured cap of 8.
        let client = FakeServer::ok().client(&throttle);
        for url in ["http://a.test/", "http://b.test/"] {
            client.get(url).send().await.unwrap();
        }
        assert_eq!(m.gauge("learned_max_in_flight", &[]), 16.0);
        // A dropped throttle's scopes leave the sums.
        drop((refusing, client, throttle));
        common::settle().await;
        assert_eq!(m.gauge("learned_max_in_flight", &[]), 0.0);
        assert_eq!(m.gauge("learned_max_in_flight", &[API]), 0.0);
    });
}

#[test]
fn the_learned_rate_gauge_holds_a_warm_start_from_the_first_request() {
    with_recorder(|mut m| async move {
        let throttle = named_api().build().unwrap();
        let mut saved = LearnedLimits::default();
        saved.scope = "http://api.test:80".into();
        saved.rate = Some(12.5);
        saved.burst = Some(3);
        saved.confidence = 1.0;
        throttle.load_learned([saved]);
        let client = FakeServer::ok().client(&throttle);
        client.get(URL).send().await.unwrap();
        assert_eq!(m.gauge("learned_rate", &[API]), 12.5);
        assert_eq!(m.gauge("learned_max_in_flight", &[API]), 0.0, "no cap");
        // 30 s without a refusal: the pace is raised by 10 %, and the gauge follows.
        tokio::time::sleep(31 * S).await;
        client.get(URL).send().await.unwrap();
        let rate = throttle
            .learned("http://api.test:80")
            .unwrap()
            .rate
            .unwrap();
        assert!((rate - 13.75).abs() < 1e-9, "{rate}");
        assert!((m.gauge("learned_rate", &[API]) - rate).abs() < 1e-9);
    });
}

#[test]
fn the_circuit_gauge_is_2_open_1_half_open_0_closed_and_the_worst_unnamed_scope() {
    with_recorder(|mut m| async move {
        let throttle = named_api()
            .max_retries(0)
            .circuit_breaker(Some(CircuitBreaker::new(1, 10 * S)))
            .build()
            .unwrap();
        let healthy = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let client = common::fails_until(healthy.clone()).client(&throttle);
        assert_eq!(client.get(URL).send().await.unwrap().status(), 503);
        assert_eq!(m.gauge("circuit_state", &[API]), 2.0);
        tokio::time::sleep(10 * S).await;
        common::settle().await;
        assert_eq!(m.gauge("circuit_state", &[API]), 1.0, "the probe may go");
        // Unnamed: one scope open and one half-open show 2; then the half-open one.
        client.get("http://a.test/").send().await.unwrap();
        tokio::time::sleep(5 * S).await;
        client.get("http://b.test/").send().await.unwrap();
        assert_eq!(m.gauge("circuit_state", &[]), 2.0);
        tokio::time::sleep(5 * S).await;
        common::settle().await;
        assert_eq!(
            m.gauge("circuit_state", &[]),
            2.0,
            "a.test half-open, b.test open"
        );
        healthy.store(true, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(client.get(URL).send().await.unwrap().status(), 200);
        assert_eq!(m.gauge("circuit_state", &[API]), 0.0);
        assert_eq!(
            client.get("http://a.test/").send().await.unwrap().status(),
            200
        );
        assert_eq!(m.gauge("circuit_state", &[]), 2.0, "b.test still open");
        tokio::time::sleep(5 * S).await;
        common::settle().await;
        assert_eq!(m.gauge("circuit_state", &[]), 1.0, "b.test half-open");
        assert_eq!(
            client.get("http://b.test/").send().await.unwrap().status(),
            200
        );
        assert_eq!(m.gauge("circuit_state", &[]), 0.0);
    });
}
