//! A misbehaving HTTP/1.1 server on loopback: it reads each request itself and answers with
//! whatever raw bytes a test scripts (cut bodies, resets, slow chunks, garbage headers), on the
//! test's own runtime, so paused tokio time covers it too. Shared by several test crates, each
//! using part of it.

#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One request as the server read it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    /// Header lines as `(lower-case name, value)`.
    pub headers: Vec<(String, String)>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One thing the server does while answering.
#[derive(Debug, Clone)]
pub enum Step {
    /// Writes these bytes.
    Write(Vec<u8>),
    /// Waits (tokio time, so it is instant under paused time once everything else is idle).
    Sleep(Duration),
    /// Closes the connection (FIN).
    Close,
    /// Resets the connection (RST: zero linger, then close).
    Reset,
    /// Never writes again and keeps the connection open.
    Hang,
}

/// The script for one request: `answer(index of the request, request)`.
type Script = dyn Fn(usize, &Seen) -> Vec<Step> + Send + Sync;

/// A scripted server on `127.0.0.1:0`.
#[derive(Clone)]
pub struct RawServer {
    pub addr: std::net::SocketAddr,
    accepts: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl RawServer {
    /// Starts the server on the current runtime. Each connection serves requests until a
    /// script closes, resets or hangs it (every scripted answer should say `Connection: close`
    /// and end with [`Step::Close`], unless it is testing something else).
    pub async fn start(
        answer: impl Fn(usize, &Seen) -> Vec<Step> + Send + Sync + 'static,
    ) -> RawServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = RawServer {
            addr: listener.local_addr().unwrap(),
            accepts: Arc::default(),
            seen: Arc::default(),
        };
        let answer: Arc<Script> = Arc::new(answer);
        let (accepts, seen) = (server.accepts.clone(), server.seen.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                accepts.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(stream, answer.clone(), seen.clone()));
            }
        });
        server
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Connections accepted so far.
    pub fn accepts(&self) -> usize {
        self.accepts.load(Ordering::SeqCst)
    }

    /// Requests read so far.
    pub fn requests(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn serve(mut stream: TcpStream, answer: Arc<Script>, seen: Arc<Mutex<Vec<Seen>>>) {
    let mut buf = Vec::new();
    loop {
        let Some(request) = read_request(&mut stream, &mut buf).await else {
            return;
        };
        let index = {
            let mut seen = seen.lock().unwrap();
            seen.push(request.clone());
            seen.len() - 1
        };
        for step in answer(index, &request) {
            match step {
                Step::Write(bytes) => {
                    if stream.write_all(&bytes).await.is_err() {
                        return;
                    }
                    let _ = stream.flush().await;
                }
                Step::Sleep(d) => tokio::time::sleep(d).await,
                Step::Close => {
                    let _ = stream.shutdown().await;
                    return;
                }
                Step::Reset => {
                    let _ = stream.set_zero_linger();
                    return;
                }
                Step::Hang => {
                    std::future::pending::<()>().await;
                }
            }
        }
    }
}

/// Reads one request head and its `Content-Length` body; `None` at end of stream.
async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Seen> {
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut start = lines.next()?.split(' ');
    let method = start.next()?.to_owned();
    let path = start.next()?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    buf.drain(..head_end + length);
    Some(Seen {
        method,
        path,
        headers,
    })
}

/// A complete response: status line, the given header lines (raw bytes, so anything goes),
/// `Content-Length`, `Connection: close`, the body, then close.
pub fn answer(status: &str, headers: &[(&str, &[u8])], body: &[u8]) -> Vec<Step> {
    vec![
        Step::Write(head(
            status,
            headers,
            &[("content-length", body.len().to_string().as_bytes())],
        )),
        Step::Write(body.to_vec()),
        Step::Close,
    ]
}

/// A response head (with `Connection: close`) ending in the blank line.
pub fn head(status: &str, headers: &[(&str, &[u8])], more: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {status}\r\nconnection: close\r\n").into_bytes();
    for (name, value) in headers.iter().chain(more) {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// One chunk of a chunked body.
pub fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

/// The last chunk of a chunked body.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";
