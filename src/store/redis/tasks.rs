//! The Redis store's two background tasks, one each per store: the lease task (sends
//! releases, renews held leases) and the subscriber (wakes local waiters when another
//! process releases a lease). Each holds a weak reference and ends when the store is dropped.

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::time::Instant;

use super::{script, ScopeState, Shared};
use crate::store::ScopeId;
use crate::sync::lock;

/// Starts the tasks of `shared` (on the current tokio runtime).
pub(super) fn spawn(shared: &Arc<Shared>) {
    tokio::spawn(lease_task(Arc::downgrade(shared)));
    tokio::spawn(subscriber(Arc::downgrade(shared)));
}

/// How soon a failed release is sent again.
const RETRY_RELEASE: Duration = Duration::from_millis(100);

async fn lease_task(weak: Weak<Shared>) {
    let mut next_renewal = Instant::now();
    loop {
        let Some(shared) = weak.upgrade() else { return };
        let now = Instant::now();
        let renew = !shared.config.local_clock && now >= next_renewal;
        if renew {
            next_renewal = now + shared.config.lease_ttl / 3;
        }
        let pending = send_orphans(&shared).await | send_scopes(&shared, renew).await;
        let flush = shared.flush.clone();
        let wake = if shared.config.local_clock {
            None
        } else if pending {
            Some(now + RETRY_RELEASE)
        } else {
            Some(next_renewal)
        };
        drop(shared);
        match wake {
            Some(at) => {
                tokio::select! {
                    () = flush.notified() => {}
                    () = tokio::time::sleep_until(at) => {}
                }
            }
            None => flush.notified().await,
        }
    }
}

/// Sends the releases of dropped scopes; `true` if some failed (kept for the next pass).
async fn send_orphans(shared: &Arc<Shared>) -> bool {
    let orphans = std::mem::take(&mut *lock(&shared.orphans));
    let mut failed = Vec::new();
    for (leases, id_hex, ids) in orphans {
        let call = script::release(
            &shared.scripts.leases,
            &leases,
            &shared.now_arg(),
            shared.config.lease_ttl,
            &shared.channel,
            &id_hex,
            &ids,
        );
        if let Err(e) = shared.run::<i64>(call).await {
            shared.failed(&e);
            failed.push((leases, id_hex, ids));
        }
    }
    let pending = !failed.is_empty();
    lock(&shared.orphans).extend(failed);
    pending
}

/// Sends each live scope's releases (and, with `renew`, renews its held leases); `true` if
/// some releases are still unsent.
async fn send_scopes(shared: &Arc<Shared>, renew: bool) -> bool {
    let scopes: Vec<Arc<ScopeState>> = {
        let mut map = lock(&shared.scopes);
        map.retain(|_, same_id| {
            same_id.retain(|w| w.strong_count() > 0);
            !same_id.is_empty()
        });
        map.values().flatten().filter_map(Weak::upgrade).collect()
    };
    let mut pending = false;
    for scope in scopes {
        let released = lock(&scope.released).clone();
        let held = if renew {
            lock(&scope.held).clone()
        } else {
            Vec::new()
        };
        if released.is_empty() && held.is_empty() {
            continue;
        }
        let leases = lock(&scope.limits).1.leases.clone();
        let mut call = shared.scripts.leases.prepare_invoke();
        call.key(&leases)
            .arg(shared.now_arg())
            .arg(script::micros(shared.config.lease_ttl))
            .arg(&shared.channel)
            .arg(&scope.id_hex)
            .arg(released.len());
        for id in released.iter().chain(&held) {
            call.arg(*id);
        }
        match shared.run::<i64>(call).await {
            Ok(_) => lock(&scope.released).retain(|id| !released.contains(id)),
            Err(e) => {
                shared.failed(&e);
                pending |= !released.is_empty();
            }
        }
    }
    pending
}

/// The first and the longest pause before the subscriber connects again.
const RECONNECT: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

async fn subscriber(weak: Weak<Shared>) {
    let mut pause = RECONNECT.0;
    loop {
        let Some((client, channel, stop)) = weak
            .upgrade()
            .map(|s| (s.client.clone(), s.channel.clone(), s.stop.clone()))
        else {
            return;
        };
        let listen = async {
            let mut pubsub = client.get_async_pubsub().await.ok()?;
            pubsub.subscribe(&channel).await.ok()?;
            pause = RECONNECT.0;
            let mut messages = pubsub.into_on_message();
            while let Some(msg) = messages.next().await {
                let shared = weak.upgrade()?;
                let scopes: Vec<Arc<ScopeState>> = msg
                    .get_payload::<String>()
                    .ok()
                    .and_then(|hex| u128::from_str_radix(&hex, 16).ok())
                    .and_then(|bits| {
                        let scopes = lock(&shared.scopes);
                        let same_id = scopes.get(&ScopeId::from_u128(bits))?;
                        Some(same_id.iter().filter_map(Weak::upgrade).collect())
                    })
                    .unwrap_or_default();
                for scope in scopes {
                    scope.released_elsewhere.notify_waiters();
                }
            }
            Some(())
        };
        tokio::select! {
            _ = listen => {}
            () = stop.notified() => return,
        }
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = stop.notified() => return,
        }
        pause = (pause * 2).min(RECONNECT.1);
    }
}

/// Sends the releases of scopes dropped with their store (the store's last handle gone
/// before the lease task sent them), on a task of their own: once each, within the timeout.
pub(super) fn send_last_releases(shared: &Shared) {
    let orphans = std::mem::take(&mut *lock(&shared.orphans));
    let (false, Some(conn), Ok(runtime)) = (
        orphans.is_empty(),
        shared.conn.get().cloned(),
        tokio::runtime::Handle::try_current(),
    ) else {
        return;
    };
    let script = shared.scripts.leases.clone();
    let (now, ttl) = (shared.now_arg(), shared.config.lease_ttl);
    let (channel, timeout) = (shared.channel.clone(), shared.config.timeout);
    runtime.spawn(async move {
        let mut conn = conn;
        for (leases, id_hex, ids) in orphans {
            let call = script::release(&script, &leases, &now, ttl, &channel, &id_hex, &ids);
            let sent = call.invoke_async::<i64>(&mut conn);
            let _ = match timeout {
                Some(t) => tokio::time::timeout(t, sent).await.ok(),
                None => Some(sent.await),
            };
        }
    });
}
