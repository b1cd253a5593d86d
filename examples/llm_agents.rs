//! LLM agents with mixed priorities and token costs share one API key through one `Throttle`.
//!
//! It starts the simulated gateway on loopback with limits per window of requests, tokens and
//! parallel requests, time scaled by 10 (a 6 s window stands for a minute), and runs 12 agents:
//! interactive ones (`Priority::High`, short answers), workers (`Normal`) and batch jobs
//! (`Low`, long answers). Each request's `Cost` is its estimate, `max_tokens`; the gateway
//! uses about 60 % of it, says so in the body's `usage`, and each agent settles the charge with
//! that true figure. A line a second shows requests and tokens against their limits, and the
//! throttle's capacity warnings ([`Throttle::events`]) are printed as they come, once each time
//! a limit passes 80 %; a summary gives the latency per priority and the tokens
//! per window achieved against the limit.
//!
//! ```text
//! cargo run --release --example llm_agents
//! cargo run --release --example llm_agents -- --no-settle   # charges stay at their estimate
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_throttle::observe::WarnedLimit;
use reqwest_throttle::testing::{Gateway, GatewayConfig, HeaderStyle};
use reqwest_throttle::{Charge, Cost, Event, Priority, Stats, Throttle};
use tokio::sync::broadcast;
use tokio::time::Instant;

/// The window: a minute, time scaled by 10.
const WINDOW: Duration = Duration::from_secs(6);
const REQUESTS_PER_WINDOW: u32 = 120;
const TOKENS_PER_WINDOW: u32 = 40_000;
const PARALLEL: u32 = 8;
/// The share of `max_tokens` an answer uses.
const USAGE: f64 = 0.6;
/// The share of a limit, in percent, past which the throttle sends a capacity warning.
const WARN_AT_PERCENT: u8 = 80;
const REQUESTS_PER_AGENT: usize = 12;

/// A kind of agent: its priority, how many run, and its range of `max_tokens`.
struct Kind {
    name: &'static str,
    priority: Priority,
    agents: usize,
    max_tokens: (u32, u32),
}

const KINDS: [Kind; 3] = [
    Kind {
        name: "interactive",
        priority: Priority::High,
        agents: 3,
        max_tokens: (200, 600),
    },
    Kind {
        name: "worker",
        priority: Priority::Normal,
        agents: 5,
        max_tokens: (800, 2_000),
    },
    Kind {
        name: "batch",
        priority: Priority::Low,
        agents: 4,
        max_tokens: (2_000, 4_000),
    },
];

/// One answered request, as the agent saw it.
#[derive(Debug, Clone, Copy)]
struct Done {
    kind: usize,
    at: Instant,
    latency: Duration,
    used: u32,
}

#[derive(Debug, Default)]
struct Log {
    done: Vec<Done>,
    failed: usize,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let gateway = Gateway::start(
        GatewayConfig::default()
            .with_window(WINDOW)
            .with_requests_per_window(REQUESTS_PER_WINDOW)
            .with_tokens_per_window(TOKENS_PER_WINDOW)
            .with_max_parallel(PARALLEL)
            .with_service_time(Duration::from_millis(150))
            .with_usage_fraction(USAGE)
            .with_rate_limit_headers(HeaderStyle::Anthropic),
    )?;
    // The throttle is told the same limits as the gateway enforces.
    let throttle = Throttle::builder()
        .requests_window(REQUESTS_PER_WINDOW, WINDOW)
        .token_window(TOKENS_PER_WINDOW, WINDOW)
        .max_in_flight(PARALLEL as usize)
        .capacity_warning(WARN_AT_PERCENT)
        .build()?;
    let http = reqwest::Client::builder().no_proxy().build()?;
    let client = ClientBuilder::new(http).with(throttle.clone()).build();
    let url = format!("{}/v1/chat", gateway.url());
    let settle = !std::env::args().any(|a| a == "--no-settle");
    let log = Arc::new(Mutex::new(Log::default()));
    let t0 = Instant::now();

    println!(
        "{} agents, {} requests each; limits per {WINDOW:?} window: {REQUESTS_PER_WINDOW} requests, \
         {TOKENS_PER_WINDOW} tokens, {PARALLEL} in flight",
        KINDS.iter().map(|k| k.agents).sum::<usize>(),
        REQUESTS_PER_AGENT
    );
    // Subscribed before the first request, so that no warning is missed.
    let events = throttle.events();
    let mut agents = Vec::new();
    for (kind, k) in KINDS.iter().enumerate() {
        for n in 0..k.agents {
            let seed = (kind * 100 + n) as u64;
            let (client, url, log) = (client.clone(), url.clone(), log.clone());
            agents.push(tokio::spawn(agent(client, url, kind, seed, settle, log)));
        }
    }
    let view = tokio::spawn(live_view(throttle.clone(), log.clone(), t0));
    let warnings = tokio::spawn(capacity_warnings(events, t0));
    for a in agents {
        a.await?;
    }
    view.abort();
    warnings.abort();
    let elapsed = t0.elapsed();
    summary(&log.lock().unwrap(), t0, elapsed, &gateway);
    gateway.shutdown().await?;
    Ok(())
}

/// One agent: `REQUESTS_PER_AGENT` requests one after another, each settled with its usage
/// if `settle`.
async fn agent(
    client: ClientWithMiddleware,
    url: String,
    kind: usize,
    seed: u64,
    settle: bool,
    log: Arc<Mutex<Log>>,
) {
    let k = &KINDS[kind];
    let mut rng = SmallRng::seed_from_u64(seed);
    for _ in 0..REQUESTS_PER_AGENT {
        let max_tokens = rng.random_range(k.max_tokens.0..=k.max_tokens.1);
        let start = Instant::now();
        match ask(&client, &url, k.priority, max_tokens, settle).await {
            Ok(used) => log.lock().unwrap().done.push(Done {
                kind,
                at: Instant::now(),
                latency: start.elapsed(),
                used,
            }),
            Err(e) => {
                eprintln!("{}: {e}", k.name);
                log.lock().unwrap().failed += 1;
            }
        }
    }
}

/// Sends one chat request charged `max_tokens`, reads the tokens its answer used and (if
/// `settle`) settles the charge with them.
async fn ask(
    client: &ClientWithMiddleware,
    url: &str,
    priority: Priority,
    max_tokens: u32,
    settle: bool,
) -> Result<u32, Box<dyn std::error::Error>> {
    let body = serde_json::json!({ "max_tokens": max_tokens, "messages": [] });
    let response = client
        .post(url)
        .with_extension(Cost(max_tokens))
        .with_extension(priority)
        .body(body.to_string())
        .send()
        .await?;
    if !response.status().is_success() {
        return Err(format!("status {}", response.status()).into());
    }
    // Taken before the body is read: reading consumes the response.
    let charge = response.extensions().get::<Charge>().cloned();
    let answer: serde_json::Value = serde_json::from_slice(&response.bytes().await?)?;
    let used = answer["usage"]["total_tokens"]
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or("no usage in the answer")?;
    if let Some(charge) = charge.filter(|_| settle) {
        charge.settle(used).await?;
    }
    Ok(used)
}

/// A line a second: requests and tokens of the last window against their limits, in flight,
/// queued.
async fn live_view(throttle: Throttle, log: Arc<Mutex<Log>>, t0: Instant) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let now = Instant::now();
        let (requests, tokens) = {
            let log = log.lock().unwrap();
            let recent = log.done.iter().filter(|d| now - d.at < WINDOW);
            recent.fold((0u32, 0u64), |(r, t), d| (r + 1, t + u64::from(d.used)))
        };
        let Stats {
            in_flight, queued, ..
        } = throttle.stats();
        println!(
            "{:>5.1} s  last window: {requests:>3}/{REQUESTS_PER_WINDOW} requests, \
             {tokens:>6}/{TOKENS_PER_WINDOW} tokens  in flight {in_flight}/{PARALLEL}  queued {queued:>2}",
            (now - t0).as_secs_f64()
        );
    }
}

/// Prints the throttle's capacity warnings as they come: once each time a limit crosses
/// `WARN_AT_PERCENT` of its capacity (the throttle re-arms it when usage falls back under).
async fn capacity_warnings(mut events: broadcast::Receiver<Event>, t0: Instant) {
    loop {
        match events.recv().await {
            Ok(Event::CapacityWarning {
                limit,
                used,
                capacity,
                ..
            }) => {
                let name = match limit {
                    WarnedLimit::InFlight => "in flight",
                    WarnedLimit::Quota(q) if q.capacity() == TOKENS_PER_WINDOW => "tokens",
                    WarnedLimit::Quota(_) => "requests",
                    _ => "a limit",
                };
                println!(
                    "{:>5.1} s  warning: {name} at {:.0} % of its limit ({used}/{capacity})",
                    t0.elapsed().as_secs_f64(),
                    used as f64 / capacity as f64 * 100.0
                );
            }
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                println!("        ({missed} events missed)");
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// The value at quantile `q` (0 to 1) of sorted `v`.
fn quantile(v: &[Duration], q: f64) -> Duration {
    let i = ((v.len().saturating_sub(1)) as f64 * q).round() as usize;
    v.get(i).copied().unwrap_or_default()
}

/// Tokens answered per window over the whole windows of the run (a last, partial window
/// would overstate the rate: a sliding window lets its whole limit through at its start).
fn tokens_per_window(done: &[Done], t0: Instant, elapsed: Duration) -> f64 {
    let whole = (elapsed.as_secs_f64() / WINDOW.as_secs_f64())
        .floor()
        .max(1.0);
    let end = t0 + WINDOW.mul_f64(whole);
    let used: u64 = done
        .iter()
        .filter(|d| d.at < end)
        .map(|d| u64::from(d.used))
        .sum();
    used as f64 / whole
}

fn summary(log: &Log, t0: Instant, elapsed: Duration, gateway: &Gateway) {
    println!("\ndone in {:.1} s", elapsed.as_secs_f64());
    println!(
        "{:<12} {:>9} {:>8} {:>9} {:>9}",
        "agents", "priority", "answers", "p50", "p99"
    );
    for (kind, k) in KINDS.iter().enumerate() {
        let mut latencies: Vec<_> = log
            .done
            .iter()
            .filter(|d| d.kind == kind)
            .map(|d| d.latency)
            .collect();
        latencies.sort();
        println!(
            "{:<12} {:>9} {:>8} {:>7.0}ms {:>7.0}ms",
            k.name,
            format!("{:?}", k.priority),
            latencies.len(),
            quantile(&latencies, 0.5).as_secs_f64() * 1e3,
            quantile(&latencies, 0.99).as_secs_f64() * 1e3,
        );
    }
    let used: u64 = log.done.iter().map(|d| u64::from(d.used)).sum();
    let per_window = tokens_per_window(&log.done, t0, elapsed);
    println!(
        "tokens per window ({WINDOW:?}, a minute scaled 10x), over the whole windows of the run: \
         {per_window:.0} achieved of {TOKENS_PER_WINDOW} allowed ({:.0} %); {used} tokens used in all",
        per_window / f64::from(TOKENS_PER_WINDOW) * 100.0
    );
    let s = gateway.stats();
    println!(
        "gateway: {} answered, {} refused with 429 ({} for tokens), at most {} tokens and {} \
         requests in one window, {} in parallel; {} requests failed",
        s.admitted,
        s.responses_429,
        s.refused_tokens,
        s.max_tokens_in_window,
        s.max_in_window,
        s.peak_parallel,
        log.failed
    );
}
