//! A simulated rate-limited LLM gateway on loopback, for tests (feature `test-util`).
//!
//! [`Gateway::start`] runs a real HTTP/1.1 server on `127.0.0.1` that enforces per-user
//! limits like the reference gateway: at most [`GatewayConfig::max_parallel`] requests in
//! progress and at most [`GatewayConfig::requests_per_window`] admitted requests in any
//! span of [`GatewayConfig::window`] (a sliding window). A user is the value of the
//! `Authorization` header; requests without one all belong to one anonymous user.
//!
//! # Routes
//!
//! * `GET|POST /v1/chat`: waits [`GatewayConfig::service_time`], then answers 200 with a
//!   small JSON body that reports the tokens used:
//!   `{"object":"chat.completion","choices":[...],"usage":{"prompt_tokens":0,"completion_tokens":N,"total_tokens":N}}`.
//!   The parallel slot is given back before the answer is sent.
//! * `GET|POST /v1/stream`: answers 200 at once with a `text/event-stream` body of
//!   [`GatewayConfig::stream_chunks`] events, each after a pause of
//!   [`GatewayConfig::stream_chunk_interval`]. The request holds its parallel slot until
//!   the last event is produced (or until the client goes away).
//! * `GET /stats`: [`GatewayStats`] as JSON (not rate limited, not counted).
//!
//! # Admission
//!
//! The parallel cap is checked first, then the request window, then (with
//! [`GatewayConfig::tokens_per_window`]) the token window, so a request over several is
//! refused for the first. An admitted request counts in the windows and takes a parallel
//! slot; a refused request counts in none. A refused request gets
//! `429 Too Many Requests` at once, with a JSON body
//! `{"error":{"type":"rate_limit_error","message":"..."}}` and the headers:
//!
//! * `retry-after`: the window length in whole seconds, rounded up (an upper bound);
//! * `rate_limit_type`: `parallel_requests`, `requests_per_minute` or `tokens_per_minute`;
//! * `reset_at`: an RFC 3339 UTC time to the millisecond, rounded up. For the window
//!   limit it is when the oldest admitted request in the window leaves it (so a request
//!   sent then is admitted); for the parallel limit it is now plus the window length
//!   (an upper bound: a slot usually frees sooner); for the token limit it is when enough
//!   of the oldest tokens leave the window for the request's tokens to fit.
//!
//! # Tokens
//!
//! A request asks for the tokens in its [`TOKEN_COST_HEADER`] header (`x-token-cost`, a
//! count), else for its JSON body's `max_tokens`, else for none. Like an API that counts
//! output tokens by `max_tokens` first and by the true figure later, the gateway counts the
//! requested tokens in the token window at admission and, once it answers, replaces them
//! (at the request's arrival) with the tokens used: the requested tokens times
//! [`GatewayConfig::usage_fraction`], rounded up, reported in the body's `usage` (a streamed
//! answer counts them when it starts). Tokens are counted whether or not a token limit is
//! set ([`GatewayStats::tokens_used`]).
//!
//! With [`GatewayConfig::rate_limit_headers`] every answer (200 and 429) carries the user's
//! allowances after it: requests and, with a token limit, tokens, in the
//! [`HeaderStyle::Anthropic`] or [`HeaderStyle::OpenAi`] family (limit, remaining, and the
//! time until the window is whole again).
//!
//! # Time
//!
//! The gateway measures time with [`tokio::time::Instant`] and waits with
//! [`tokio::time::sleep`], so it follows a paused tokio clock
//! (`#[tokio::test(start_paused = true)]`). Only `reset_at` uses the wall clock: it is
//! the system time now plus the (tokio) time until the reset.
//!
//! ```no_run
//! use reqwest_throttle::testing::{Gateway, GatewayConfig};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let gateway = Gateway::start(GatewayConfig::seed_limits_scaled(10.0))?;
//!     let url = format!("{}/v1/chat", gateway.url());
//!     let response = reqwest::get(&url).await?;
//!     assert_eq!(response.status(), 200);
//!     assert_eq!(gateway.stats().responses_429, 0);
//!     gateway.shutdown().await?;
//!     Ok(())
//! }
//! ```

mod config;
mod limits;
mod server;

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use axum::serve::ListenerExt;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use config::{GatewayConfig, HeaderStyle};

/// The request header that gives a request's tokens (a count); without it, the JSON body's
/// `max_tokens` does.
pub const TOKEN_COST_HEADER: &str = "x-token-cost";
pub use limits::GatewayStats;

use server::Shared;

/// A running simulated gateway on `127.0.0.1`; see the [module docs](self).
///
/// Dropping the handle signals the server to stop: it stops accepting connections at
/// once and finishes the requests in progress in the background. [`Gateway::shutdown`]
/// does the same and waits until every connection is closed.
pub struct Gateway {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<io::Result<()>>>,
}

impl Gateway {
    /// Binds `127.0.0.1` on a free port and serves the gateway on the current tokio
    /// runtime (as a spawned task, so the runtime must keep running for it to answer).
    ///
    /// # Errors
    ///
    /// If called outside a tokio runtime, or if the socket cannot be bound.
    pub fn start(config: GatewayConfig) -> io::Result<Gateway> {
        let runtime = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let listener = {
            let _entered = runtime.enter();
            tokio::net::TcpListener::from_std(listener)?
        };
        let listener = listener.tap_io(|tcp| {
            // Small streamed events should leave at once, not wait for Nagle.
            let _ = tcp.set_nodelay(true);
        });

        let shared = Arc::new(Shared::new(config));
        let (stop, stopped) = oneshot::channel::<()>();
        let app = server::router(Arc::clone(&shared));
        let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
            // Either a message or the sender being dropped means stop.
            let _ = stopped.await;
        });
        let task = runtime.spawn(async move { serve.await });
        Ok(Gateway {
            addr,
            shared,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// The base URL, `http://127.0.0.1:PORT` (no trailing slash).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The socket address the gateway listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The settings the gateway was started with.
    pub fn config(&self) -> &GatewayConfig {
        &self.shared.config
    }

    /// A snapshot of the counters, read in-process (the same value `GET /stats` returns).
    pub fn stats(&self) -> GatewayStats {
        self.shared.stats()
    }

    /// Sets every counter to zero. The limits' state (requests in progress, the window
    /// log of each user) is kept, so the rules still apply across the reset.
    pub fn reset_stats(&self) {
        self.shared.reset_stats();
    }

    /// Stops the gateway gracefully and waits until it has stopped: no new connections
    /// are accepted, idle connections are closed, and requests in progress (streams
    /// included) run to completion first.
    ///
    /// # Errors
    ///
    /// If the server task failed or panicked.
    ///
    /// # Cancel safety
    /// Dropping the future leaves the server shutting down in the background: the stop signal
    /// has been sent, only the wait for open connections is abandoned.
    pub async fn shutdown(mut self) -> io::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.task.take() {
            Some(task) => task.await.map_err(io::Error::other)?,
            None => Ok(()),
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl fmt::Debug for Gateway {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gateway")
            .field("addr", &self.addr)
            .field("config", &self.shared.config)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}
