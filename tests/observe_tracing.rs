//! Tracing: one span per call with its scope, priority and cost; each attempt, wait and
//! decision an event inside it, at the documented level.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use common::{json, status, FakeServer};
use reqwest_throttle::{NoRetry, Priority, Throttle};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// One event as seen: its level, message, fields, and the span it was in.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    level: Level,
    message: String,
    fields: Vec<(String, String)>,
    span: Option<u64>,
}

/// Fields by name, their values as text.
type FieldList = Vec<(String, String)>;

#[derive(Default)]
struct Log {
    /// Each span: its id, name and fields.
    spans: Vec<(u64, String, FieldList)>,
    events: Vec<Seen>,
    entered: Vec<u64>,
}

/// A subscriber that keeps every span and event (a test's own: `tracing` is the crate's only
/// logging dependency).
#[derive(Clone, Default)]
struct Collect {
    next: Arc<AtomicU64>,
    log: Arc<Mutex<Log>>,
}

#[derive(Default)]
struct Fields(FieldList);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }
}

impl Subscriber for Collect {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let mut fields = Fields::default();
        span.record(&mut fields);
        let name = span.metadata().name().to_owned();
        self.log.lock().unwrap().spans.push((id, name, fields.0));
        Id::from_u64(id)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let message = fields
            .0
            .iter()
            .position(|(k, _)| k == "message")
            .map(|i| fields.0.remove(i).1)
            .unwrap_or_default();
        let mut log = self.log.lock().unwrap();
        let span = log.entered.last().copied();
        log.events.push(Seen {
            level: *event.metadata().level(),
            message,
            fields: fields.0,
            span,
        });
    }

    fn enter(&self, span: &Id) {
        self.log.lock().unwrap().entered.push(span.into_u64());
    }

    fn exit(&self, _: &Id) {
        self.log.lock().unwrap().entered.pop();
    }
}

/// Runs `test` on a paused runtime with `collect` as this thread's subscriber.
fn traced<F: std::future::Future<Output = ()>>(collect: &Collect, test: F) {
    let rt = common::paused_runtime();
    tracing::subscriber::with_default(collect.clone(), || rt.block_on(test));
}

fn event(level: Level, message: &str, fields: &[(&str, &str)], span: u64) -> Seen {
    Seen {
        level,
        message: message.to_owned(),
        fields: fields
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        span: Some(span),
    }
}

#[test]
fn one_span_per_call_with_each_attempt_wait_and_decision_inside() {
    let collect = Collect::default();
    traced(&collect, async {
        let throttle = Throttle::builder().jitter(false).build().unwrap();
        let server = FakeServer::new(|i, _| match i {
            0 => json(
                429,
                &[("retry-after", "1"), ("rate_limit_type", "rpm")],
                "{}",
            ),
            _ => status(200),
        });
        let client = server.client(&throttle);
        let r = client
            .get("http://api.test/v1")
            .with_extension(Priority::High)
            .with_extension(reqwest_throttle::Cost(3))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    });
    let log = collect.log.lock().unwrap();
    let spans: Vec<_> = log
        .spans
        .iter()
        .filter(|(_, name, _)| name == "throttle_request")
        .collect();
    assert_eq!(spans.len(), 1, "one span per call");
    let (id, _, fields) = spans[0];
    let field = |k: &str, v: &str| (k.to_owned(), v.to_owned());
    assert_eq!(
        *fields,
        [
            field("scope", "http://api.test:80"),
            field("priority", "High"),
            field("cost", "3")
        ]
    );
    let ours: Vec<_> = log
        .events
        .iter()
        .filter(|e| e.span == Some(*id))
        .cloned()
        .collect();
    assert_eq!(
        ours,
        [
            event(
                Level::TRACE,
                "admitted",
                &[("attempt", "1"), ("waited", "0ns")],
                *id
            ),
            event(
                Level::DEBUG,
                "answer",
                &[("attempt", "1"), ("status", "429")],
                *id
            ),
            event(
                Level::DEBUG,
                "shared cooldown closed",
                &[("status", "429"), ("cooldown", "1s")],
                *id
            ),
            event(
                Level::DEBUG,
                "retrying",
                &[("attempt", "2"), ("wait", "1s")],
                *id
            ),
            event(
                Level::TRACE,
                "admitted",
                &[("attempt", "2"), ("waited", "0ns")],
                *id
            ),
            event(
                Level::DEBUG,
                "answer",
                &[("attempt", "2"), ("status", "200")],
                *id
            ),
        ]
    );
}

#[test]
fn a_wait_for_admission_is_a_debug_event_and_a_stop_says_why() {
    let collect = Collect::default();
    traced(&collect, async {
        let throttle = Throttle::builder().max_in_flight(1).build().unwrap();
        let server =
            FakeServer::new(|_, _| status(503)).with_delay(std::time::Duration::from_secs(2));
        let client = server.client(&throttle);
        let send = || {
            client
                .get("http://api.test/")
                .with_extension(NoRetry)
                .send()
        };
        let (a, b) = tokio::join!(send(), send());
        assert_eq!(a.unwrap().status(), 503);
        assert_eq!(b.unwrap().status(), 503);
    });
    let log = collect.log.lock().unwrap();
    let named = |m: &str| -> Vec<(Level, FieldList)> {
        log.events
            .iter()
            .filter(|e| e.message == m)
            .map(|e| (e.level, e.fields.clone()))
            .collect()
    };
    let f = |k: &str, v: &str| (k.to_owned(), v.to_owned());
    assert_eq!(
        named("admitted"),
        [
            (Level::TRACE, vec![f("attempt", "1"), f("waited", "0ns")]),
            (Level::DEBUG, vec![f("attempt", "1"), f("waited", "2s")]),
        ]
    );
    assert_eq!(
        named("not retried"),
        [
            (
                Level::DEBUG,
                vec![f("attempts", "1"), f("reason", "RetryDisabled")]
            ),
            (
                Level::DEBUG,
                vec![f("attempts", "1"), f("reason", "RetryDisabled")]
            ),
        ]
    );
    // Every event of the throttle is inside a call's span.
    assert!(
        log.events.iter().all(|e| e.span.is_some()),
        "{:?}",
        log.events
    );
}
