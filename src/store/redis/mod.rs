//! [`RedisStore`] (feature `redis`): one quota for a fleet, kept in Redis.

mod conn;
mod health;
mod script;
mod tasks;

use std::collections::{HashMap, VecDeque};
use std::hash::Hasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{Notify, OnceCell};
use tokio::time::Instant;

pub use health::OnUnavailable;

use super::memory::{MemoryScope, MemoryStore};
use super::{Admission, LeaseId, Limits, ScopeId, Settlement, Store, StoreError};
use crate::sync::lock;
use conn::{Conn, Target};
use health::Health;
use script::{Keys, Scripts};

/// The lease ids of leases granted by the local fallback, not by Redis.
const LOCAL: u64 = 1 << 63;
/// The lease id of a lease granted with nothing counted ([`OnUnavailable::FailOpen`]).
const UNCOUNTED: u64 = u64::MAX;

/// Builds a [`RedisStore`]; from [`RedisStore::builder`].
#[derive(Debug, Clone)]
pub struct RedisStoreBuilder {
    nodes: Vec<String>,
    cluster: bool,
    namespace: String,
    timeout: Option<Duration>,
    lease_ttl: Duration,
    poll: Duration,
    jitter: Duration,
    on_unavailable: OnUnavailable,
    seed: Option<u64>,
    local_clock: bool,
}

impl RedisStoreBuilder {
    /// The prefix of every key, and the seed of the scope ids: processes that share a quota
    /// use the same namespace.
    ///
    /// # Default
    /// `"reqwest-throttle"`.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// How long one call to Redis may take before [`OnUnavailable`] applies; `None`: no
    /// limit (a stalled Redis then stalls admission).
    ///
    /// # Default
    /// 250 ms.
    pub fn timeout(mut self, timeout: Option<Duration>) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long a lease outlives its process: renewed every third of this while held, a
    /// crashed process's leases are free again after at most this long.
    ///
    /// # Default
    /// 30 s.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// How often a waiter for an in-flight slot tries again when it has seen no release
    /// (releases in other processes are published; this covers a missed message).
    ///
    /// # Default
    /// 200 ms.
    pub fn in_flight_poll(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// The most random time added to a quota's "not before" answer, so that processes
    /// refused together do not come back together.
    ///
    /// # Default
    /// 2 ms.
    pub fn jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }

    /// What admission does while Redis is unreachable.
    ///
    /// # Default
    /// [`OnUnavailable::LocalLimits`].
    pub fn on_unavailable(mut self, policy: OnUnavailable) -> Self {
        self.on_unavailable = policy;
        self
    }

    /// Seeds the jitter's random numbers, for repeatable tests.
    ///
    /// # Default
    /// Seeded from the operating system.
    pub fn jitter_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Reads the time from this process's `tokio` clock instead of Redis's `TIME`, and sets
    /// no timer of its own (no timeout, no lease renewal), so that tests with paused time
    /// are exact. Never for a fleet: its processes' clocks differ.
    #[cfg(feature = "test-util")]
    pub fn local_clock_for_tests(mut self) -> Self {
        self.local_clock = true;
        self.timeout = None;
        self
    }

    /// The store. Connects lazily: the first admission connects, and until Redis answers,
    /// [`OnUnavailable`] applies.
    ///
    /// # Errors
    /// [`StoreError`] when the URL is not a Redis URL, the namespace holds `{` or `}`
    /// (they would break the keys' cluster hash tag), or the lease TTL is zero (a lease
    /// would expire as it is granted: no in-flight cap).
    pub fn build(self) -> Result<RedisStore, StoreError> {
        if self.lease_ttl.is_zero() {
            return Err(StoreError::new("Redis lease TTL of zero"));
        }
        if self.namespace.contains(['{', '}']) {
            return Err(StoreError::new(format!(
                "Redis namespace {:?} holds '{{' or '}}'",
                self.namespace
            )));
        }
        let bad =
            |e: redis::RedisError| StoreError::new(format!("Redis URL {:?}: {e}", self.nodes));
        // Releases are published to every node of a cluster: one node is enough to listen.
        let first = self.nodes.first().map_or("", String::as_str);
        let client = redis::Client::open(first).map_err(bad)?;
        let target = if self.cluster {
            Self::cluster_target(&self.nodes).map_err(bad)?
        } else {
            Target::Single(client.clone())
        };
        let seed = self.seed.unwrap_or_else(rand::random);
        let mut rng = SmallRng::seed_from_u64(seed);
        let lease_prefix = u64::from(rng.random::<u32>() >> 1) << 32;
        Ok(RedisStore {
            shared: Arc::new(Shared {
                channel: format!("{}:released", self.namespace),
                hash_key: hash_key(&self.namespace),
                client,
                target,
                conn: OnceCell::new(),
                tasks: OnceLock::new(),
                scripts: Scripts::new(),
                health: Health::default(),
                scopes: Mutex::default(),
                flush: Arc::default(),
                stop: Arc::default(),
                orphans: Mutex::default(),
                lease_prefix,
                next_lease: AtomicU64::new(0),
                commands: AtomicU64::new(0),
                rng: Mutex::new(rng),
                origin: Instant::now(),
                memory: MemoryStore,
                config: self,
            }),
        })
    }
}

/// A [`Store`] in Redis, shared by every process that uses the same Redis and namespace: a
/// fleet's requests, together, stay inside one quota. Redis 6.2 or later, or Valkey.
///
/// Each scope's state lives in a few keys that share one cluster hash slot (the `{…}` tag of
/// `<namespace>:{<scope id>}:…`), every key with an expiry:
///
/// | key | type | holds |
/// |---|---|---|
/// | `…:cooldown` | string | the instant (µs, Redis time) the shared cooldown opens |
/// | `…:leases` | sorted set | in-flight leases, scored by their expiry (µs) |
/// | `…:waiting` | sorted set | processes refused a lease in the last second, scored by the time (µs) |
/// | `…:window:<i>` | sorted set | the sliding window's log: one entry per send (its lease id), scored by its time (µs) |
/// | `…:window:<i>:units` | hash | each entry's units, and their sum (`total`), so an admission reads only the sends leaving |
/// | `…:bucket:<i>:<t>:<tau>` | string | the token bucket's theoretical arrival time (GCRA, µs) |
///
/// Every admission attempt is one Lua script (EVALSHA, reloaded after a restart flushed it),
/// so checking and charging are atomic across the fleet, and it reads the time from Redis
/// (`TIME`): one clock for every process, no client clock skew. The scope id is a 128-bit
/// SipHash of the scope's key under a key derived from the namespace, so every process names
/// a scope alike and an API key never reaches Redis.
///
/// Leases are renewed by one background task per store while held; a crashed process's
/// leases expire after the lease TTL (default 30 s). A release is sent at once by that task
/// (or with the next admission of the scope, whichever is first) and published, so waiters in
/// other processes try again at once; a bounded poll covers a missed message. Releases not
/// sent yet when the store's last handle is dropped are sent on a task of their own (on the
/// runtime of the drop, if any); an admission dropped before Redis answered releases its
/// lease with the next call.
///
/// While processes wait for an in-flight slot, one holding more than its share (the cap over
/// the processes asking) is refused the next free slot, so that a released slot does not
/// always go to the process that released it (which asks first); a process not waiting is
/// also refused a slot that would put it above the exact share (with one slot and two
/// processes, the one that released it yields it to the one waiting).
///
/// While Redis does not answer within the timeout (default 250 ms), admission follows
/// [`OnUnavailable`], and Redis is left alone for a pause that doubles per failure (100 ms up
/// to 5 s) before it is asked again. A script's error on one scope's keys (a key holding
/// something unexpected) gets the same answer for that call, without the pause: the other
/// scopes stay on Redis.
///
/// Cloning is cheap (an `Arc`). Give it to
/// [`ThrottleBuilder::store`](crate::ThrottleBuilder::store).
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use reqwest_throttle::{store::RedisStore, Throttle};
///
/// let store = RedisStore::builder("redis://127.0.0.1:6379").build()?;
/// let _throttle = Throttle::builder()
///     .sliding_window(120, Duration::from_secs(60))
///     .max_in_flight(20)
///     .store(store)
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RedisStore {
    shared: Arc<Shared>,
}

#[derive(Debug)]
pub(crate) struct Shared {
    config: RedisStoreBuilder,
    /// The server the subscriber listens on.
    client: redis::Client,
    target: Target,
    conn: OnceCell<Conn>,
    tasks: OnceLock<()>,
    scripts: Scripts,
    health: Health,
    /// The scopes alive in this process, by id (several per id when several throttles
    /// share the store): for renewals and published releases.
    scopes: Mutex<HashMap<ScopeId, Vec<Weak<ScopeState>>>>,
    /// Wakes the lease task: a release to send (or the store dropped).
    flush: Arc<Notify>,
    /// Stops the subscriber task (the store dropped).
    stop: Arc<Notify>,
    /// Releases of scopes dropped before they were sent: (leases key, scope id, ids).
    orphans: Mutex<Vec<(String, String, Vec<u64>)>>,
    channel: String,
    hash_key: [u64; 2],
    lease_prefix: u64,
    next_lease: AtomicU64,
    commands: AtomicU64,
    rng: Mutex<SmallRng>,
    origin: Instant,
    memory: MemoryStore,
}

/// One scope's handle in a [`RedisStore`].
#[derive(Debug)]
pub struct RedisScope {
    state: Arc<ScopeState>,
}

#[derive(Debug)]
pub(crate) struct ScopeState {
    id_hex: String,
    shared: Weak<Shared>,
    limits: Mutex<(Limits, Keys)>,
    /// Leases granted by Redis and not yet released.
    held: Mutex<Vec<u64>>,
    /// Leases released here and not yet acknowledged by Redis: sent again with each call
    /// until they are (a release is idempotent).
    released: Mutex<Vec<u64>>,
    /// The same limits, counted in this process alone: the fallback of
    /// [`OnUnavailable::LocalLimits`].
    local: MemoryScope,
    /// Until when this process knows the scope's state is not fresh (a send it counted, a
    /// cooldown it closed).
    busy_until: Mutex<Option<Instant>>,
    /// Notified when another process released a lease of this scope.
    released_elsewhere: Notify,
    /// Recent admissions that charged a quota, oldest first, for [`Store::settle`].
    charges: Mutex<VecDeque<Charge>>,
}

/// One admission's charge, until it is settled or no quota counts it any more.
#[derive(Debug, Clone, Copy)]
struct Charge {
    lease: u64,
    /// When Redis admitted it (µs, Redis time): the send's place in the windows.
    sent: i64,
    /// When this process saw it admitted.
    at: Instant,
    /// The estimate charged; `None` once settled with a true cost (settled for good).
    cost: Option<u32>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The background tasks hold no strong reference: wake them to see it is gone.
        self.flush.notify_one();
        self.stop.notify_one();
        tasks::send_last_releases(self);
    }
}

impl Drop for ScopeState {
    fn drop(&mut self) {
        let released = std::mem::take(&mut *lock(&self.released));
        if let (false, Some(shared)) = (released.is_empty(), self.shared.upgrade()) {
            let leases = lock(&self.limits).1.leases.clone();
            lock(&shared.orphans).push((leases, self.id_hex.clone(), released));
            shared.flush.notify_one();
        }
    }
}

impl RedisStore {
    /// A builder for a store on a Redis Cluster, given some of its nodes' URLs (feature
    /// `redis-cluster`). Every key of a scope shares one hash slot, so each admission is one
    /// script on one primary.
    #[cfg(feature = "redis-cluster")]
    pub fn cluster_builder<I, U>(nodes: I) -> RedisStoreBuilder
    where
        I: IntoIterator<Item = U>,
        U: Into<String>,
    {
        let mut builder = Self::builder("");
        builder.nodes = nodes.into_iter().map(Into::into).collect();
        builder.cluster = true;
        builder
    }

    /// A builder for a store on the Redis at `url` (`redis://host:port/db`,
    /// `rediss://…` needs a TLS feature of the `redis` crate).
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            nodes: vec![url.into()],
            cluster: false,
            namespace: "reqwest-throttle".into(),
            timeout: Some(Duration::from_millis(250)),
            lease_ttl: Duration::from_secs(30),
            poll: Duration::from_millis(200),
            jitter: Duration::from_millis(2),
            on_unavailable: OnUnavailable::default(),
            seed: None,
            local_clock: false,
        }
    }

    /// A store on the Redis at `url`, with the builder's defaults.
    ///
    /// # Errors
    /// As [`RedisStoreBuilder::build`].
    pub fn new(url: impl Into<String>) -> Result<Self, StoreError> {
        Self::builder(url).build()
    }

    /// Redis commands (scripts) sent so far, answered or not.
    pub fn commands(&self) -> u64 {
        self.shared.commands.load(Ordering::Relaxed)
    }

    /// Calls to Redis that failed or timed out so far.
    pub fn errors(&self) -> u64 {
        self.shared.health.errors()
    }
}

impl RedisStoreBuilder {
    #[cfg(feature = "redis-cluster")]
    fn cluster_target(nodes: &[String]) -> redis::RedisResult<Target> {
        redis::cluster::ClusterClient::new(nodes.iter().map(String::as_str))
            .map(|c| Target::Cluster(Box::new(c)))
    }

    #[cfg(not(feature = "redis-cluster"))]
    fn cluster_target(_: &[String]) -> redis::RedisResult<Target> {
        unreachable!("cluster_builder needs the feature redis-cluster")
    }
}

/// The key of the scope ids' SipHash: derived from the namespace alone, so every process of
/// a fleet names a scope alike.
fn hash_key(namespace: &str) -> [u64; 2] {
    let mut a = siphasher::sip::SipHasher13::new_with_keys(0, 1);
    a.write(namespace.as_bytes());
    let mut b = siphasher::sip::SipHasher13::new_with_keys(2, 3);
    b.write(namespace.as_bytes());
    [a.finish(), b.finish()]
}

impl Shared {
    /// The connection, made on first use (with the background tasks).
    async fn conn(self: &Arc<Self>) -> Result<Conn, String> {
        self.tasks.get_or_init(|| tasks::spawn(self));
        let conn = self
            .conn
            .get_or_try_init(|| self.target.connect(self.config.timeout))
            .await
            .map_err(|e| e.to_string())?;
        Ok(conn.clone())
    }

    /// "Now" for a script: empty (Redis's `TIME`), or this process's tokio clock in µs.
    fn now_arg(&self) -> String {
        if self.config.local_clock {
            // Far from zero, as Redis time would be.
            const BASE: u64 = 1_000_000_000_000_000;
            (BASE + script::micros(self.origin.elapsed())).to_string()
        } else {
            String::new()
        }
    }

    /// Runs `call` on Redis within the timeout, counting it; `Err` says what failed.
    async fn run<T: redis::FromRedisValue>(
        self: &Arc<Self>,
        call: redis::ScriptInvocation<'_>,
    ) -> Result<T, Failure> {
        self.commands.fetch_add(1, Ordering::Relaxed);
        let answer = async {
            let mut conn = self.conn().await.map_err(|e| {
                redis::RedisError::from((redis::ErrorKind::Io, "cannot connect", e))
            })?;
            call.invoke_async::<T>(&mut conn).await
        };
        let answer = match self.config.timeout {
            Some(t) => tokio::time::timeout(t, answer).await.unwrap_or_else(|_| {
                Err(redis::RedisError::from(std::io::Error::from(
                    std::io::ErrorKind::TimedOut,
                )))
            }),
            None => answer.await,
        };
        answer.map_err(|e| Failure {
            script: matches!(
                e.kind(),
                redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError)
            ) || e.code() == Some("WRONGTYPE"),
            message: e.to_string(),
        })
    }

    /// Counts `failure`; Redis is left alone for a pause unless only a script failed.
    fn failed(&self, failure: &Failure) {
        if failure.script {
            self.health.script_failed(&failure.message, Instant::now());
        } else {
            self.health.failed(&failure.message, Instant::now());
        }
    }

    fn lease_id(&self) -> u64 {
        self.lease_prefix | (self.next_lease.fetch_add(1, Ordering::Relaxed) & 0xffff_ffff)
    }

    fn jitter(&self) -> Duration {
        let max = self.config.jitter;
        if max.is_zero() {
            return max;
        }
        lock(&self.rng).random_range(Duration::ZERO..=max)
    }
}

impl ScopeState {
    fn mark_busy(&self, until: Instant) {
        let mut busy = lock(&self.busy_until);
        if busy.is_none_or(|b| b < until) {
            *busy = Some(until);
        }
    }

    /// Keeps an admission's charge for a settlement, when some quota counts its cost.
    fn remember(&self, limits: &Limits, lease: u64, sent: i64, cost: u32, now: Instant) {
        let counts =
            !limits.buckets.is_empty() || limits.windows.iter().any(|w| w.unit.counts_cost());
        if !counts {
            return;
        }
        let mut charges = lock(&self.charges);
        Self::forget(&mut charges, limits, now);
        charges.push_back(Charge {
            lease,
            sent,
            at: now,
            cost: Some(cost),
        });
    }

    /// Drops the charges no quota counts any more.
    fn forget(charges: &mut VecDeque<Charge>, limits: &Limits, now: Instant) {
        let memory = Self::busy_for(limits);
        while charges.front().is_some_and(|c| c.at + memory <= now) {
            charges.pop_front();
        }
    }

    /// The send time and estimate of `lease`'s charge, as a settlement with `actual` (or
    /// not) sees it: a charge settled with a true cost keeps its place, not its estimate.
    fn charge_of(&self, limits: &Limits, lease: u64, actual: bool) -> (Option<i64>, Option<u32>) {
        let mut charges = lock(&self.charges);
        Self::forget(&mut charges, limits, Instant::now());
        match charges.binary_search_by_key(&lease, |c| c.lease) {
            Ok(i) => {
                let c = &mut charges[i];
                let estimate = if actual { c.cost.take() } else { c.cost };
                (Some(c.sent), estimate)
            }
            Err(_) => (None, None),
        }
    }

    /// How long an admission keeps this scope from being fresh: its longest window, or the
    /// time its fullest bucket takes to refill.
    fn busy_for(limits: &Limits) -> Duration {
        let windows = limits
            .windows
            .iter()
            .map(|w| w.window.saturating_add(w.guard));
        let buckets = limits.buckets.iter().map(|q| q.burst_size_replenished_in());
        windows.chain(buckets).max().unwrap_or(Duration::ZERO)
    }
}

/// The lease of an admission script sent and not answered: released on drop.
struct Unanswered<'a> {
    st: &'a ScopeState,
    shared: &'a Shared,
    lease: Option<u64>,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if let Some(lease) = self.lease {
            lock(&self.st.released).push(lease);
            self.shared.flush.notify_one();
        }
    }
}

/// A call to Redis that failed.
#[derive(Debug)]
pub(super) struct Failure {
    message: String,
    /// Redis answered with an error of the script (`ERR` raised by it, `WRONGTYPE`): a key of
    /// one scope holds something unexpected; Redis itself answers.
    script: bool,
}

/// A Redis answer that is not one the scripts give.
fn unexpected(answer: &[i64]) -> Failure {
    Failure {
        message: format!("unexpected answer from the admission script: {answer:?}"),
        script: true,
    }
}

impl RedisStore {
    async fn admit_remote(&self, scope: &RedisScope, cost: u32) -> Result<Admission, Failure> {
        let shared = &self.shared;
        let st = &scope.state;
        let (limits, keys) = lock(&st.limits).clone();
        let released = lock(&st.released).clone();
        let lease = shared.lease_id();
        let now = Instant::now();
        let call = script::admit(
            &shared.scripts,
            &keys,
            &limits,
            &shared.now_arg(),
            cost,
            lease,
            shared.config.lease_ttl,
            &shared.channel,
            &st.id_hex,
            (shared.lease_prefix, lock(&st.held).len()),
            &released,
        );
        // Until Redis answers (an error, a timeout, or this future dropped by its caller),
        // the script may still run: its lease, if any, is released with the next call, so
        // that it does not hold a slot until it expires. A send it counted stays counted
        // (the safe side).
        let mut unanswered = Unanswered {
            st,
            shared,
            lease: limits.max_in_flight.map(|_| lease),
        };
        let answer: Vec<i64> = shared.run(call).await?;
        unanswered.lease = None;
        if !released.is_empty() {
            lock(&st.released).retain(|id| !released.contains(id));
        }
        let micros = |us: i64| Duration::from_micros(u64::try_from(us).unwrap_or(0));
        Ok(match answer.as_slice() {
            [0, sent] => {
                if limits.max_in_flight.is_some() {
                    lock(&st.held).push(lease);
                }
                if cost > 0 {
                    let busy = ScopeState::busy_for(&limits);
                    st.mark_busy(crate::clock::instant_after(now, busy));
                    st.remember(&limits, lease, *sent, cost, now);
                }
                Admission::Admitted(LeaseId(lease))
            }
            [1, us] => Admission::CoolingDown(micros(*us)),
            [2] => Admission::InFlightFull,
            [3, us] => Admission::NotBefore(micros(*us) + shared.jitter()),
            other => return Err(unexpected(other)),
        })
    }

    /// The failure policy's answer while Redis is unreachable.
    async fn admit_fallback(&self, scope: &RedisScope, cost: u32) -> Result<Admission, StoreError> {
        match self.shared.config.on_unavailable {
            OnUnavailable::LocalLimits => {
                let answer = self.shared.memory.admit(&scope.state.local, cost).await?;
                Ok(match answer {
                    Admission::Admitted(LeaseId(id)) => Admission::Admitted(LeaseId(LOCAL | id)),
                    other => other,
                })
            }
            OnUnavailable::FailOpen => Ok(Admission::Admitted(LeaseId(UNCOUNTED))),
            OnUnavailable::FailClosed => Err(self.shared.health.error()),
        }
    }
}

impl Store for RedisStore {
    type Scope = RedisScope;

    fn open(&self, id: ScopeId, limits: &Limits) -> RedisScope {
        let id_hex = format!("{:032x}", id.as_u128());
        let state = Arc::new(ScopeState {
            id_hex: id_hex.clone(),
            shared: Arc::downgrade(&self.shared),
            limits: Mutex::new((
                limits.clone(),
                Keys::new(&self.shared.config.namespace, &id_hex, limits),
            )),
            held: Mutex::default(),
            released: Mutex::default(),
            local: self.shared.memory.open(id, limits),
            busy_until: Mutex::default(),
            released_elsewhere: Notify::new(),
            charges: Mutex::default(),
        });
        let mut scopes = lock(&self.shared.scopes);
        let same_id = scopes.entry(id).or_default();
        same_id.retain(|w| w.strong_count() > 0);
        same_id.push(Arc::downgrade(&state));
        drop(scopes);
        RedisScope { state }
    }

    async fn admit(&self, scope: &RedisScope, cost: u32) -> Result<Admission, StoreError> {
        let limits_smallest = lock(&scope.state.limits).0.smallest_quota();
        if let Some(quota) = limits_smallest.filter(|q| cost > q.capacity()) {
            let capacity = quota.capacity();
            return Ok(Admission::CostTooLarge { capacity, quota });
        }
        if self.shared.health.may_ask(Instant::now()) {
            match self.admit_remote(scope, cost).await {
                Ok(answer) => {
                    self.shared.health.succeeded();
                    return Ok(answer);
                }
                Err(e) => self.shared.failed(&e),
            }
        }
        self.admit_fallback(scope, cost).await
    }

    fn release(&self, scope: &RedisScope, lease: LeaseId) {
        let st = &scope.state;
        match lease.0 {
            UNCOUNTED => {}
            id if id & LOCAL != 0 => self.shared.memory.release(&st.local, LeaseId(id & !LOCAL)),
            id => {
                let mut held = lock(&st.held);
                let Some(at) = held.iter().position(|&h| h == id) else {
                    return; // No cap: nothing was leased in Redis.
                };
                held.swap_remove(at);
                drop(held);
                lock(&st.released).push(id);
                self.shared.flush.notify_one();
            }
        }
    }

    async fn close_cooldown(&self, scope: &RedisScope, wait: Duration) -> Result<(), StoreError> {
        let st = &scope.state;
        let now = Instant::now();
        st.mark_busy(crate::clock::instant_after(now, wait));
        // The local fallback closes too, so that it holds if Redis goes away.
        self.shared.memory.close_cooldown(&st.local, wait).await?;
        if !self.shared.health.may_ask(now) {
            return self.unavailable();
        }
        let keys = lock(&st.limits).1.clone();
        let mut call = self.shared.scripts.cooldown.prepare_invoke();
        call.key(&keys.cooldown)
            .arg(self.shared.now_arg())
            .arg(script::micros(wait));
        match self.shared.run::<i64>(call).await {
            Ok(_) => {
                self.shared.health.succeeded();
                Ok(())
            }
            Err(e) => {
                self.shared.failed(&e);
                self.unavailable()
            }
        }
    }

    async fn set_limits(&self, scope: &RedisScope, limits: &Limits) -> Result<(), StoreError> {
        self.set_limits_counting(scope, limits, &[]).await
    }

    /// The local limits (used while Redis is unreachable) count `sent`; windows added in
    /// Redis start empty.
    async fn set_limits_counting(
        &self,
        scope: &RedisScope,
        limits: &Limits,
        sent: &[Instant],
    ) -> Result<(), StoreError> {
        let st = &scope.state;
        self.shared
            .memory
            .set_limits_counting(&st.local, limits, sent)
            .await?;
        let (old, keys) = {
            let mut guard = lock(&st.limits);
            let old = guard.0.buckets.clone();
            guard.0 = limits.clone();
            guard.1.resize(limits);
            (old, guard.1.clone())
        };
        // A bucket whose quota changed starts empty, as in memory.
        let changed: Vec<usize> = (0..limits.buckets.len())
            .filter(|&i| old.get(i).is_some_and(|q| *q != limits.buckets[i]))
            .collect();
        if changed.is_empty() {
            return Ok(());
        }
        let mut call = self.shared.scripts.empty.prepare_invoke();
        call.arg(self.shared.now_arg());
        for &i in &changed {
            let (t, tau) = script::gcra(&limits.buckets[i]);
            call.key(&keys.buckets[i]).arg(t).arg(tau);
        }
        match self.shared.run::<i64>(call).await {
            Ok(_) => Ok(()),
            Err(e) => {
                self.shared.failed(&e);
                self.unavailable()
            }
        }
    }

    async fn settle(
        &self,
        scope: &RedisScope,
        lease: LeaseId,
        settlement: Settlement,
    ) -> Result<(), StoreError> {
        let st = &scope.state;
        let (limits, keys) = lock(&st.limits).clone();
        let (sent, estimate) = match lease.0 {
            // Admitted without Redis: the charge is local; a report of tokens remaining
            // still speaks of the shared window.
            UNCOUNTED => (None, None),
            id if id & LOCAL != 0 => {
                let local = LeaseId(id & !LOCAL);
                self.shared
                    .memory
                    .settle(&st.local, local, settlement)
                    .await?;
                (None, None)
            }
            id => st.charge_of(&limits, id, settlement.actual.is_some()),
        };
        let settling = settlement.actual.is_some() && estimate.is_some();
        // A report of tokens remaining concerns only token windows: without one, an API that
        // reports tokens on every answer costs no round trip.
        let tokens = settlement.tokens_remaining.is_some()
            && limits.windows.iter().any(|w| w.unit == super::Unit::Tokens);
        if !settling && !tokens {
            return Ok(());
        }
        if !self.shared.health.may_ask(Instant::now()) {
            return self.unavailable();
        }
        let call = script::settle(
            &self.shared.scripts,
            &keys,
            &limits,
            &self.shared.now_arg(),
            script::Entry {
                lease: lease.0,
                sent,
                estimate,
            },
            settlement,
        );
        match self.shared.run::<i64>(call).await {
            Ok(_) => Ok(()),
            Err(e) => {
                self.shared.failed(&e);
                self.unavailable()
            }
        }
    }

    fn is_idle(&self, scope: &RedisScope) -> bool {
        let st = &scope.state;
        let now = Instant::now();
        lock(&st.held).is_empty()
            && lock(&st.busy_until).is_none_or(|u| u <= now)
            && self.shared.memory.is_idle(&st.local)
    }

    fn in_flight_poll(&self) -> Option<Duration> {
        Some(self.shared.config.poll)
    }

    fn released_elsewhere(
        &self,
        scope: &RedisScope,
    ) -> impl std::future::Future<Output = ()> + Send {
        let state = scope.state.clone();
        async move { state.released_elsewhere.notified().await }
    }

    fn scope_hash_key(&self) -> Option<[u64; 2]> {
        Some(self.shared.hash_key)
    }
}

impl RedisStore {
    /// What a call that could not reach Redis answers, by the failure policy.
    fn unavailable(&self) -> Result<(), StoreError> {
        match self.shared.config.on_unavailable {
            OnUnavailable::FailClosed => Err(self.shared.health.error()),
            _ => Ok(()),
        }
    }
}
