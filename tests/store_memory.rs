//! The `Store` conformance suite (tests/store_conformance) run against `MemoryStore`.

mod store_conformance;

store_conformance!(
    reqwest_throttle::store::MemoryStore,
    ignore {
        admit_future_dropped_unpolled_charges_nothing:
            "store bug: MemoryStore::admit admits when called, not when polled, so a future \
         dropped unpolled keeps its lease (never released) and its quota charge",
        prop_admit_futures_dropped_unpolled:
            "store bug: MemoryStore::admit admits when called, not when polled \
         (see admit_future_dropped_unpolled_charges_nothing)",
        refusal_by_a_later_bucket_charges_no_earlier_bucket:
            "store bug: with several token buckets, an attempt refused by a later bucket keeps \
         the cells it took from earlier ones (Quotas::carried), against all or nothing",
        idle_again_after_an_attempt_refused_by_a_later_bucket:
            "store bug: cells carried from an abandoned multi-bucket attempt (Quotas::carried) \
         keep is_idle false forever, so the scope is never forgotten",
    }
);
