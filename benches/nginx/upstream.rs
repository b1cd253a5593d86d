//! The small upstream behind nginx (and the fast local server of the overhead bench).
//!
//! nginx cannot wait by itself, so the ~50 ms answers and the slow bodies come from this
//! server, which nginx proxies to (`proxy_pass`, `proxy_buffering off` for the stream). It is
//! shared by `tests/nginx.rs`, `examples/goodput.rs` and `benches/overhead.rs` through
//! `#[path]`, so it needs only the dev-dependencies.
//!
//! Routes (any method):
//! * `/slow`: waits [`SERVICE_TIME`], then answers 200 with a small JSON body;
//! * `/stream`: answers 200 at once and sends [`STREAM_CHUNKS`] chunks, one every
//!   [`STREAM_CHUNK_INTERVAL`]; the request counts as in progress until the last chunk;
//! * `/fast`: answers 200 with a small body at once.
//!
//! It counts requests in progress and their peak: what reached the upstream past nginx's limits.
#![allow(dead_code)]

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use axum::routing::any;
use axum::Router;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Where `benches/nginx/nginx.conf.template` sends its requests (start.sh's `UPSTREAM_PORT`).
pub const NGINX_UPSTREAM: &str = "127.0.0.1:18081";
/// Where `benches/nginx/start.sh` has nginx listen (`NGINX_PORT`).
pub const NGINX_URL: &str = "http://127.0.0.1:18080";
/// The limits `start.sh` configures by default: `limit_req rate=50r/s burst=20 nodelay`,
/// `limit_conn 10`.
pub const NGINX_RATE_PER_S: u32 = 50;
/// See [`NGINX_RATE_PER_S`].
pub const NGINX_BURST: u32 = 20;
/// See [`NGINX_RATE_PER_S`].
pub const NGINX_PARALLEL: u32 = 10;

/// A key nginx has not counted yet (its zones are keyed by `Authorization`): `label`, this
/// process and the time.
pub fn fresh_key(label: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("Bearer {label}-{}-{nanos}", std::process::id())
}

/// Whether nginx answers its health route within 2 s.
pub async fn nginx_is_up(http: &reqwest::Client) -> bool {
    let health = http
        .get(format!("{NGINX_URL}/health"))
        .timeout(Duration::from_secs(2))
        .send()
        .await;
    matches!(health, Ok(r) if r.status() == 200)
}

/// The wait of `/slow`.
pub const SERVICE_TIME: Duration = Duration::from_millis(50);
/// Chunks of a `/stream` body.
pub const STREAM_CHUNKS: u32 = 5;
/// The pause before each chunk of a `/stream` body.
pub const STREAM_CHUNK_INTERVAL: Duration = Duration::from_millis(20);

/// Counters of the upstream.
#[derive(Debug, Default)]
pub struct Counts {
    in_progress: AtomicU32,
    peak: AtomicU32,
    requests: AtomicU64,
}

impl Counts {
    /// Requests seen since the last reset.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// The most requests in progress at once since the last reset.
    pub fn peak(&self) -> u32 {
        self.peak.load(Ordering::Relaxed)
    }

    /// Requests in progress now.
    pub fn in_progress(&self) -> u32 {
        self.in_progress.load(Ordering::Relaxed)
    }

    /// Zeroes the request count and sets the peak to what is in progress now.
    pub fn reset(&self) {
        self.requests.store(0, Ordering::Relaxed);
        self.peak.store(self.in_progress(), Ordering::Relaxed);
    }

    fn enter(self: &Arc<Self>) -> InProgress {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let now = self.in_progress.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak.fetch_max(now, Ordering::Relaxed);
        InProgress(self.clone())
    }
}

/// One request in progress; counted until dropped.
struct InProgress(Arc<Counts>);

impl Drop for InProgress {
    fn drop(&mut self) {
        self.0.in_progress.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A running upstream; dropping it stops the server.
#[derive(Debug)]
pub struct Upstream {
    pub addr: SocketAddr,
    pub counts: Arc<Counts>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<io::Result<()>>,
}

impl Upstream {
    /// Serves on `addr` (port 0 for any free port) on the current tokio runtime.
    pub async fn start(addr: &str) -> io::Result<Upstream> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let counts = Arc::new(Counts::default());
        let app = Router::new()
            .route("/slow", any(slow))
            .route("/stream", any(stream))
            .route("/fast", any(fast))
            .with_state(counts.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
        });
        Ok(Upstream {
            addr,
            counts,
            stop: Some(stop),
            task,
        })
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops the server and waits for it.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn slow(State(counts): State<Arc<Counts>>) -> Response {
    let _in_progress = counts.enter();
    tokio::time::sleep(SERVICE_TIME).await;
    json_ok()
}

async fn fast() -> Response {
    json_ok()
}

fn json_ok() -> Response {
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from(r#"{"ok":true}"#))
        .expect("a static response builds")
}

async fn stream(State(counts): State<Arc<Counts>>) -> Response {
    let in_progress = counts.enter();
    let chunks = futures::stream::unfold(
        (0u32, Some(in_progress)),
        |(sent, mut in_progress)| async move {
            if sent == STREAM_CHUNKS {
                return None;
            }
            tokio::time::sleep(STREAM_CHUNK_INTERVAL).await;
            let chunk = format!("data: {{\"chunk\":{sent}}}\n\n");
            if sent + 1 == STREAM_CHUNKS {
                // The last chunk is produced: the request is over.
                in_progress.take();
            }
            Some((
                Ok::<_, Infallible>(chunk.into_bytes()),
                (sent + 1, in_progress),
            ))
        },
    );
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(chunks))
        .expect("a static response builds")
}
