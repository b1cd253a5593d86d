//! Goodput benchmark: the same workload through five clients, against the simulated gateway
//! and against nginx (benches/nginx/), in one run.
//!
//! ```text
//! benches/nginx/start.sh                                   # for --target nginx|both
//! cargo run --release --example goodput                    # both targets, a table of medians
//! cargo run --release --example goodput -- --json          # one JSON line per run, then medians
//! cargo run --release --example goodput -- --target nginx -n 300 --runs 3
//! ```
//!
//! Each run also draws an SVG (`--svg DIR`, default `target/goodput`; `--no-svg` for none):
//! requests answered per second over time for each client against the server's rate limit,
//! and requests in flight over time against its parallel cap
//! (`goodput-TARGET-runN.svg`; docs/goodput.svg is one).
//!
//! Clients, each with a fresh `Authorization` key (the servers count per key, so every run
//! starts from empty limits):
//! 1. `plain`: a `reqwest-middleware` client, no limiter;
//! 2. `reqwest-retry`: `RetryTransientMiddleware` with `ExponentialBackoff::builder()`'s
//!    defaults (1 s doubling, full jitter) and 3 retries, as in reqwest-retry's docs;
//! 3. `careful`: a tokio semaphore (the parallel cap) held until the body is read, a governor
//!    limiter at the server's rate checked before every attempt (retries included), and
//!    reqwest-retry as in 2;
//! 4. `throttle`: `Throttle` with the server's limits;
//! 5. `throttle-learned`: `Throttle` with only `max_in_flight`: limits learned from answers;
//! 6. `warm`: as 5, started with what 5 learned (`Throttle::learned_all`, `load_learned`), so
//!    it runs after 5 (`--clients learned,warm`).
//!
//! Server variants: `--nginx-port P` talks to an nginx started by `benches/nginx/start.sh` with
//! `NGINX_PORT=P UPSTREAM_PORT=P+1` (e.g. one started with `NGINX_RETRY_AFTER_MS=on` or
//! `NGINX_HINTS=off`); `--gateway-epoch-reset` has the gateway report `X-RateLimit-Limit`,
//! `-Remaining` and `-Reset` (whole epoch seconds, rounded up) on every answer.
//!
//! Every client has an innermost middleware that counts attempts and 429s as they come back.
//! The server-side peak is the gateway's `peak_parallel`, or the peak of requests in progress at
//! nginx's upstream.

#[path = "../benches/nginx/upstream.rs"]
mod upstream;

#[path = "goodput/plot.rs"]
mod plot;

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use reqwest::{Request, Response};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use reqwest_retry::policies::ExponentialBackoff;
use reqwest_retry::RetryTransientMiddleware;
use reqwest_throttle::testing::{Gateway, GatewayConfig, HeaderStyle};
use reqwest_throttle::{Throttle, ThrottleBuilder};
use tokio::sync::Semaphore;
use upstream::{
    fresh_key, nginx_is_up, Upstream, NGINX_BURST, NGINX_PARALLEL, NGINX_RATE_PER_S, NGINX_UPSTREAM,
};

const USAGE: &str = "usage: goodput [--json] [--target gateway|nginx|both] [-n REQUESTS] \
                     [--agents N] [--runs K] [--clients plain,retry,careful,throttle,learned,warm] \
                     [--nginx-burst B] [--nginx-port P] [--gateway-epoch-reset] \
                     [--svg DIR | --no-svg] [--events]";

const CLIENTS: [&str; 6] = ["plain", "retry", "careful", "throttle", "learned", "warm"];

#[derive(Debug, Clone)]
struct Args {
    json: bool,
    gateway: bool,
    nginx: bool,
    requests: usize,
    agents: usize,
    runs: usize,
    clients: Vec<&'static str>,
    /// The burst of the throttle's token bucket against nginx (default: nginx's `burst`).
    nginx_burst: u32,
    /// Where each run's SVG goes, if anywhere.
    svg: Option<std::path::PathBuf>,
    /// nginx's port (its upstream listens on the next one).
    nginx_port: u16,
    /// The gateway reports its window on every answer, its reset in whole epoch seconds.
    gateway_epoch_reset: bool,
    /// Print the learned and warm clients' events (refusals, cooldowns, limits learned),
    /// each with its time from the run's start, to standard error.
    events: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        json: false,
        gateway: true,
        nginx: true,
        requests: 600,
        agents: 50,
        runs: 1,
        clients: CLIENTS[..5].to_vec(),
        nginx_burst: NGINX_BURST,
        svg: Some("target/goodput".into()),
        nginx_port: 18080,
        gateway_epoch_reset: false,
        events: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value\n{USAGE}"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--json" => a.json = true,
            "--target" => match value()?.as_str() {
                "gateway" => (a.gateway, a.nginx) = (true, false),
                "nginx" => (a.gateway, a.nginx) = (false, true),
                "both" => (a.gateway, a.nginx) = (true, true),
                other => return Err(format!("unknown target {other:?}\n{USAGE}")),
            },
            "-n" | "--requests" => a.requests = number(value()?)?.max(1) as usize,
            "--agents" => a.agents = number(value()?)?.max(1) as usize,
            "--runs" => a.runs = number(value()?)?.max(1) as usize,
            "--nginx-burst" => a.nginx_burst = number(value()?)?.max(1) as u32,
            "--svg" => a.svg = Some(value()?.into()),
            "--no-svg" => a.svg = None,
            "--nginx-port" => a.nginx_port = number(value()?)?.clamp(1, 65534) as u16,
            "--gateway-epoch-reset" => a.gateway_epoch_reset = true,
            "--events" => a.events = true,
            "--clients" => {
                let v = value()?;
                a.clients = Vec::new();
                for name in v.split(',') {
                    let known = CLIENTS.iter().find(|c| **c == name.trim());
                    a.clients
                        .push(*known.ok_or(format!("unknown client {name:?}\n{USAGE}"))?);
                }
            }
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(a)
}

/// The server under test and its limits.
struct Server<'a> {
    name: &'static str,
    base: String,
    parallel: u32,
    /// The throttle with the server's limits (built fresh for every run).
    throttle: ThrottleBuilder,
    /// The careful client's governor quota.
    governor: Quota,
    /// Requests per second the server admits in the long run, and the span it counts them
    /// over, for the pictures.
    rate_per_s: f64,
    rate_window: Duration,
    min_s: f64,
    counts: Counts<'a>,
    /// What the `learned` client learned, for the `warm` client.
    learned: std::sync::Mutex<Vec<reqwest_throttle::LearnedLimits>>,
}

/// Where the server-side peak of parallel requests is read.
enum Counts<'a> {
    Gateway(&'a Gateway),
    Upstream(&'a Upstream),
}

impl Counts<'_> {
    fn reset(&self) {
        match self {
            Counts::Gateway(g) => g.reset_stats(),
            Counts::Upstream(u) => u.counts.reset(),
        }
    }

    fn peak(&self) -> u32 {
        match self {
            Counts::Gateway(g) => g.stats().peak_parallel,
            Counts::Upstream(u) => u.counts.peak(),
        }
    }
}

/// Counts attempts and 429s as they come back (the innermost layer of every client).
#[derive(Debug, Default)]
struct Counter {
    attempts: AtomicU64,
    responses_429: AtomicU64,
    timeline: plot::Timeline,
}

#[derive(Debug, Clone, Default)]
struct Counting(Arc<Counter>);

#[async_trait::async_trait]
impl Middleware for Counting {
    async fn handle(
        &self,
        req: Request,
        extensions: &mut http::Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        self.0.attempts.fetch_add(1, Ordering::Relaxed);
        let in_flight = &self.0.timeline.in_flight;
        in_flight.fetch_add(1, Ordering::Relaxed);
        let r = next.run(req, extensions).await;
        if matches!(&r, Ok(r) if r.status() == 429) {
            self.0.responses_429.fetch_add(1, Ordering::Relaxed);
        }
        // A 200 stays in flight until its body is read (the agent counts it out then).
        if !matches!(&r, Ok(r) if r.status() == 200) {
            in_flight.fetch_sub(1, Ordering::Relaxed);
        }
        r
    }
}

/// Waits for a governor cell before every attempt (below the retry layer, so retries too).
#[derive(Debug, Clone)]
struct Governed(Arc<DefaultDirectRateLimiter>);

#[async_trait::async_trait]
impl Middleware for Governed {
    async fn handle(
        &self,
        req: Request,
        extensions: &mut http::Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        self.0.until_ready().await;
        next.run(req, extensions).await
    }
}

fn retry_layer() -> RetryTransientMiddleware<ExponentialBackoff> {
    RetryTransientMiddleware::new_with_policy(
        ExponentialBackoff::builder().build_with_max_retries(3),
    )
}

/// One run of one client.
#[derive(Debug, Clone)]
struct Run {
    target: &'static str,
    client: &'static str,
    requests: usize,
    wall_s: f64,
    min_s: f64,
    attempts: u64,
    responses_429: u64,
    failures: usize,
    peak_parallel: u32,
    limit_parallel: u32,
    samples: plot::Samples,
}

impl Run {
    fn ratio(&self) -> f64 {
        self.wall_s / self.min_s
    }

    fn json(&self, kind: &str) -> String {
        serde_json::json!({
            "kind": kind,
            "target": self.target,
            "client": self.client,
            "requests": self.requests,
            "wall_s": self.wall_s,
            "theoretical_min_s": self.min_s,
            "ratio": self.ratio(),
            "attempts": self.attempts,
            "responses_429": self.responses_429,
            "failures": self.failures,
            "server_peak_parallel": self.peak_parallel,
            "limit_parallel": self.limit_parallel,
        })
        .to_string()
    }
}

async fn run_client(server: &Server<'_>, client_name: &'static str, args: &Args) -> Run {
    let http = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(args.agents)
        .build()
        .expect("a plain HTTP client builds");
    let counter = Counting::default();
    let mut semaphore = None;
    let mut learner = None;
    let client: ClientWithMiddleware = match client_name {
        "plain" => ClientBuilder::new(http).with(counter.clone()).build(),
        "retry" => ClientBuilder::new(http)
            .with(retry_layer())
            .with(counter.clone())
            .build(),
        "careful" => {
            semaphore = Some(Arc::new(Semaphore::new(server.parallel as usize)));
            ClientBuilder::new(http)
                .with(retry_layer())
                .with(Governed(Arc::new(RateLimiter::direct(server.governor))))
                .with(counter.clone())
                .build()
        }
        "throttle" => ClientBuilder::new(http)
            .with(server.throttle.clone().build().expect("valid settings"))
            .with(counter.clone())
            .build(),
        "learned" | "warm" => {
            let learned = Throttle::builder()
                .max_in_flight(server.parallel as usize)
                .build()
                .expect("valid settings");
            if client_name == "warm" {
                let saved = server.learned.lock().expect("not poisoned").clone();
                learned.load_learned(saved);
            }
            learner = Some(learned.clone());
            ClientBuilder::new(http)
                .with(learned)
                .with(counter.clone())
                .build()
        }
        other => unreachable!("client {other}"),
    };
    server.counts.reset();
    let key = Arc::new(fresh_key(&format!("goodput-{}-{client_name}", server.name)));
    let next = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(AtomicUsize::new(0));
    let n = args.requests;
    let started = Instant::now();
    let printer = learner
        .as_ref()
        .filter(|_| args.events)
        .map(|t| print_events(t, client_name, started));
    let sampler = {
        let counter = counter.0.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(plot::SAMPLE_EVERY);
            loop {
                tick.tick().await;
                counter.timeline.sample(started, Instant::now());
            }
        })
    };
    let agents: Vec<_> = (0..args.agents)
        .map(|_| {
            let (client, next, failures, key, base, semaphore, counter) = (
                client.clone(),
                next.clone(),
                failures.clone(),
                key.clone(),
                server.base.clone(),
                semaphore.clone(),
                counter.0.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    // Every fifth request streams its answer, holding its slot until the end.
                    let route = if i % 5 == 4 { "v1/stream" } else { "v1/chat" };
                    let _slot = match &semaphore {
                        Some(s) => Some(s.clone().acquire_owned().await.expect("never closed")),
                        None => None,
                    };
                    let ok = match client
                        .get(format!("{base}/{route}"))
                        .header("authorization", key.as_str())
                        .send()
                        .await
                    {
                        Ok(r) => {
                            let success = r.status() == 200;
                            // Read to the end: a body in progress still holds its slot.
                            let read = r.bytes().await.is_ok();
                            if success {
                                counter.timeline.body_done(started, Instant::now(), read);
                            }
                            read && success
                        }
                        Err(_) => false,
                    };
                    if !ok {
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for agent in agents {
        agent.await.expect("agent task panicked");
    }
    let wall_s = started.elapsed().as_secs_f64();
    sampler.abort();
    if let Some(p) = printer {
        p.abort();
    }
    counter.0.timeline.sample(started, Instant::now());
    if let Counts::Gateway(g) = &server.counts {
        let s = g.stats();
        eprintln!(
            "{client_name} gateway refused: {} for the window, {} for parallel requests",
            s.refused_window, s.refused_parallel
        );
    }
    if let Some(t) = learner {
        let learned = t.learned_all();
        eprintln!("{client_name} learned: {learned:?}");
        if client_name == "learned" {
            *server.learned.lock().expect("not poisoned") = learned;
        }
    }
    let name = match client_name {
        "plain" => "plain reqwest-middleware",
        "retry" => "reqwest-retry (default backoff)",
        "careful" => "governor + semaphore + retry",
        "throttle" => "Throttle, limits configured",
        "learned" => "Throttle, max_in_flight only",
        _ => "Throttle, warm start from learned",
    };
    Run {
        target: server.name,
        client: name,
        requests: n,
        wall_s,
        min_s: server.min_s,
        attempts: counter.0.attempts.load(Ordering::Relaxed),
        responses_429: counter.0.responses_429.load(Ordering::Relaxed),
        failures: failures.load(Ordering::Relaxed),
        peak_parallel: server.counts.peak(),
        limit_parallel: server.parallel,
        samples: counter.0.timeline.samples(),
    }
}

/// Prints `throttle`'s events to standard error, each with its time from `started`.
fn print_events(
    throttle: &Throttle,
    client_name: &'static str,
    started: Instant,
) -> tokio::task::JoinHandle<()> {
    let mut events = throttle.events();
    tokio::spawn(async move {
        use tokio::sync::broadcast::error::RecvError;
        loop {
            match events.recv().await {
                Ok(e) => eprintln!(
                    "{client_name} {:9.3} s {e:?}",
                    started.elapsed().as_secs_f64()
                ),
                Err(RecvError::Lagged(n)) => eprintln!("{client_name} {n} events lost"),
                Err(RecvError::Closed) => break,
            }
        }
    })
}

/// Busy time of the workload: four chat answers for every streamed one.
fn busy_s(n: usize, chat: Duration, stream: Duration) -> (f64, f64) {
    let streams = (n / 5) as f64;
    let busy = (n as f64 - streams) * chat.as_secs_f64() + streams * stream.as_secs_f64();
    let last = if n % 5 == 0 { stream } else { chat };
    (busy, last.as_secs_f64())
}

fn gateway_server(gateway: &Gateway, n_req: usize) -> Server<'_> {
    let g = gateway.config().clone();
    let limit = g.requests_per_window;
    let throttle = Throttle::builder()
        .sliding_window(limit, g.window)
        .max_in_flight(g.max_parallel as usize);
    let streams = n_req / 5;
    Server {
        name: "gateway",
        base: gateway.url(),
        parallel: g.max_parallel,
        throttle,
        // "N per window" in governor's terms: burst N, one cell every window / N.
        governor: Quota::with_period(g.window / limit)
            .expect("a non-zero period")
            .allow_burst(NonZeroU32::new(limit).expect("a gateway limit is not zero")),
        rate_per_s: f64::from(limit) / g.window.as_secs_f64(),
        rate_window: g.window,
        min_s: g
            .least_time(n_req - streams, streams, n_req % 5 == 0)
            .as_secs_f64(),
        counts: Counts::Gateway(gateway),
        learned: Default::default(),
    }
}

fn nginx_server(upstream: &Upstream, url: String, n_req: usize, throttle_burst: u32) -> Server<'_> {
    let rate = NonZeroU32::new(NGINX_RATE_PER_S).expect("non-zero");
    let burst = NonZeroU32::new(NGINX_BURST).expect("non-zero");
    let throttle = Throttle::builder()
        .token_bucket(
            Quota::per_second(rate).allow_burst(NonZeroU32::new(throttle_burst).expect("non-zero")),
        )
        .max_in_flight(NGINX_PARALLEL as usize);
    let stream = upstream::STREAM_CHUNK_INTERVAL * upstream::STREAM_CHUNKS;
    let (busy, last) = busy_s(n_req, upstream::SERVICE_TIME, stream);
    // limit_req burst=B nodelay: B + 1 at once, then one every 1/rate.
    let paced = n_req.saturating_sub(NGINX_BURST as usize + 1) as f64;
    Server {
        name: "nginx",
        base: url,
        parallel: NGINX_PARALLEL,
        throttle,
        governor: Quota::per_second(rate).allow_burst(burst),
        rate_per_s: f64::from(NGINX_RATE_PER_S),
        rate_window: Duration::from_secs(1),
        min_s: (paced / f64::from(NGINX_RATE_PER_S) + last).max(busy / f64::from(NGINX_PARALLEL)),
        counts: Counts::Upstream(upstream),
        learned: Default::default(),
    }
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

fn print_table(runs: &[Run], args: &Args) {
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for r in runs {
        if !keys.contains(&(r.target, r.client)) {
            keys.push((r.target, r.client));
        }
    }
    let mut medians = Vec::new();
    for (target, client) in keys {
        let these: Vec<&Run> = runs
            .iter()
            .filter(|r| r.target == target && r.client == client)
            .collect();
        let of = |f: fn(&Run) -> f64| median(these.iter().map(|r| f(r)).collect());
        medians.push(Run {
            target: these[0].target,
            client: these[0].client,
            requests: these[0].requests,
            wall_s: of(|r| r.wall_s),
            min_s: these[0].min_s,
            attempts: of(|r| r.attempts as f64) as u64,
            responses_429: of(|r| r.responses_429 as f64) as u64,
            failures: of(|r| r.failures as f64) as usize,
            peak_parallel: these.iter().map(|r| r.peak_parallel).max().unwrap_or(0),
            limit_parallel: these[0].limit_parallel,
            samples: plot::Samples::default(),
        });
    }
    if args.json {
        for m in &medians {
            println!("{}", m.json("median"));
        }
        return;
    }
    println!(
        "{} requests from {} tasks, medians of {} run(s) (peak: the largest)",
        args.requests, args.agents, args.runs
    );
    println!(
        "| target | client | wall s | min s | wall/min | 429s | failures | server peak parallel |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for m in &medians {
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.3} | {} | {} | {} / {} |",
            m.target,
            m.client,
            m.wall_s,
            m.min_s,
            m.ratio(),
            m.responses_429,
            m.failures,
            m.peak_parallel,
            m.limit_parallel
        );
    }
}

/// Draws the runs of round `run` (one per client) against `server` into `dir`.
fn draw_round(dir: &std::path::Path, server: &Server<'_>, run: usize, round: &[Run], args: &Args) {
    let path = dir.join(format!("goodput-{}-run{}.svg", server.name, run + 1));
    let limits = plot::Limits {
        title: format!(
            "{}: {} requests from {} tasks (run {})",
            server.name,
            args.requests,
            args.agents,
            run + 1
        ),
        rate_per_s: server.rate_per_s,
        rate_window_s: server.rate_window.as_secs_f64(),
        parallel: server.parallel,
    };
    let lines: Vec<_> = round
        .iter()
        .map(|r| plot::Line {
            client: r.client,
            samples: &r.samples,
        })
        .collect();
    let drawn = std::fs::create_dir_all(dir)
        .map_err(Into::into)
        .and_then(|()| plot::draw(&path, &limits, &lines));
    match drawn {
        Ok(()) => eprintln!("wrote {}", path.display()),
        Err(e) => eprintln!("{}: not drawn: {e}", path.display()),
    }
}

async fn run_target(server: &Server<'_>, args: &Args, runs: &mut Vec<Run>) {
    for run in 0..args.runs {
        let first = runs.len();
        for &client in &args.clients {
            let r = run_client(server, client, args).await;
            if args.json {
                println!("{}", r.json("run"));
            } else {
                eprintln!(
                    "run {}/{}: {:7} {:32} {:6.2} s ({:.3}x)  429s {:4}  failures {:3}  peak {}",
                    run + 1,
                    args.runs,
                    r.target,
                    r.client,
                    r.wall_s,
                    r.ratio(),
                    r.responses_429,
                    r.failures,
                    r.peak_parallel
                );
            }
            runs.push(r);
        }
        if let Some(dir) = &args.svg {
            draw_round(dir, server, run, &runs[first..], args);
        }
    }
}

#[tokio::main]
async fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("{msg}");
            std::process::exit(2);
        }
    };
    let mut runs = Vec::new();
    if args.gateway {
        // The seed's limits, time scaled by 10: 120 per 6 s, 20 parallel, 50 ms, 5 x 20 ms streams.
        let mut config = GatewayConfig::seed_limits_scaled(10.0);
        if args.gateway_epoch_reset {
            config = config.with_rate_limit_headers(HeaderStyle::EpochReset);
        }
        let gateway = Gateway::start(config).expect("the gateway binds");
        run_target(&gateway_server(&gateway, args.requests), &args, &mut runs).await;
        let _ = gateway.shutdown().await;
    }
    if args.nginx {
        let url = format!("http://127.0.0.1:{}", args.nginx_port);
        let up = match reqwest::Client::builder().no_proxy().build() {
            Ok(http) if args.nginx_port == 18080 => nginx_is_up(&http).await,
            Ok(http) => {
                let health = http.get(format!("{url}/health")).send().await;
                matches!(health, Ok(r) if r.status() == 200)
            }
            Err(_) => false,
        };
        if !up {
            eprintln!("nginx: skipped, nothing answers on {url} (run benches/nginx/start.sh)");
        } else {
            let upstream_addr = match args.nginx_port {
                18080 => NGINX_UPSTREAM.to_owned(),
                p => format!("127.0.0.1:{}", p + 1),
            };
            let upstream = Upstream::start(&upstream_addr)
                .await
                .expect("the upstream binds to its fixed port");
            let server = nginx_server(&upstream, url, args.requests, args.nginx_burst);
            run_target(&server, &args, &mut runs).await;
            upstream.shutdown().await;
        }
    }
    print_table(&runs, &args);
}
