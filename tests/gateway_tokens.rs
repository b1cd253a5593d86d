//! The simulated gateway's tokens-per-minute limit over real loopback HTTP, on a paused tokio
//! clock, alone and with a throttle that settles each request's true usage.

use std::time::Duration;

use reqwest::{Client, Response, StatusCode};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_throttle::testing::{Gateway, GatewayConfig, HeaderStyle, TOKEN_COST_HEADER};
use reqwest_throttle::{Charge, Cost, Throttle};
use tokio::time::Instant;

const WINDOW: Duration = Duration::from_secs(6);

fn http() -> Client {
    Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

fn config(tokens: u32, fraction: f64, style: HeaderStyle) -> GatewayConfig {
    GatewayConfig::default()
        .with_window(WINDOW)
        .with_tokens_per_window(tokens)
        .with_usage_fraction(fraction)
        .with_rate_limit_headers(style)
}

fn header(r: &Response, name: &str) -> String {
    r.headers()
        .get(name)
        .unwrap_or_else(|| panic!("no {name}"))
        .to_str()
        .unwrap()
        .to_owned()
}

async fn used_tokens(r: Response) -> u64 {
    let body: serde_json::Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    body["usage"]["total_tokens"]
        .as_u64()
        .expect("usage.total_tokens")
}

#[tokio::test(start_paused = true)]
async fn max_tokens_are_counted_and_refused_past_the_limit_with_headers_on_every_answer() {
    let gw = Gateway::start(config(1_000, 0.5, HeaderStyle::OpenAi)).unwrap();
    let url = format!("{}/v1/chat", gw.url());
    let client = http();
    let r = client
        .post(&url)
        .body(r#"{"max_tokens": 600}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "x-ratelimit-limit-tokens"), "1000");
    // Counted as used (300) once answered.
    assert_eq!(header(&r, "x-ratelimit-remaining-tokens"), "700");
    assert_eq!(header(&r, "x-ratelimit-remaining-requests"), "119");
    assert_eq!(used_tokens(r).await, 300);
    // 300 + 800 > 1000: refused as a token limit, with the headers too.
    let r = client
        .post(&url)
        .body(r#"{"max_tokens": 800}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "rate_limit_type"), "tokens_per_minute");
    assert_eq!(header(&r, "x-ratelimit-remaining-tokens"), "700");
    // The header beats the body: 700 fit exactly.
    let r = client
        .post(&url)
        .header(TOKEN_COST_HEADER, "700")
        .body(r#"{"max_tokens": 800}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(used_tokens(r).await, 350);
    let stats = gw.stats();
    assert_eq!(
        (stats.admitted, stats.refused_tokens, stats.responses_429),
        (2, 1, 1)
    );
    assert_eq!(stats.tokens_used, 650);
    assert_eq!(stats.max_tokens_in_window, 1_000);
}

#[tokio::test(start_paused = true)]
async fn anthropic_headers_report_tokens_remaining() {
    let gw = Gateway::start(config(5_000, 1.0, HeaderStyle::Anthropic)).unwrap();
    let r = http()
        .post(format!("{}/v1/stream", gw.url()))
        .header(TOKEN_COST_HEADER, "1200")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "anthropic-ratelimit-tokens-limit"), "5000");
    assert_eq!(header(&r, "anthropic-ratelimit-tokens-remaining"), "3800");
    let reset: jiff::Timestamp = header(&r, "anthropic-ratelimit-tokens-reset")
        .parse()
        .unwrap();
    assert!(reset > jiff::Timestamp::now(), "{reset}");
    r.bytes().await.unwrap();
    assert_eq!(gw.stats().tokens_used, 1_200);
}

/// `n` requests of `max_tokens` each, one after another, each settled with its usage when
/// `settle` is set; the offsets from `t0` at which each was answered.
async fn run(client: &ClientWithMiddleware, url: &str, n: usize, settle: bool) -> Vec<Duration> {
    let t0 = Instant::now();
    let mut answered = Vec::new();
    for _ in 0..n {
        let r = client
            .post(url)
            .with_extension(Cost(400))
            .body(r#"{"max_tokens": 400}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let charge = r.extensions().get::<Charge>().cloned().unwrap();
        let used = used_tokens(r).await;
        if settle {
            charge.settle(u32::try_from(used).unwrap()).await.unwrap();
        }
        answered.push(Instant::now() - t0);
    }
    answered
}

fn throttled(throttle: &Throttle) -> ClientWithMiddleware {
    ClientBuilder::new(http()).with(throttle.clone()).build()
}

#[tokio::test(start_paused = true)]
async fn settling_the_true_usage_keeps_pace_with_the_gateway_and_never_draws_a_429() {
    // The gateway counts 400 at admission and 100 once answered; so does the throttle.
    let gw = Gateway::start(config(1_000, 0.25, HeaderStyle::OpenAi)).unwrap();
    let url = format!("{}/v1/chat", gw.url());
    let throttle = Throttle::builder()
        .token_window(1_000, WINDOW)
        .build()
        .unwrap();
    let answered = run(&throttled(&throttle), &url, 8, true).await;
    // 100 × 6 + 400 fit: the first 7 go at once, one after another; the 8th waits for the
    // first to leave the window.
    let service = gw.config().service_time;
    assert!(answered[6] < service * 8, "{answered:?}");
    assert!(answered[7] > WINDOW, "{answered:?}");
    let stats = gw.stats();
    assert_eq!(stats.responses_429, 0);
    assert!(stats.max_tokens_in_window <= 1_000, "{stats:?}");
}

#[tokio::test(start_paused = true)]
async fn without_settling_the_estimate_paces_slower_than_the_gateway_needs() {
    let gw = Gateway::start(config(1_000, 0.25, HeaderStyle::Anthropic)).unwrap();
    let url = format!("{}/v1/chat", gw.url());
    let throttle = Throttle::builder()
        .token_window(1_000, WINDOW)
        .build()
        .unwrap();
    let answered = run(&throttled(&throttle), &url, 3, false).await;
    // 400 + 400 fit, a third waits a whole window although the gateway counts only 200.
    assert!(answered[2] > WINDOW, "{answered:?}");
    assert_eq!(gw.stats().responses_429, 0);
}

#[tokio::test(start_paused = true)]
async fn the_gateways_token_report_counts_what_another_client_used() {
    // Another client of the same user (another process) uses 500 tokens; the throttle does
    // not see it, but the tokens remaining on its first answer bring its count up to the
    // gateway's.
    let gw = Gateway::start(config(1_000, 1.0, HeaderStyle::OpenAi)).unwrap();
    let url = format!("{}/v1/chat", gw.url());
    let other = http()
        .post(&url)
        .header(TOKEN_COST_HEADER, "500")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::OK);
    let throttle = Throttle::builder()
        .token_window(1_000, WINDOW)
        .build()
        .unwrap();
    let answered = run(&throttled(&throttle), &url, 2, false).await;
    // 900 counted by the gateway, 100 remaining: the second request waits for the other
    // client's tokens to leave the window, where without the report it would have gone at
    // once and drawn a 429.
    assert!(answered[1] > WINDOW, "{answered:?}");
    assert_eq!(gw.stats().responses_429, 0);
    assert_eq!(gw.stats().admitted, 3);
}

#[tokio::test(start_paused = true)]
async fn a_body_hook_settles_the_gateways_usage_as_the_caller_reads_it() {
    let gw = Gateway::start(config(1_000, 0.25, HeaderStyle::OpenAi)).unwrap();
    let url = format!("{}/v1/chat", gw.url());
    let throttle = Throttle::builder()
        .token_window(1_000, WINDOW)
        .settle_from_body(4096, |body| {
            let json: serde_json::Value = serde_json::from_slice(body).ok()?;
            u32::try_from(json["usage"]["total_tokens"].as_u64()?).ok()
        })
        .build()
        .unwrap();
    // The caller reads each body (for its usage) but settles nothing itself.
    let answered = run(&throttled(&throttle), &url, 8, false).await;
    let service = gw.config().service_time;
    assert!(answered[6] < service * 8, "{answered:?}");
    assert!(answered[7] > WINDOW, "{answered:?}");
    assert_eq!(gw.stats().responses_429, 0);
}
