//! The Lua scripts of the Redis store and the arguments each takes: one script per admission
//! attempt, run atomically by Redis (EVALSHA, reloaded on NOSCRIPT by `redis::Script`).

use std::time::Duration;

use redis::{Script, ScriptInvocation};

use crate::store::Limits;

/// The scripts, hashed once per store.
#[derive(Debug)]
pub(super) struct Scripts {
    pub(super) admit: Script,
    pub(super) cooldown: Script,
    pub(super) leases: Script,
    pub(super) empty: Script,
    pub(super) settle: Script,
}

impl Scripts {
    pub(super) fn new() -> Self {
        Self {
            admit: Script::new(concat!(
                include_str!("prelude.lua"),
                include_str!("admit.lua")
            )),
            cooldown: Script::new(concat!(
                include_str!("prelude.lua"),
                include_str!("cooldown.lua")
            )),
            leases: Script::new(concat!(
                include_str!("prelude.lua"),
                include_str!("leases.lua")
            )),
            empty: Script::new(concat!(
                include_str!("prelude.lua"),
                include_str!("empty.lua")
            )),
            settle: Script::new(concat!(
                include_str!("prelude.lua"),
                include_str!("settle.lua")
            )),
        }
    }
}

/// Microseconds in `d`, at most [`FAR_FUTURE`](crate::clock::FAR_FUTURE) (Lua counts in
/// doubles: exact up to 2⁵³ µs, about 285 years).
pub(super) fn micros(d: Duration) -> u64 {
    u64::try_from(d.min(crate::clock::FAR_FUTURE).as_micros()).unwrap_or(u64::MAX)
}

/// A token bucket's GCRA parameters in microseconds: the emission interval `t` and the
/// tolerance `tau = t × (burst − 1)`, as `governor` computes them.
pub(super) fn gcra(quota: &governor::Quota) -> (u64, u64) {
    let t = micros(quota.replenish_interval()).max(1);
    (t, t * u64::from(quota.burst_size().get() - 1))
}

/// The key names of one scope: every key in one cluster hash slot (the `{…}` tag), named by
/// the scope's hashed id, never by its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Keys {
    pub(super) cooldown: String,
    pub(super) leases: String,
    pub(super) waiting: String,
    pub(super) windows: Vec<String>,
    pub(super) buckets: Vec<String>,
    prefix: String,
}

impl Keys {
    pub(super) fn new(namespace: &str, id_hex: &str, limits: &Limits) -> Self {
        let prefix = format!("{namespace}:{{{id_hex}}}");
        let mut keys = Self {
            cooldown: format!("{prefix}:cooldown"),
            leases: format!("{prefix}:leases"),
            waiting: format!("{prefix}:waiting"),
            windows: Vec::new(),
            buckets: Vec::new(),
            prefix,
        };
        keys.resize(limits);
        keys
    }

    /// The keys for `limits`: one per window (by position) and one per bucket (by position
    /// and settings, so a bucket whose quota changes starts on a key of its own).
    pub(super) fn resize(&mut self, limits: &Limits) {
        let prefix = &self.prefix;
        self.windows = (0..limits.windows.len())
            .map(|i| format!("{prefix}:window:{i}"))
            .collect();
        self.buckets = limits
            .buckets
            .iter()
            .enumerate()
            .map(|(i, q)| {
                let (t, tau) = gcra(q);
                format!("{prefix}:bucket:{i}:{t}:{tau}")
            })
            .collect();
    }
}

/// How long a window counts a send: its window and guard, in µs.
fn span(w: &crate::store::WindowQuota) -> u64 {
    micros(w.window.saturating_add(w.guard))
}

/// The keys of every window (log, units) and bucket, in the scripts' order.
fn quota_keys(call: &mut ScriptInvocation<'_>, keys: &Keys) {
    for w in &keys.windows {
        call.key(w).key(format!("{w}:units"));
    }
    for b in &keys.buckets {
        call.key(b);
    }
}

/// An admission as a settlement names it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Entry {
    /// Its lease id (its entry's id in the windows).
    pub(super) lease: u64,
    /// When Redis admitted it (µs, Redis time), if known.
    pub(super) sent: Option<i64>,
    /// Its estimate, in units; `None`: unknown or already settled.
    pub(super) estimate: Option<u32>,
}

/// The settlement script's call for `entry`.
pub(super) fn settle<'a>(
    scripts: &'a Scripts,
    keys: &Keys,
    limits: &Limits,
    now: &str,
    entry: Entry,
    settlement: crate::store::Settlement,
) -> ScriptInvocation<'a> {
    let Entry {
        lease,
        sent,
        estimate,
    } = entry;
    use crate::store::Unit;
    let text = |v: Option<String>| v.unwrap_or_default();
    let mut call = scripts.settle.prepare_invoke();
    quota_keys(&mut call, keys);
    call.arg(now)
        .arg(lease)
        .arg(text(sent.map(|s| s.to_string())))
        .arg(text(estimate.map(|e| e.to_string())))
        .arg(text(settlement.actual.map(|a| a.to_string())))
        .arg(text(settlement.tokens_remaining.map(|r| r.to_string())))
        .arg(limits.windows.len())
        .arg(limits.buckets.len());
    for w in &limits.windows {
        let unit = match w.unit {
            Unit::Requests => 1,
            Unit::Tokens => 2,
            _ => 0,
        };
        call.arg(w.limit.get()).arg(span(w)).arg(unit);
    }
    bucket_args(&mut call, limits);
    call
}

/// (t, tau, guard) in µs per token bucket.
fn bucket_args(call: &mut ScriptInvocation<'_>, limits: &Limits) {
    let guard = micros(limits.bucket_guard);
    for q in &limits.buckets {
        let (t, tau) = gcra(q);
        call.arg(t).arg(tau).arg(guard);
    }
}

/// The admission script's call for `cost` units; `process` is this process's id and the
/// leases it holds in the scope.
#[allow(clippy::too_many_arguments)]
pub(super) fn admit<'a>(
    scripts: &'a Scripts,
    keys: &Keys,
    limits: &Limits,
    now: &str,
    cost: u32,
    lease: u64,
    lease_ttl: Duration,
    channel: &str,
    id_hex: &str,
    process: (u64, usize),
    released: &[u64],
) -> ScriptInvocation<'a> {
    let mut call = scripts.admit.prepare_invoke();
    call.key(&keys.cooldown)
        .key(&keys.leases)
        .key(&keys.waiting);
    for w in &keys.windows {
        call.key(w).key(format!("{w}:units"));
    }
    for b in &keys.buckets {
        call.key(b);
    }
    let cap = limits
        .max_in_flight
        .map_or(-1, |c| i64::try_from(c).unwrap_or(i64::MAX));
    call.arg(now)
        .arg(cost)
        .arg(cap)
        .arg(lease)
        .arg(micros(lease_ttl))
        .arg(limits.windows.len())
        .arg(limits.buckets.len())
        .arg(channel)
        .arg(id_hex)
        .arg(process.0)
        .arg(process.1)
        .arg(released.len());
    for id in released {
        call.arg(*id);
    }
    for w in &limits.windows {
        call.arg(w.limit.get())
            .arg(span(w))
            .arg(w.unit.charge(cost));
    }
    bucket_args(&mut call, limits);
    call
}

/// The lease script's call releasing `ids` of the scope whose leases key is `leases`.
pub(super) fn release<'a>(
    script: &'a Script,
    leases: &str,
    now: &str,
    lease_ttl: Duration,
    channel: &str,
    id_hex: &str,
    ids: &[u64],
) -> ScriptInvocation<'a> {
    let mut call = script.prepare_invoke();
    call.key(leases)
        .arg(now)
        .arg(micros(lease_ttl))
        .arg(channel)
        .arg(id_hex)
        .arg(ids.len());
    for id in ids {
        call.arg(*id);
    }
    call
}
