//! Pure retry policy: backoff, jitter, safe-to-resend rules and the retry decision.
//!
//! Nothing here sleeps, sends or reads a clock: every function takes what it needs as values
//! (and jitter takes an RNG), so each rule is tested without HTTP.

mod backoff;
mod budget;
mod decide;
mod resend;

pub use backoff::{Backoff, Jitter, MAX_ADDED_JITTER};
pub(crate) use budget::BudgetLedger;
pub use budget::RetryBudget;
pub(crate) use decide::{cooldown, is_refusal};
pub use decide::{Decision, Outcome, RequestFacts, RetryPolicy, StopReason};
pub use resend::{has_idempotency_key, is_idempotent, may_resend_after_failure};
