//! Misbehaviour for test fixtures, compiled in only by the `fixture-*` features: the real
//! component's functions here are empty. The host must survive each of these.

/// Called first by `info` and `compile-registry`, the host's smoke run.
#[inline(always)]
pub fn at_start() {
    #[cfg(feature = "fixture-trap-at-start")]
    core::arch::wasm32::unreachable();
    #[cfg(feature = "fixture-loop-at-start")]
    spin();
    #[cfg(feature = "fixture-alloc-at-start")]
    hoard();
}

/// Called first by `handle`: `{"fixture":"trap"|"loop"|"alloc"}` misbehaves on demand.
#[inline(always)]
pub fn on_request(_request: &[u8]) {
    #[cfg(feature = "fixture-misbehave")]
    match _request {
        br#"{"fixture":"trap"}"# => core::arch::wasm32::unreachable(),
        br#"{"fixture":"loop"}"# => spin(),
        br#"{"fixture":"alloc"}"# => hoard(),
        _ => {}
    }
}

#[allow(dead_code)]
fn spin() {
    let mut n: u64 = 0;
    loop {
        n = std::hint::black_box(n.wrapping_add(1));
    }
}

#[allow(dead_code)]
fn hoard() {
    let mut kept: Vec<Vec<u8>> = Vec::new();
    loop {
        kept.push(vec![1u8; 1 << 20]);
        std::hint::black_box(&kept);
    }
}
