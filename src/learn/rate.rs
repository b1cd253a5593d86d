//! A server's token bucket (rate and burst), learned from which sends it admitted and which
//! it refused.
//!
//! The server is modelled as nginx's `limit_req` (a GCRA that does not charge a refused
//! request): for a rate `r` the bucket's fill `x` after the admitted sends is known without
//! knowing the burst (`x` drains at `r`, each admitted send adds 1, never below 0), and the
//! burst `C` (sends admitted at once from idle) must satisfy `x + 1 <= C` at every admitted
//! send and `x + 1 > C` at every refused one. The learned rate is the range of rates that
//! explains the most sends (misses allowed, for sends that arrive in another order or time
//! than they were sent), found on a geometric grid and refined at its edges by bisection.
//!
//! One refusal from idle only gives a line (`C + r·t = admitted`); sends after it at another
//! pace pin the rate. So after a refusal whose fit is not yet pinned the pace is half the
//! highest rate the fit allows, from an empty bucket: a second refusal (if that pace is still
//! above the server's) then pins it, at no loss of sends (the server admits as many while
//! the client sends faster than its rate).
//!
//! Pure: instants in, a pace out; no clock, no I/O.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Sends kept for the fit: the most recent ones.
const LOG_LEN: usize = 2048;
/// Points of the geometric grid of candidate rates.
const GRID: usize = 160;
/// Bisection steps at each edge of the best range.
const REFINE: usize = 14;
/// A fit is pinned when its highest rate is at most this much above its lowest.
const PINNED: f64 = 1.12;
/// A fit whose range is at most this wide paces at its middle.
const NARROW: f64 = 2.0;
/// The pace is this fraction of the learned rate: just under it.
const UNDER: f64 = 0.99;
/// An unpinned pace is held, before probing upward, for the time its sends would take to
/// drain this many of the largest burst the data allows (see [`RateModel::choose`]).
const HOLD_BURSTS: f64 = 4.0;
/// A warm start's prior rate that a refusal shows too high is cut to this fraction.
const PRIOR_CUT: f64 = 0.9;

/// What the rate model knows of one send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Sent, not answered yet.
    Pending,
    /// The server admitted it.
    Admitted,
    /// The server refused it for its rate.
    Refused,
    /// Says nothing of the rate (a parallel-limit refusal, a failure).
    Unknown,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    at: Instant,
    seen: Seen,
}

/// A token bucket: `rate` per second, `burst` cells at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Bucket {
    /// Cells per second.
    pub(crate) rate: f64,
    /// Cells the bucket holds when full (at least 1).
    pub(crate) burst: u32,
}

/// The fit of the log: the range of rates that explain it best, and the burst at each end.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Fit {
    /// The lowest rate with the fewest misses, per second.
    pub(crate) lo: f64,
    /// The highest such rate, per second.
    pub(crate) hi: f64,
    /// The least loss (cells the best rate and burst do not explain).
    pub(crate) loss: f64,
}

impl Fit {
    /// Whether the data pins the rate (the range is narrow).
    pub(crate) fn pinned(&self) -> bool {
        self.hi <= self.lo * PINNED
    }

    /// How sure the estimate is, from 0 to 1: the range's low end over its high end.
    pub(crate) fn confidence(&self) -> f64 {
        if self.hi > 0.0 {
            (self.lo / self.hi).clamp(0.0, 1.0)
        } else {
            0.0
        }
    }
}

/// The rate model of one scope.
#[derive(Debug, Default)]
pub(crate) struct RateModel {
    log: VecDeque<Entry>,
    /// Sequence number of `log[0]`.
    base: u64,
    /// Refusals of sends made before this instant belong to the episode in progress.
    episode_until: Option<Instant>,
    /// Refusal episodes seen.
    pub(crate) episodes: u32,
    /// Sends numbered below this were unanswered at the last episode's first refusal: once
    /// all are answered, the log is fitted again.
    refit_before: Option<u64>,
    /// The last fit.
    pub(crate) fit: Option<Fit>,
    /// The pace in force.
    pub(crate) pace: Option<Bucket>,
    /// A pace known before any fit (a warm start), kept while the log cannot pin one.
    pub(crate) prior: Option<Bucket>,
    /// The first send at the pace in force (a clean period for probing upward starts there,
    /// not at the change: a cooldown after a refusal sends nothing and proves nothing).
    clean_since: Option<Instant>,
    /// The least clean time before the pace in force may be probed upward (see
    /// [`choose`](Self::choose)).
    hold: Duration,
}

impl RateModel {
    /// A model that starts from `prior` (a warm start), pacing at it.
    pub(crate) fn warm(prior: Bucket) -> Self {
        Self {
            prior: Some(prior),
            pace: Some(prior),
            ..Self::default()
        }
    }

    /// Logs a send at `at`; returns its sequence number for [`answered`](Self::answered).
    pub(crate) fn sent(&mut self, at: Instant) -> u64 {
        self.clean_since.get_or_insert(at);
        if self.log.len() == LOG_LEN {
            self.log.pop_front();
            self.base += 1;
        }
        // Sends are logged in the order they are made, so the log is in time order.
        self.log.push_back(Entry {
            at,
            seen: Seen::Pending,
        });
        self.base + self.log.len() as u64 - 1
    }

    /// Send `seq` will never be answered (its call was cancelled, or its deadline passed in
    /// flight): it says nothing of the rate. Nothing is fitted now; the next answer refits or
    /// settles what waited for it.
    pub(crate) fn abandoned(&mut self, seq: u64) {
        let i = seq
            .checked_sub(self.base)
            .and_then(|i| usize::try_from(i).ok());
        if let Some(e) = i.and_then(|i| self.log.get_mut(i)) {
            if e.seen == Seen::Pending {
                e.seen = Seen::Unknown;
            }
        }
    }

    /// The number the next send will have.
    pub(crate) fn next_seq(&self) -> u64 {
        self.base + self.log.len() as u64
    }

    /// Where the server's window starts among the sends numbered below `before`, for a
    /// refusal saying its oldest send leaves at `reset_at`, and how many sends from there were
    /// admitted: once every one of them is answered (`None` while one is not), `Some(None)`
    /// when some of them are no longer logged.
    ///
    /// The start is the latest send the server may count (not refused) that came after an
    /// idle time at least as long as the window it would start (`reset_at` less its instant):
    /// the server's window was empty when it came. The first send always is one.
    pub(crate) fn window_from(
        &self,
        before: u64,
        reset_at: Instant,
    ) -> Option<Option<(Instant, u32)>> {
        if self.base > 0 {
            return Some(None);
        }
        let n = usize::try_from(before).unwrap_or(usize::MAX);
        let sends: Vec<&Entry> = self.log.iter().take(n).collect();
        if sends.iter().any(|e| e.seen == Seen::Pending) {
            return None;
        }
        let mut start = None;
        let mut prev: Option<Instant> = None;
        for (i, e) in sends.iter().enumerate() {
            if e.seen == Seen::Refused {
                continue;
            }
            let idle = prev.is_none_or(|p| {
                e.at.saturating_duration_since(p) >= reset_at.saturating_duration_since(e.at)
            });
            if idle {
                start = Some(i);
            }
            prev = Some(e.at);
        }
        let Some(start) = start else {
            return Some(None);
        };
        let from = sends[start..].iter();
        let admitted = from.filter(|e| e.seen == Seen::Admitted).count();
        Some(Some((
            sends[start].at,
            u32::try_from(admitted).unwrap_or(u32::MAX),
        )))
    }

    /// The instants of the logged sends the server counts or may count (admitted, or not
    /// answered yet), oldest first.
    pub(crate) fn counted_sends(&self) -> impl Iterator<Item = Instant> + '_ {
        self.log
            .iter()
            .filter(|e| matches!(e.seen, Seen::Admitted | Seen::Pending))
            .map(|e| e.at)
    }

    /// Records what became of send `seq` (answered at `now`). Returns the new pace when this
    /// answer opens a refusal episode (one per episode, however many sends it refuses), or
    /// completes one: the fit made at its first refusal took the sends then unanswered as
    /// admitted; once they are all answered, the log is fitted again.
    pub(crate) fn answered(&mut self, seq: u64, seen: Seen, now: Instant) -> Option<Bucket> {
        let i = usize::try_from(seq.checked_sub(self.base)?).ok()?;
        let entry = self.log.get_mut(i)?;
        entry.seen = seen;
        let at = entry.at;
        let opens = seen == Seen::Refused && self.episode_until.is_none_or(|until| at > until);
        if opens {
            // A new episode: sends made before now were made without knowing of it.
            self.episode_until = Some(now);
            self.episodes += 1;
            self.refit_before = Some(self.next_seq());
            return self.refit();
        }
        let before = self.refit_before?;
        let n = usize::try_from(before.saturating_sub(self.base)).unwrap_or(usize::MAX);
        if self.log.iter().take(n).any(|e| e.seen == Seen::Pending) {
            return None;
        }
        self.refit_before = None;
        let old = self.pace;
        self.refit().filter(|&p| Some(p) != old)
    }

    /// Fits the log and takes the pace the fit gives.
    fn refit(&mut self) -> Option<Bucket> {
        self.fit = fit(&self.log);
        let (pace, hold) = self.choose();
        self.pace = pace;
        self.hold = hold;
        self.clean_since = None;
        pace
    }

    /// After a clean period of sending at the pace in force without a refusal, a pace 10 %
    /// higher (probing upward); `None` when it is not time. The clean period is `clean` for a
    /// pinned or loaded pace, and the pace's hold for a guess (see [`choose`](Self::choose)).
    pub(crate) fn probe_up(&mut self, now: Instant, clean: Duration) -> Option<Bucket> {
        let pace = self.pace?;
        let since = self.clean_since?;
        let clean = if self.hold.is_zero() {
            clean
        } else {
            self.hold
        };
        if now.saturating_duration_since(since) < clean {
            return None;
        }
        let up = Bucket {
            rate: pace.rate * 1.1,
            burst: pace.burst,
        };
        self.pace = Some(up);
        self.clean_since = None;
        // The hold is a number of cells at the pace: shorter at a higher one.
        if !self.hold.is_zero() {
            self.hold = self.hold.div_f64(1.1).max(Duration::from_nanos(1));
        }
        Some(up)
    }

    /// The pace a pinned fit gives: just under the middle of its range, with the smallest
    /// burst the range allows (a burst fitted at a slower rate than the server's grows with
    /// the time sent at it). `None` when the fit is not pinned.
    pub(crate) fn estimate(&self) -> Option<Bucket> {
        let f = self.fit.filter(Fit::pinned)?;
        let rate = (f.lo + f.hi) / 2.0 * UNDER;
        let burst = burst_at(&self.log, f.hi).max(1);
        Some(Bucket { rate, burst })
    }

    /// The pace for the fit in force, and the least clean time before it may be probed
    /// upward.
    fn choose(&self) -> (Option<Bucket>, Duration) {
        let Some(f) = self.fit else {
            return (self.prior, Duration::ZERO);
        };
        if f.pinned() {
            return (self.estimate(), Duration::ZERO);
        }
        let pace = if let Some(prior) = self.prior {
            // A warm start refused: the prior, cut by a tenth unless the data allows it, never
            // above what the data allows, with no larger a burst.
            let allowed = prior.rate >= f.lo && prior.rate <= f.hi;
            let cut = if allowed { UNDER } else { PRIOR_CUT };
            Bucket {
                rate: prior.rate.min(f.hi) * cut,
                burst: prior.burst.min(burst_at(&self.log, f.hi).max(1)),
            }
        } else if f.hi <= f.lo * NARROW {
            // Nearly pinned: the middle of the range (on log scale) with the smallest burst it
            // allows; a refusal at that pace narrows the range further.
            Bucket {
                rate: (f.lo * f.hi).sqrt() * UNDER,
                burst: burst_at(&self.log, f.hi).max(1),
            }
        } else {
            // Not pinned: half the highest rate the data allows, from an empty bucket of one
            // cell (off the line the first refusal drew, so that the next refusal pins it).
            Bucket {
                rate: (f.hi / 2.0).max(f.lo),
                burst: 1,
            }
        };
        // A server of rate `r` and burst at most `n` (the most the data allows) that admits
        // this pace for a time `t` has `r >= rate - n / t`: after `4 n / rate`, the rate is at
        // least 3/4 of the pace, and probing upward may start.
        let n = f64::from(burst_at(&self.log, f.lo).max(1));
        let hold = Duration::try_from_secs_f64(HOLD_BURSTS * n / pace.rate)
            .unwrap_or(Duration::MAX)
            .max(Duration::from_nanos(1));
        (Some(pace), hold)
    }
}

/// The fill levels (`x + 1`) at each admitted and each refused send, for rate `r`.
fn levels(log: &VecDeque<Entry>, r: f64) -> (Vec<f64>, Vec<f64>) {
    let last_refusal = log
        .iter()
        .rev()
        .find(|e| e.seen == Seen::Refused)
        .map(|e| e.at);
    let (mut admitted, mut refused) = (Vec::new(), Vec::new());
    let mut x = 0.0f64;
    let mut prev: Option<Instant> = None;
    for e in log {
        // A send not answered yet, made before the last refusal, was most likely admitted;
        // after it, nothing is known.
        let seen = match e.seen {
            Seen::Pending if last_refusal.is_some_and(|t| e.at < t) => Seen::Admitted,
            s => s,
        };
        if matches!(seen, Seen::Pending | Seen::Unknown) {
            continue;
        }
        if let Some(p) = prev {
            x = (x - r * e.at.saturating_duration_since(p).as_secs_f64()).max(0.0);
        }
        prev = Some(e.at);
        match seen {
            Seen::Admitted => {
                admitted.push(x + 1.0);
                x += 1.0;
            }
            _ => refused.push(x + 1.0),
        }
    }
    (admitted, refused)
}

/// How badly rate `r` explains the log, in cells, and the burst (whole cells, at least 1)
/// that explains it best. An admitted send at level `a` above the burst `C` costs `a − C`;
/// a refused send at level `f` at or below it (it should have been admitted) costs
/// `1 + C − f`: a whole miss, so that a rate at which every level collapses to 1 (every
/// send, admitted or not, finds the bucket empty) never explains refusals. Zero when some
/// burst explains every send.
fn loss_at(log: &VecDeque<Entry>, r: f64) -> (f64, f64) {
    let (mut admitted, mut refused) = levels(log, r);
    admitted.sort_by(f64::total_cmp);
    refused.sort_by(f64::total_cmp);
    let prefix = |v: &[f64]| {
        let mut p = Vec::with_capacity(v.len() + 1);
        p.push(0.0);
        for x in v {
            p.push(p.last().copied().unwrap_or(0.0) + x);
        }
        p
    };
    let (pa, pf) = (prefix(&admitted), prefix(&refused));
    let total_a = pa[admitted.len()];
    let loss = |c: f64| {
        let i = admitted.partition_point(|&a| a <= c);
        let j = refused.partition_point(|&f| f <= c);
        (total_a - pa[i]) - c * (admitted.len() - i) as f64 + j as f64 * (1.0 + c) - pf[j]
    };
    // Candidate bursts: each admitted level rounded up, and the whole cell below each
    // refused level.
    let eps = 1e-9;
    let candidates = admitted
        .iter()
        .map(|a| (a - eps).ceil())
        .chain(refused.iter().map(|f| (f - eps).ceil() - 1.0))
        .map(|c| c.max(1.0));
    let mut best = (loss(1.0), 1.0);
    for c in candidates {
        let l = loss(c);
        if l < best.0 {
            best = (l, c);
        }
    }
    best
}

/// The burst (whole cells) the log shows at rate `r`.
fn burst_at(log: &VecDeque<Entry>, r: f64) -> u32 {
    let (_, c) = loss_at(log, r);
    // Levels sit a hair above whole cells when sends come closer than 1/r apart.
    (c + 1e-6).floor().clamp(0.0, f64::from(u32::MAX)) as u32
}

/// Rates whose loss is within this many cells of the least explain the log as well.
const SLACK: f64 = 1.5;

/// Fits the log: `None` without a refusal and two admitted sends to fit.
fn fit(log: &VecDeque<Entry>) -> Option<Fit> {
    let admitted = log.iter().filter(|e| e.seen == Seen::Admitted).count();
    if admitted < 2 || !log.iter().any(|e| e.seen == Seen::Refused) {
        return None;
    }
    let span = log
        .back()?
        .at
        .saturating_duration_since(log.front()?.at)
        .as_secs_f64()
        .max(1e-3);
    // Rates from far below to far above the average admission rate.
    let scale = admitted as f64 / span;
    let (lo, hi) = (scale / 100.0, scale * 100.0);
    let step = (hi / lo).powf(1.0 / (GRID - 1) as f64);
    let grid: Vec<f64> = (0..GRID).map(|i| lo * step.powi(i as i32)).collect();
    let losses: Vec<f64> = grid.iter().map(|&r| loss_at(log, r).0).collect();
    let best_i = (0..GRID).min_by(|&a, &b| losses[a].total_cmp(&losses[b]))?;
    // The least between the grid's neighbours (golden-section search on log r).
    let (mut a, mut b) = (
        grid[best_i.saturating_sub(1)].ln(),
        grid[(best_i + 1).min(GRID - 1)].ln(),
    );
    for _ in 0..40 {
        let (m1, m2) = (a + (b - a) * 0.382, a + (b - a) * 0.618);
        if loss_at(log, m1.exp()).0 <= loss_at(log, m2.exp()).0 {
            b = m2;
        } else {
            a = m1;
        }
    }
    let best_r = ((a + b) / 2.0).exp();
    let least = loss_at(log, best_r).0.min(losses[best_i]);
    let within = |r: f64| loss_at(log, r).0 <= least + SLACK;
    // Walk out from the best rate to the first grid point outside, then bisect the edge.
    let edge = |outward: &dyn Fn(usize) -> Option<usize>| -> f64 {
        let mut inside = best_r;
        let mut i = best_i;
        loop {
            match outward(i) {
                Some(next) if within(grid[next]) => {
                    inside = grid[next];
                    i = next;
                }
                Some(next) => {
                    let (mut a, mut b) = (inside, grid[next]);
                    for _ in 0..REFINE {
                        let mid = (a * b).sqrt();
                        if within(mid) {
                            a = mid;
                        } else {
                            b = mid;
                        }
                    }
                    return a;
                }
                None => return inside,
            }
        }
    };
    let lo = edge(&|i| i.checked_sub(1));
    let hi = edge(&|i| (i + 1 < GRID).then_some(i + 1));
    Some(Fit {
        lo: lo.min(best_r),
        hi: hi.max(best_r),
        loss: least,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// nginx's `limit_req` (`rate` per second, `burst + 1` at once, refused sends not
    /// charged), in excess per mille as nginx keeps it.
    pub(crate) struct Nginx {
        rate: f64,
        cap: f64,
        excess: f64,
        last: Option<Instant>,
    }

    impl Nginx {
        pub(crate) fn new(rate: f64, burst: u32) -> Self {
            Self {
                rate,
                cap: f64::from(burst),
                excess: 0.0,
                last: None,
            }
        }

        pub(crate) fn arrive(&mut self, at: Instant) -> bool {
            let elapsed = self
                .last
                .map_or(0.0, |l| at.saturating_duration_since(l).as_secs_f64());
            let excess = (self.excess - self.rate * elapsed).max(0.0) + 1.0;
            if excess - 1.0 > self.cap + 1e-9 {
                return false;
            }
            self.excess = excess;
            self.last = Some(at);
            true
        }
    }

    #[test]
    fn nginx_model_admits_burst_plus_one_then_the_rate() {
        let t0 = Instant::now();
        let mut s = Nginx::new(50.0, 20);
        let at_once = (0..30).filter(|_| s.arrive(t0)).count();
        assert_eq!(at_once, 21);
        // 20 ms later, one more.
        let t1 = t0 + Duration::from_millis(20);
        assert!(s.arrive(t1));
        assert!(!s.arrive(t1));
    }

    /// Sends every `gap` from `from` until the first refusal (or `n` sends), each answered
    /// at once; returns the instant after the last send.
    fn drive(m: &mut RateModel, s: &mut Nginx, from: Instant, gap: Duration, n: u32) -> Instant {
        let mut t = from;
        for _ in 0..n {
            let seq = m.sent(t);
            let admitted = s.arrive(t);
            let seen = if admitted {
                Seen::Admitted
            } else {
                Seen::Refused
            };
            m.answered(seq, seen, t);
            t += gap;
            if !admitted {
                break;
            }
        }
        t
    }

    #[test]
    fn one_burst_from_idle_bounds_the_rate_from_above_only() {
        let t0 = Instant::now();
        let mut m = RateModel::default();
        let mut s = Nginx::new(50.0, 20);
        drive(&mut m, &mut s, t0, Duration::from_millis(5), 100);
        let f = m.fit.unwrap();
        assert!(!f.pinned(), "{f:?}");
        assert_eq!(m.episodes, 1);
        // The pace: half the highest rate, one cell.
        let pace = m.pace.unwrap();
        assert_eq!(pace.burst, 1);
        assert!((pace.rate - f.hi / 2.0).abs() < 1e-9);
    }

    #[test]
    fn a_second_pace_pins_the_rate_within_5_percent() {
        let t0 = Instant::now();
        let mut m = RateModel::default();
        let mut s = Nginx::new(50.0, 20);
        let t = drive(&mut m, &mut s, t0, Duration::from_millis(5), 100);
        // A cooldown of 1 s, then at 80 per second until refused.
        let gap = Duration::from_micros(12_500);
        drive(&mut m, &mut s, t + Duration::from_secs(1), gap, 1000);
        assert_eq!(m.episodes, 2);
        let f = m.fit.unwrap();
        assert!(f.pinned(), "{f:?}");
        let pace = m.pace.unwrap();
        assert!((pace.rate - 50.0).abs() <= 2.5, "{pace:?} {f:?}");
        assert!((19..=21).contains(&pace.burst), "{pace:?}");
    }

    #[test]
    fn one_update_per_episode() {
        let t0 = Instant::now();
        let mut m = RateModel::default();
        let mut s = Nginx::new(10.0, 2);
        // 10 sends at once: 3 admitted, 7 refused together, all answered after the last send.
        let seqs: Vec<(u64, bool)> = (0..10).map(|_| (m.sent(t0), s.arrive(t0))).collect();
        let later = t0 + Duration::from_millis(1);
        let updates = seqs
            .iter()
            .filter_map(|&(q, ok)| {
                let seen = if ok { Seen::Admitted } else { Seen::Refused };
                m.answered(q, seen, later)
            })
            .count();
        assert_eq!(updates, 1);
        assert_eq!(m.episodes, 1);
        // A send made after the reaction and refused is a new episode.
        let t1 = later + Duration::from_millis(1);
        let q = m.sent(t1);
        assert!(!s.arrive(t1));
        assert!(m.answered(q, Seen::Refused, t1).is_some());
        assert_eq!(m.episodes, 2);
    }

    #[test]
    fn probing_upward_after_a_clean_period() {
        let t0 = Instant::now();
        let mut m = RateModel::warm(Bucket {
            rate: 10.0,
            burst: 3,
        });
        let clean = Duration::from_secs(30);
        assert_eq!(m.probe_up(t0, clean), None, "nothing sent yet");
        m.sent(t0);
        assert_eq!(m.probe_up(t0, clean), None);
        assert_eq!(m.probe_up(t0 + Duration::from_secs(29), clean), None);
        let up = m.probe_up(t0 + clean, clean).unwrap();
        assert!((up.rate - 11.0).abs() < 1e-9);
        assert_eq!(up.burst, 3);
    }

    #[test]
    fn an_unpinned_pace_is_held_until_sending_at_it_proves_it() {
        let t0 = Instant::now();
        let mut m = RateModel::default();
        let mut s = Nginx::new(50.0, 20);
        // A burst from idle: 21 admitted, the rest refused together; the rate is not pinned.
        let seqs: Vec<(u64, bool)> = (0..30).map(|_| (m.sent(t0), s.arrive(t0))).collect();
        let answered = t0 + Duration::from_millis(50);
        for &(q, ok) in &seqs {
            let seen = if ok { Seen::Admitted } else { Seen::Refused };
            m.answered(q, seen, answered);
        }
        let pace = m.pace.unwrap();
        assert!(!m.fit.unwrap().pinned());
        // A cooldown of 1 s sends nothing: the first send after it starts the clean period.
        let after = t0 + Duration::from_secs(1);
        assert_eq!(
            m.probe_up(after, Duration::ZERO),
            None,
            "nothing sent at the pace"
        );
        m.sent(after);
        assert_eq!(m.probe_up(after, Duration::ZERO), None);
        // Held for the time 4 of the largest bursts take at the pace (21 cells at most).
        let hold = Duration::from_secs_f64(4.0 * 21.0 / pace.rate);
        let early = after + hold.mul_f64(0.9);
        assert_eq!(m.probe_up(early, Duration::ZERO), None);
        let up = m
            .probe_up(after + hold.mul_f64(1.1), Duration::ZERO)
            .unwrap();
        assert!((up.rate / pace.rate - 1.1).abs() < 1e-9);
    }

    #[test]
    fn a_window_starts_after_the_latest_idle_time_as_long_as_it() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut m = RateModel::default();
        // 2 at 0 s, a minute idle, 3 at 60 s and 1 at 61 s admitted, 1 at 61 s refused.
        let at = [s(0), s(0), s(60), s(60), s(60), s(61), s(61)];
        let seqs: Vec<u64> = at.iter().map(|&d| m.sent(t0 + d)).collect();
        assert_eq!(m.window_from(7, t0 + s(63)), None, "unanswered");
        for &q in &seqs[..6] {
            m.answered(q, Seen::Admitted, t0 + s(61));
        }
        m.answered(seqs[6], Seen::Refused, t0 + s(61));
        // Reset at 63 s: a 3 s window from 60 s (idle 60 s before it); the send at 61 s
        // followed an idle time of 1 s, shorter than the 2 s window it would start.
        assert_eq!(m.window_from(7, t0 + s(63)), Some(Some((t0 + s(60), 4))));
        // Reset at 125 s: a window from 60 s would be 65 s, longer than the idle time before
        // it: the window starts at the first send.
        assert_eq!(m.window_from(7, t0 + s(125)), Some(Some((t0, 6))));
    }

    #[test]
    fn answers_for_sends_no_longer_logged_are_ignored() {
        let t0 = Instant::now();
        let mut m = RateModel::default();
        let first = m.sent(t0);
        for _ in 0..LOG_LEN {
            m.sent(t0);
        }
        assert_eq!(m.answered(first, Seen::Refused, t0), None);
        assert_eq!(m.episodes, 0);
        assert_eq!(m.answered(u64::MAX, Seen::Refused, t0), None);
    }
}
