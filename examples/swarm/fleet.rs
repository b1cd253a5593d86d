//! `--processes N`: the swarm as N OS processes against one gateway, started together; the
//! parent starts the gateway and the children (this program again, with `--child-*` flags),
//! then sums up what each child and the gateway saw.

use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest_throttle::testing::Gateway;

/// The fleet's settings from the command line.
#[derive(Debug, Clone, Default)]
pub struct Args {
    /// Processes to run (1: no fleet).
    pub processes: usize,
    /// Redis URL: the processes share one quota through it.
    pub redis: Option<String>,
    /// Each process gets 1/N of the limits (no Redis).
    pub static_split: bool,
    /// The first process's share of the requests, in percent.
    pub uneven: Option<u32>,
    /// Set in a child: the gateway's base URL.
    pub child_gateway: Option<String>,
    /// Set in a child: when to start, in milliseconds since the Unix epoch.
    pub start_ms: Option<u64>,
    /// Set in a child: the Redis namespace of this run.
    pub namespace: Option<String>,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// In a child: waits for the start the parent set, so that every process starts together.
pub async fn wait_for_start(args: &Args) {
    if let Some(at) = args.start_ms {
        tokio::time::sleep(Duration::from_millis(at.saturating_sub(unix_ms()))).await;
    }
}

/// Splits `total` among `n` processes: evenly, or `first` percent to the first and the
/// rest evenly among the others.
fn shares(total: usize, n: usize, first: Option<u32>) -> Vec<usize> {
    let even = |total: usize, n: usize| (0..n).map(move |i| total / n + usize::from(i < total % n));
    match first {
        Some(p) if n > 1 => {
            let head = total * p as usize / 100;
            std::iter::once(head)
                .chain(even(total - head, n - 1))
                .collect()
        }
        _ => even(total, n).collect(),
    }
}

/// Runs the fleet and prints its summary.
pub async fn run(args: &super::Args) {
    let f = &args.fleet;
    let n = f.processes;
    let gateway =
        Gateway::start(super::gateway_config(args)).expect("the gateway binds to loopback");
    let start_ms = unix_ms() + 500;
    let namespace = format!("swarm-{}-{start_ms}", std::process::id());
    let requests = shares(args.requests, n, f.uneven);
    let agents = shares(args.agents.max(n), n, f.uneven);
    let exe = std::env::current_exe().expect("the example knows its own path");
    let mut children = Vec::new();
    for i in 0..n {
        let (rpm, parallel) = if f.static_split {
            (
                (args.per_window as usize / n).max(1),
                (args.parallel / n).max(1),
            )
        } else {
            (args.per_window as usize, args.parallel)
        };
        let mut cmd = tokio::process::Command::new(&exe);
        cmd.args(["--json", "--child-gateway", &gateway.url()])
            .args(["--child-start-ms", &start_ms.to_string()])
            .args(["--child-namespace", &namespace])
            .args(["--processes", &n.to_string()])
            .args(["-n", &requests[i].max(1).to_string()])
            .args(["--agents", &agents[i].max(1).to_string()])
            .args(["--rpm", &rpm.to_string()])
            .args(["--parallel", &parallel.to_string()])
            .args(["--window-secs", &args.window.as_secs().max(1).to_string()])
            .stdout(Stdio::piped());
        if args.no_quota {
            cmd.arg("--no-quota");
        }
        if let Some(url) = &f.redis {
            cmd.args(["--redis", url]);
        }
        children.push(cmd.spawn().expect("a child process starts"));
    }
    let mut lines = Vec::new();
    for child in children {
        let out = child
            .wait_with_output()
            .await
            .expect("a child process runs");
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().last().unwrap_or("{}").to_owned();
        lines.push(serde_json::from_str::<serde_json::Value>(&line).unwrap_or_default());
    }
    summarize(args, &lines, &gateway);
}

fn summarize(args: &super::Args, children: &[serde_json::Value], gateway: &Gateway) {
    let f = &args.fleet;
    let sum = |key: &str| {
        children
            .iter()
            .map(|c| c[key].as_u64().unwrap_or(0))
            .sum::<u64>()
    };
    let walls: Vec<f64> = children
        .iter()
        .map(|c| c["wall_s"].as_f64().unwrap_or(f64::NAN))
        .collect();
    let wall = walls.iter().copied().fold(0.0, f64::max);
    let fastest = walls.iter().copied().fold(f64::INFINITY, f64::min);
    let min = super::theoretical_min(args, Some(gateway.config()));
    let server = gateway.stats();
    let ok = sum("ok");
    let failures = args.requests as u64 - ok.min(args.requests as u64);
    let mode = match (&f.redis, f.static_split) {
        (Some(_), _) => "redis (one shared quota)",
        (None, true) => "static split (1/N of the limits each)",
        (None, false) => "full limits each",
    };
    let json = serde_json::json!({
        "client": format!("throttle x {} processes, {mode}", f.processes),
        "processes": children,
        "requests": args.requests,
        "ok": ok,
        "failures": failures,
        "responses_429": sum("responses_429"),
        "server_refused_429": server.refused_parallel + server.refused_window,
        "sent": sum("sent"),
        "wall_s": wall,
        "slowest_over_fastest": wall / fastest,
        "theoretical_min_s": min,
        "ratio": (failures == 0).then(|| wall / min),
        "server_peak_parallel": server.peak_parallel,
        "server_max_in_window": server.max_in_window,
        "limit_per_window": args.per_window,
        "window_s": args.window.as_secs_f64(),
        "limit_parallel": args.parallel,
    });
    if args.json {
        println!("{json}");
        return;
    }
    println!("fleet                  {} processes, {mode}", f.processes);
    println!("process  requests  ok    429s  sent  wall (s)");
    for (i, c) in children.iter().enumerate() {
        println!(
            "{i:>7}  {:>8}  {:>4}  {:>4}  {:>4}  {:>8.2}",
            c["requests"], c["ok"], c["responses_429"], c["sent"], walls[i]
        );
    }
    println!("succeeded              {ok} of {}", args.requests);
    println!("final failures         {failures}");
    println!(
        "responses 429          {} (received by the processes)",
        sum("responses_429")
    );
    println!(
        "wall time              {wall:.2} s (slowest / fastest process: {:.3})",
        wall / fastest
    );
    println!(
        "theoretical minimum    {min:.2} s (wall / minimum: {:.3}x)",
        wall / min
    );
    println!(
        "server peak parallel   {} (limit {})",
        server.peak_parallel, args.parallel
    );
    println!(
        "server most in window  {} (limit {} per {:.0} s)",
        server.max_in_window,
        args.per_window,
        args.window.as_secs_f64()
    );
}
