//! The main job: a swarm of agents calls one rate-limited API through one shared `Throttle`.
//!
//! By default it starts the simulated gateway on loopback with the seed's limits, time scaled
//! by 10 (120 requests per 6 s, 20 parallel, ~50 ms service time, every fifth request a
//! streaming response), and sends 600 requests from 50 concurrent agents.
//!
//! ```text
//! cargo run --release --example swarm                 # progress bar, then a summary
//! cargo run --release --example swarm -- --json       # the summary as one JSON line
//! cargo run --release --example swarm -- --compare    # also run a plain client, for contrast
//! cargo run --release --example swarm -- --no-quota   # only max_in_flight: limits learned from 429s
//! cargo run --release --example swarm -- --url http://127.0.0.1:8080/v1/chat \
//!     --header 'Authorization: Bearer KEY' --rpm 120 --parallel 20 -n 200
//! cargo run --release --example swarm -- --processes 4 --redis redis://127.0.0.1:6379
//! ```
//!
//! With `--processes N` the swarm runs as N OS processes (this program, started again), the
//! agents and requests split among them, against one gateway: with `--redis URL` they share
//! one quota through a `RedisStore`; with `--static-split` each has 1/N of the limits;
//! with neither, each has the full limits. The summary shows each process's figures.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_throttle::store::RedisStore;
use reqwest_throttle::testing::{Gateway, GatewayConfig};
use reqwest_throttle::Throttle;
use tokio::time::Instant;

#[path = "swarm/fleet.rs"]
mod fleet;

const HELP: &str = "\
swarm: 50 agents share one rate-limited API through one reqwest-throttle Throttle.

Without --url it starts a simulated gateway on loopback with the given limits (default: 120
requests per 6 s window, 20 parallel, ~50 ms per answer, every fifth answer streamed) and
reports what the gateway saw.

usage: swarm [OPTIONS]
  --json              print each summary as one JSON line on stdout
  --compare           also run a plain client (no throttle), for contrast
  --no-quota          configure only max_in_flight: learn the window from 429s
  -n, --requests N    requests in all (default 600)
  --agents N          concurrent agents (default 50)
  --rpm N             requests allowed per window (default 120)
  --window-secs S     window length in seconds (default 6; 60 with --url)
  --parallel N        requests allowed in flight (default 20)
  --url URL           send GET requests to this http:// URL instead (no TLS in this example)
  --header 'Name: v'  add a header to every request (repeatable), e.g. Authorization
  --processes N       run as N processes against one gateway (see below)
  --redis URL         share the limits through Redis (e.g. redis://127.0.0.1:6379)
  --static-split      with --processes: give each process 1/N of the limits instead
  --uneven P          with --processes: the first process gets P % of the requests
  -h, --help          this help

With --processes N the swarm runs as N processes of this program, started together, sharing
one gateway: with --redis they share one quota; with --static-split each gets 1/N of it;
with neither, each gets all of it.";

#[derive(Debug, Clone)]
struct Args {
    json: bool,
    compare: bool,
    no_quota: bool,
    requests: usize,
    agents: usize,
    url: Option<reqwest::Url>,
    headers: Vec<(String, String)>,
    per_window: u32,
    window: Duration,
    parallel: usize,
    fleet: fleet::Args,
}

/// What the command line asked for: a run, or the help text.
enum Command {
    Run(Box<Args>),
    Help,
}

fn parse_args() -> Result<Command, String> {
    let mut a = Args {
        json: false,
        compare: false,
        no_quota: false,
        requests: 600,
        agents: 50,
        url: None,
        headers: Vec::new(),
        per_window: 120,
        window: Duration::ZERO,
        parallel: 20,
        fleet: fleet::Args::default(),
    };
    let mut window_secs = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || {
            args.next()
                .ok_or(format!("{flag} needs a value (see --help)"))
        };
        let number = |v: String| {
            v.parse::<u32>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or(format!("{flag} takes a whole number above 0, not {v:?}"))
        };
        match flag.as_str() {
            "--json" => a.json = true,
            "--compare" => a.compare = true,
            "--no-quota" => a.no_quota = true,
            "-n" | "--requests" => a.requests = number(value()?)? as usize,
            "--agents" => a.agents = number(value()?)? as usize,
            "--url" => {
                let v = value()?;
                let url = reqwest::Url::parse(&v).map_err(|e| format!("--url {v:?}: {e}"))?;
                if url.scheme() != "http" {
                    return Err(format!(
                        "--url {v:?}: only http:// is supported (this example is built without TLS)"
                    ));
                }
                a.url = Some(url);
            }
            "--header" => {
                let h = value()?;
                let (name, v) = h
                    .split_once(':')
                    .ok_or(format!("--header {h:?}: expected 'Name: value'"))?;
                a.headers
                    .push((name.trim().to_owned(), v.trim().to_owned()));
            }
            "--rpm" => a.per_window = number(value()?)?,
            "--window-secs" => window_secs = Some(number(value()?)?),
            "--parallel" => a.parallel = number(value()?)? as usize,
            "--processes" => a.fleet.processes = number(value()?)? as usize,
            "--redis" => a.fleet.redis = Some(value()?),
            "--static-split" => a.fleet.static_split = true,
            "--uneven" => a.fleet.uneven = Some(number(value()?)?.min(100)),
            "--child-gateway" => a.fleet.child_gateway = Some(value()?),
            "--child-start-ms" => {
                a.fleet.start_ms = Some(value()?.parse().map_err(|e| format!("{e}"))?)
            }
            "--child-namespace" => a.fleet.namespace = Some(value()?),
            "-h" | "--help" => return Ok(Command::Help),
            other => return Err(format!("unknown argument {other:?} (see --help)")),
        }
    }
    // A real API counts in real time: the seed's 60 s window unless told otherwise.
    let default_window = if a.url.is_some() { 60 } else { 6 };
    a.window = Duration::from_secs(window_secs.unwrap_or(default_window).into());
    Ok(Command::Run(Box::new(a)))
}

/// What one run of the swarm measured.
#[derive(Debug, Default)]
struct Summary {
    client: &'static str,
    requests: usize,
    sent: u64,
    ok: usize,
    failures: usize,
    responses_429: u64,
    retries: u64,
    wall_s: f64,
    theoretical_min_s: f64,
    server: Option<reqwest_throttle::testing::GatewayStats>,
    first_failure: Option<String>,
}

/// Counts kept while the swarm runs.
#[derive(Debug, Default)]
struct Progress {
    next: AtomicUsize,
    done: AtomicUsize,
    ok: AtomicUsize,
    /// 429s that reached an agent (the throttle gave up on them, or there is no throttle).
    final_429: AtomicUsize,
    first_failure: std::sync::Mutex<Option<String>>,
}

impl Progress {
    fn fail(&self, why: String) {
        let mut first = self.first_failure.lock().unwrap_or_else(|e| e.into_inner());
        first.get_or_insert(why);
    }
}

/// Where the agents send: the gateway (chat and stream routes) or one given URL.
#[derive(Debug, Clone)]
enum Target {
    Gateway { base: String },
    Url(String),
}

impl Target {
    fn url_for(&self, i: usize) -> String {
        match self {
            // Every fifth request streams its answer, holding its parallel slot until the end.
            Target::Gateway { base } if i % 5 == 4 => format!("{base}/v1/stream"),
            Target::Gateway { base } => format!("{base}/v1/chat"),
            Target::Url(url) => url.clone(),
        }
    }
}

async fn run_swarm(
    client: ClientWithMiddleware,
    target: Target,
    args: &Args,
    client_name: &'static str,
    throttle: Option<&Throttle>,
) -> Summary {
    let progress = Arc::new(Progress::default());
    let headers = Arc::new(args.headers.clone());
    fleet::wait_for_start(&args.fleet).await;
    let started = Instant::now();
    let agents: Vec<_> = (0..args.agents)
        .map(|_| {
            let (client, target, progress, headers) = (
                client.clone(),
                target.clone(),
                progress.clone(),
                headers.clone(),
            );
            let n = args.requests;
            tokio::spawn(async move {
                loop {
                    let i = progress.next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    let mut req = client.get(target.url_for(i));
                    for (name, value) in headers.iter() {
                        req = req.header(name, value);
                    }
                    let ok = match req.send().await {
                        Ok(r) => {
                            let status = r.status();
                            if status == 429 {
                                progress.final_429.fetch_add(1, Ordering::Relaxed);
                            }
                            // Read to the end: a body in progress still holds its slot.
                            match r.bytes().await {
                                Ok(_) if status.is_success() => true,
                                Ok(_) => {
                                    progress.fail(format!("HTTP {status}"));
                                    false
                                }
                                Err(e) => {
                                    progress.fail(format!("body: {e}"));
                                    false
                                }
                            }
                        }
                        Err(e) => {
                            progress.fail(error_chain(&e));
                            false
                        }
                    };
                    if ok {
                        progress.ok.fetch_add(1, Ordering::Relaxed);
                    }
                    progress.done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let bar = (!args.json).then(|| tokio::spawn(show_progress(progress.clone(), args.requests)));
    for agent in agents {
        agent.await.expect("agent task panicked");
    }
    if let Some(bar) = bar {
        bar.abort();
        let _ = bar.await;
        let done = progress.done.load(Ordering::Relaxed);
        eprintln!("{done}/{}  {}", args.requests, status(&progress));
    }
    let wall_s = started.elapsed().as_secs_f64();
    let ok = progress.ok.load(Ordering::Relaxed);
    let (sent, responses_429, retries) = match throttle {
        Some(t) => {
            let s = t.stats();
            (s.sent, s.responses_429, s.retries)
        }
        None => {
            let seen = progress.final_429.load(Ordering::Relaxed) as u64;
            (args.requests as u64, seen, 0)
        }
    };
    let first_failure = progress
        .first_failure
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    Summary {
        client: client_name,
        requests: args.requests,
        sent,
        ok,
        failures: args.requests - ok,
        responses_429,
        retries,
        wall_s,
        first_failure,
        ..Summary::default()
    }
}

/// An error and its causes on one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        line.push_str(": ");
        line.push_str(&cause.to_string());
        source = cause.source();
    }
    line
}

/// The progress line: requests done, succeeded, and 429s that reached an agent.
fn status(p: &Progress) -> String {
    format!(
        "ok {}  final 429s {}",
        p.ok.load(Ordering::Relaxed),
        p.final_429.load(Ordering::Relaxed)
    )
}

/// Shows progress until aborted: a bar on a terminal, a line every 5 s in a pipe or a log.
async fn show_progress(p: Arc<Progress>, total: usize) {
    if !std::io::stderr().is_terminal() {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            let done = p.done.load(Ordering::Relaxed);
            eprintln!("{done}/{total}  {}", status(&p));
        }
    }
    let bar = indicatif::ProgressBar::new(total as u64).with_style(
        indicatif::ProgressStyle::with_template("[{bar:40}] {pos}/{len}  {msg}  {elapsed}")
            .expect("a valid template")
            .progress_chars("#>."),
    );
    // Finished in place when the task is aborted (the bar is dropped).
    let bar = BarGuard(bar);
    loop {
        bar.0.set_position(p.done.load(Ordering::Relaxed) as u64);
        bar.0.set_message(status(&p));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Leaves the bar drawn, complete, when dropped.
struct BarGuard(indicatif::ProgressBar);

impl Drop for BarGuard {
    fn drop(&mut self) {
        self.0.finish();
    }
}

/// The fastest the server allows: the window limit (the first `limit` at once, then `limit`
/// per window) or the parallel cap over the total busy time, whichever is slower.
fn theoretical_min(args: &Args, gateway: Option<&GatewayConfig>) -> f64 {
    let windows_to_wait = ((args.requests.max(1) - 1) / args.per_window.max(1) as usize) as f64;
    let Some(g) = gateway else {
        return windows_to_wait * args.window.as_secs_f64();
    };
    // Every fifth request streams (see `Target::url_for`).
    let streams = args.requests / 5;
    let last_streamed = args.requests % 5 == 0;
    g.least_time(args.requests - streams, streams, last_streamed)
        .as_secs_f64()
}

fn print(summary: &Summary, args: &Args, json: bool) {
    // A ratio means something only when every request succeeded and the minimum is not zero.
    let ratio = (summary.failures == 0 && summary.theoretical_min_s > 0.0)
        .then(|| summary.wall_s / summary.theoretical_min_s);
    let (peak, max_in_window) = summary.server.as_ref().map_or((None, None), |s| {
        (Some(s.peak_parallel), Some(s.max_in_window))
    });
    if json {
        let line = serde_json::json!({
            "client": summary.client,
            "requests": summary.requests,
            "sent": summary.sent,
            "ok": summary.ok,
            "failures": summary.failures,
            "responses_429": summary.responses_429,
            "retries": summary.retries,
            "wall_s": summary.wall_s,
            "theoretical_min_s": summary.theoretical_min_s,
            "ratio": ratio,
            "server_peak_parallel": peak,
            "server_max_in_window": max_in_window,
            "limit_per_window": args.per_window,
            "window_s": args.window.as_secs_f64(),
            "limit_parallel": args.parallel,
            "first_failure": summary.first_failure,
        });
        println!("{line}");
        return;
    }
    let or_na = |v: Option<u32>| v.map_or("n/a".to_owned(), |v| v.to_string());
    println!("client                 {}", summary.client);
    println!("requests               {}", summary.requests);
    println!("sent (with retries)    {}", summary.sent);
    println!("succeeded              {}", summary.ok);
    println!("final failures         {}", summary.failures);
    if let Some(why) = &summary.first_failure {
        println!("  first failure        {why}");
    }
    println!(
        "responses 429          {} (received; retried ones included)",
        summary.responses_429
    );
    println!("retries                {}", summary.retries);
    println!("wall time              {:.2} s", summary.wall_s);
    let ratio = ratio.map_or("n/a".to_owned(), |r| format!("{r:.3}x"));
    println!(
        "theoretical minimum    {:.2} s (wall / minimum: {ratio})",
        summary.theoretical_min_s
    );
    println!(
        "server peak parallel   {} (limit {})",
        or_na(peak),
        args.parallel
    );
    println!(
        "server most in window  {} (limit {} per {:.0} s)",
        or_na(max_in_window),
        args.per_window,
        args.window.as_secs_f64()
    );
    println!();
}

#[tokio::main]
async fn main() {
    let mut args = match parse_args() {
        Ok(Command::Run(a)) => *a,
        Ok(Command::Help) => {
            println!("{HELP}");
            return;
        }
        Err(msg) => {
            eprintln!("swarm: {msg}");
            std::process::exit(2);
        }
    };
    if args.fleet.processes > 1 && args.fleet.child_gateway.is_none() {
        return fleet::run(&args).await;
    }
    let mut builder = Throttle::builder().max_in_flight(args.parallel);
    if !args.no_quota {
        builder = builder.sliding_window(args.per_window, args.window);
    }
    if let Some(url) = &args.fleet.redis {
        let namespace = args
            .fleet
            .namespace
            .clone()
            .unwrap_or_else(|| "swarm".into());
        match RedisStore::builder(url).namespace(namespace).build() {
            Ok(store) => builder = builder.store(store),
            Err(e) => {
                eprintln!("swarm: --redis {url:?}: {e}");
                std::process::exit(2);
            }
        }
    }
    let throttle = match builder.build() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("invalid settings: {e}");
            std::process::exit(2);
        }
    };
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.parallel.max(1))
        .build()
        .expect("a plain HTTP client builds");

    let (gateway, target) = match (&args.url, &args.fleet.child_gateway) {
        (_, Some(base)) => (None, Target::Gateway { base: base.clone() }),
        (Some(url), None) => (None, Target::Url(url.to_string())),
        (None, None) => {
            let gateway =
                Gateway::start(gateway_config(&args)).expect("the gateway binds to loopback");
            let base = gateway.url();
            (Some(gateway), Target::Gateway { base })
        }
    };
    // The gateway counts per user, by Authorization.
    if matches!(target, Target::Gateway { .. })
        && !args
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("authorization"))
    {
        args.headers
            .push(("Authorization".into(), "Bearer swarm-user".into()));
    }
    run_all(args, gateway, target, throttle, http).await;
}

/// The simulated gateway's settings for these arguments.
fn gateway_config(args: &Args) -> GatewayConfig {
    GatewayConfig::seed_limits()
        .with_requests_per_window(args.per_window)
        .with_window(args.window)
        .with_max_parallel(args.parallel as u32)
}

async fn run_all(
    args: Args,
    gateway: Option<Gateway>,
    target: Target,
    throttle: Throttle,
    http: reqwest::Client,
) {
    let min = theoretical_min(&args, gateway.as_ref().map(Gateway::config));
    let name = if args.no_quota {
        "throttle (max_in_flight only)"
    } else {
        "throttle"
    };
    let client = ClientBuilder::new(http.clone())
        .with(throttle.clone())
        .build();
    let mut summary = run_swarm(client, target.clone(), &args, name, Some(&throttle)).await;
    summary.theoretical_min_s = min;
    summary.server = gateway.as_ref().map(Gateway::stats);
    print(&summary, &args, args.json);

    if args.compare {
        if let Some(g) = &gateway {
            // Let the window empty so the plain client starts from the same state.
            tokio::time::sleep(g.config().window).await;
            g.reset_stats();
        }
        let plain = ClientBuilder::new(http).build();
        let mut summary = run_swarm(plain, target, &args, "plain reqwest-middleware", None).await;
        summary.theoretical_min_s = min;
        summary.server = gateway.as_ref().map(Gateway::stats);
        print(&summary, &args, args.json);
    }
}
