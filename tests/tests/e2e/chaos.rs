//! The chaos run in the suite (issue 16): at least 10 faults on a real 3-server cluster, every
//! answer checked against the bus after each (see `tests::chaos`). `scripts/chaos` runs the
//! long one. `CHAOS_SEED` replays a schedule; `CHAOS_FAULTS` sets how many faults. Its cluster
//! takes `tests::heavy` itself: taking it here as well would wait on itself for ever.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_equal_the_bus_after_every_fault_of_a_seeded_schedule() {
    let seed = std::env::var("CHAOS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(16);
    let faults = std::env::var("CHAOS_FAULTS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let report = tests::chaos::run(seed, faults).await;
    report.print();
    assert_eq!(report.faults.values().sum::<u32>(), faults);
    assert_eq!(report.settle_times.len() as u32, faults, "a quiet period after every fault");
    assert!(report.acked_writes > 0 && report.answers > 0, "writers and requesters ran: {report:?}");
}
