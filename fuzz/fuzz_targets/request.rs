#![no_main]
//! Fuzzes `guest::fuzzing::request`: see that function for the property checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| guest::fuzzing::request(data));
