//! The live scopes of one throttle, with bounded memory: idle scopes are forgotten after a
//! time to live, and their number is capped.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use reqwest::Request;
use tokio::time::Instant;

use super::scope::{Key, Resolver, Scope};
use super::slot::{Slot, SlotConfig};
use crate::clock::instant_after;
use crate::store::{ScopeId, Store};

/// The shortest time between two sweeps of the map for idle scopes (a zero TTL would sweep
/// on every lookup).
const MIN_SWEEP_INTERVAL: Duration = Duration::from_millis(100);
use crate::sync::lock;

/// A [`ScopeId`] is already a keyed hash: its low 64 bits index the map as they are.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only reached through `write_u128`'s default, which writes the bytes.
        for &b in bytes.iter().take(8) {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }

    fn write_u128(&mut self, i: u128) {
        // Truncation intended: the low half is as random as the whole.
        self.0 = i as u64;
    }
}

type SlotMap<S> = HashMap<ScopeId, Arc<Slot<S>>, BuildHasherDefault<IdHasher>>;

#[derive(Debug)]
struct Map<S: Store> {
    slots: SlotMap<S>,
    /// Shared by new scopes while the map is full of busy ones.
    overflow: Option<Arc<Slot<S>>>,
    next_sweep: Instant,
    /// New keys that may go without a full sweep of a full map: a map full of busy scopes is
    /// swept once per `max_scopes / 16` new keys, not for every one.
    sweep_credit: usize,
}

/// How many scopes a throttle keeps, and for how long.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// At most this many keyed scopes alive at once.
    pub(crate) max_scopes: usize,
    /// An idle scope is forgotten this long after its last use.
    pub(crate) idle_ttl: Duration,
}

/// The live scopes of one throttle.
#[derive(Debug)]
pub(crate) struct Registry<S: Store> {
    resolver: Resolver,
    global: bool,
    config: SlotConfig<S>,
    bounds: Bounds,
    /// The scope of requests without a key (and of [`Throttle::acquire`](crate::Throttle::acquire)):
    /// made at first use, never forgotten.
    unkeyed: OnceLock<Arc<Slot<S>>>,
    map: Mutex<Map<S>>,
}

impl<S: Store> Registry<S> {
    pub(crate) fn new(scope: Scope, config: SlotConfig<S>, bounds: Bounds) -> Self {
        let now = Instant::now();
        Self {
            global: scope.is_global(),
            resolver: Resolver::new(scope, config.store.scope_hash_key()),
            config,
            bounds,
            unkeyed: OnceLock::new(),
            map: Mutex::new(Map {
                slots: HashMap::default(),
                overflow: None,
                next_sweep: now,
                sweep_credit: 0,
            }),
        }
    }

    /// Names the scope of each example request (before any scope is opened).
    pub(crate) fn name_scopes(&mut self, names: Vec<(Arc<str>, Request)>) {
        for (name, example) in names {
            let id = self.resolver.id(&self.resolver.key(&example));
            self.config.names.insert(id, name);
        }
    }

    /// The unkeyed scope.
    pub(crate) fn store(&self) -> &S {
        &self.config.store
    }

    pub(crate) fn unkeyed(&self) -> &Arc<Slot<S>> {
        self.unkeyed.get_or_init(|| {
            let key = Key::Unkeyed;
            let id = self.resolver.id(&key);
            Arc::new(self.config.open(id, key.label(id)))
        })
    }

    /// The scope of `req`, made if it is new.
    pub(crate) fn scope_of(&self, req: &Request) -> Arc<Slot<S>> {
        if self.global {
            return self.unkeyed().clone();
        }
        let key = self.resolver.key(req);
        if let Key::Unkeyed = key {
            return self.unkeyed().clone();
        }
        let id = self.resolver.id(&key);
        let now = Instant::now();
        let mut map = lock(&self.map);
        if now >= map.next_sweep {
            self.sweep(&mut map, now, false);
        }
        if let Some(slot) = map.slots.get(&id) {
            slot.touch(now);
            return slot.clone();
        }
        // Keys new to the map go to the overflow scope while it counts anything: a key that
        // sent through it and now got a fresh scope of its own could pass its limits.
        if let Some(overflow) = map.overflow.take() {
            if !(Arc::strong_count(&overflow) == 1 && overflow.is_idle()) {
                map.overflow = Some(overflow.clone());
                return overflow;
            }
            // Idle again: forgotten, and the map swept now for room.
            map.sweep_credit = 0;
        }
        let max = self.bounds.max_scopes;
        if map.slots.len() >= max && map.sweep_credit == 0 {
            self.sweep(&mut map, now, true);
            map.sweep_credit = (max / 16).max(1);
        }
        if map.slots.len() >= max {
            map.sweep_credit = map.sweep_credit.saturating_sub(1);
            tracing::warn!(
                max_scopes = max,
                "every scope is busy: new keys share the overflow scope"
            );
            let overflow = Arc::new(self.config.open(ScopeId::from_u128(0), "(overflow)".into()));
            map.overflow = Some(overflow.clone());
            return overflow;
        }
        let slot = Arc::new(self.config.open(id, key.label(id)));
        map.slots.insert(id, slot.clone());
        slot
    }

    /// Forgets idle scopes: those unused for the time to live, or (`full`) every idle one.
    /// A scope is idle when nothing holds it but the map (no call, lease or waiter) and its
    /// state is a fresh scope's, so forgetting it changes no admission.
    fn sweep(&self, map: &mut Map<S>, now: Instant, full: bool) {
        let ttl = self.bounds.idle_ttl;
        let before = map.slots.len();
        map.slots.retain(|_, slot| {
            let expired = full || now.saturating_duration_since(slot.last_used()) >= ttl;
            !(expired && Arc::strong_count(slot) == 1 && slot.is_idle())
        });
        if map
            .overflow
            .as_ref()
            .is_some_and(|o| Arc::strong_count(o) == 1 && o.is_idle())
        {
            map.overflow = None;
        }
        map.next_sweep = instant_after(now, (ttl / 2).max(MIN_SWEEP_INTERVAL));
        let evicted = before - map.slots.len();
        if evicted > 0 {
            tracing::debug!(evicted, alive = map.slots.len(), "idle scopes forgotten");
        }
        if full || evicted > before / 2 {
            map.slots.shrink_to_fit();
        }
    }

    /// Every live scope: the unkeyed one (if made), the keyed ones, and the overflow scope.
    /// Forgets the idle ones first if a sweep is due, so what is reported is what is alive.
    pub(crate) fn each(&self, mut f: impl FnMut(&Slot<S>)) {
        if let Some(unkeyed) = self.unkeyed.get() {
            f(unkeyed);
        }
        let mut map = lock(&self.map);
        let now = Instant::now();
        if now >= map.next_sweep {
            self.sweep(&mut map, now, false);
        }
        map.slots.values().for_each(|s| f(s));
        if let Some(overflow) = &map.overflow {
            f(overflow);
        }
    }

    /// The limits a new scope starts with.
    pub(crate) fn limits(&self) -> &crate::store::Limits {
        &self.config.limits
    }

    /// The learning settings new scopes start with.
    pub(crate) fn learn_config(&self) -> &crate::learn::LearnConfig {
        &self.config.learn
    }

    /// The live keyed scopes (the unkeyed and overflow scopes not counted).
    pub(crate) fn len(&self) -> usize {
        lock(&self.map).slots.len()
    }
}
