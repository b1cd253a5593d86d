//! The connection to Redis: one server (a `ConnectionManager`, which reconnects with backoff)
//! or, with the feature `redis-cluster`, a Redis Cluster (redis-rs's cluster client, which
//! routes each script by its keys' hash slot and loads scripts on every primary).

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

/// Where the store's Redis is.
#[derive(Debug, Clone)]
pub(super) enum Target {
    /// One server (or a primary).
    Single(redis::Client),
    /// A Redis Cluster, by some of its nodes.
    #[cfg(feature = "redis-cluster")]
    Cluster(Box<redis::cluster::ClusterClient>),
}

/// A connection, cheap to clone (each clone multiplexes on the same socket(s)).
#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    #[cfg(feature = "redis-cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Conn::Single(_) => "Conn::Single",
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(_) => "Conn::Cluster",
        })
    }
}

impl Target {
    /// Connects (a single server lazily: the first command connects).
    pub(super) async fn connect(&self, timeout: Option<Duration>) -> RedisResult<Conn> {
        match self {
            Target::Single(client) => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(timeout)
                    .set_response_timeout(None)
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_secs(1));
                ConnectionManager::new_lazy_with_config(client.clone(), config).map(Conn::Single)
            }
            #[cfg(feature = "redis-cluster")]
            Target::Cluster(client) => client.get_async_connection().await.map(Conn::Cluster),
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => c.get_db(),
        }
    }
}
