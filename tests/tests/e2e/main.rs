//! End to end: the real host binary against a real `nats-server` (started per test on a free
//! loopback port, with the example accounts config) and the real component. Each module is one
//! behaviour an operator or a node sees; every test starts its own servers and stops them.
//!
//! A new test goes in the module of the behaviour it checks. No test here asserts a duration or
//! a rate (those are benchmarks, `tests/benches`), and a negative check waits on a positive
//! event first. A test that loads both cores for long holds `tests::heavy()` while it runs.

mod accounts;
mod causes;
mod chaos;
mod cli;
mod connect;
mod dashboards;
mod drift;
mod events;
mod fresh;
mod holders;
mod http;
mod http_guard;
mod leaf;
mod operator;
mod overload;
mod plans;
mod reply_cache;
mod requesters;
mod seat;
mod secrets;
mod serve;
mod service;
mod snapshot;
mod state_faults;
mod status;
mod trust;
mod unavailable;
mod upgrade;
mod writers;
