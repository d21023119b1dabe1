//! Running a real `nats-server` for end-to-end tests.
