//! A `redis-server` of a test binary's own, on a free port, without persistence.
//!
//! Started once per test binary (each test makes its stores on it under fresh scope ids); a
//! watchdog shell stops it when the test binary exits. Without `redis-server` on the PATH, a
//! test skips (returns early), unless `REQWEST_THROTTLE_REQUIRE_REDIS` is set (as `.ci/run`
//! does): then it fails.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// A running `redis-server`.
#[derive(Debug)]
pub struct RedisServer {
    pub port: u16,
    /// The watchdog shell.
    child: Mutex<Child>,
    /// The `redis-server` process.
    server_pid: u32,
}

impl RedisServer {
    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Sends `signal` (`"STOP"`, `"CONT"`) to the server.
    pub fn signal(&self, signal: &str) {
        assert!(self.send(signal), "kill -{signal} failed");
    }

    fn send(&self, signal: &str) -> bool {
        Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.server_pid.to_string())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Runs a `redis-cli` command against the server; its output.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli runs");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Starts a fresh server of its own (not the shared one), or `None` as for [`shared`].
    pub fn start() -> Option<RedisServer> {
        Self::start_on(free_port())
    }

    /// Starts a server on `port` (say, again after stopping one there).
    pub fn start_on(port: u16) -> Option<RedisServer> {
        if !installed() {
            return None;
        }
        Self::launch(port, "")
    }

    /// Starts a server on `port` with `extra` settings.
    fn launch(port: u16, extra: &str) -> Option<RedisServer> {
        let script = format!(
            "redis-server --port {port} --bind 127.0.0.1 --save '' --appendonly no \
             --loglevel warning {extra} & pid=$!; \
             while kill -0 {parent} 2>/dev/null && kill -0 $pid 2>/dev/null; do sleep 0.5; done; \
             kill $pid 2>/dev/null; wait $pid",
            parent = std::process::id()
        );
        let child = Command::new("sh")
            .args(["-c", &script])
            .stdout(Stdio::null())
            .spawn()
            .expect("sh starts");
        let mut server = RedisServer {
            port,
            child: Mutex::new(child),
            server_pid: 0,
        };
        server.wait_ready();
        server.server_pid = server.read_server_pid();
        Some(server)
    }

    fn wait_ready(&self) {
        for _ in 0..200 {
            if self.cli(&["PING"]) == "PONG" {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("redis-server on port {} did not answer PING", self.port);
    }

    fn read_server_pid(&self) -> u32 {
        self.cli(&["INFO", "server"])
            .lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|p| p.trim().parse().ok())
            .expect("INFO server names process_id")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.send("CONT");
        let _ = self.cli(&["SHUTDOWN", "NOSAVE"]);
        let _ = self.child.lock().unwrap().wait();
    }
}

fn installed() -> bool {
    let found = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var_os("REQWEST_THROTTLE_REQUIRE_REDIS").is_none(),
            "redis-server is not installed and REQWEST_THROTTLE_REQUIRE_REDIS is set"
        );
        eprintln!("skipped: redis-server is not installed (apt-get install redis-server)");
    }
    found
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A store on `server` whose answers are exact on paused tokio time: the tokio clock instead
/// of Redis's `TIME`, no jitter, no timer of its own.
pub fn exact_store(server: &RedisServer) -> reqwest_throttle::store::RedisStore {
    reqwest_throttle::store::RedisStore::builder(server.url())
        .local_clock_for_tests()
        .jitter(Duration::ZERO)
        .build()
        .expect("a valid URL")
}

/// The test binary's shared server, started on first use; `None` (skip) without
/// `redis-server`.
pub fn shared() -> Option<&'static RedisServer> {
    static SERVER: OnceLock<Option<RedisServer>> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start).as_ref()
}

/// A Redis Cluster of three primaries (no replicas), each a [`RedisServer`] started with
/// cluster mode on; `None` (skip) as for [`shared`].
#[derive(Debug)]
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
    _dir: TempDir,
}

/// A directory removed on drop (the cluster's node files).
#[derive(Debug)]
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl RedisCluster {
    /// Starts three nodes and joins them into one cluster covering every hash slot.
    pub fn start() -> Option<RedisCluster> {
        if !installed() {
            return None;
        }
        let dir = std::env::temp_dir().join(format!("reqwest-throttle-cluster-{}", free_port()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let extra = format!(
            "--cluster-enabled yes --cluster-node-timeout 2000 --dir {}",
            dir.display()
        );
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                let port = free_port();
                let extra = format!("{extra} --cluster-config-file nodes-{port}.conf");
                RedisServer::launch(port, &extra).expect("checked: installed")
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli runs");
        assert!(
            out.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        for _ in 0..200 {
            if nodes
                .iter()
                .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
            {
                return Some(RedisCluster {
                    nodes,
                    _dir: TempDir(dir),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the cluster never reached cluster_state:ok");
    }

    /// The nodes' URLs.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}
