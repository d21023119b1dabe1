//! What flags of several commands share: how a duration is written, where the state
//! directory is by default.

use std::path::PathBuf;
use std::time::Duration;

/// `$XDG_STATE_HOME/mesh-provisioner`, else `~/.local/state/mesh-provisioner`.
pub fn default_state_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_STATE_HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(x).join("mesh-provisioner");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".local/state/mesh-provisioner"),
        None => PathBuf::from(".mesh-provisioner"),
    }
}

/// `250ms`, `10s`, `30m`, `1h`, `2d`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    // A bare number is seconds, as before units were required.
    let d = match s.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => humantime::parse_duration(s).map_err(|e| format!("{s:?} is not a duration like 250ms, 10s, 30m or 1h: {e}"))?,
    };
    if d.is_zero() {
        return Err("a duration must be more than zero".into());
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_durations_and_refuses_nonsense() {
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert!(parse_duration("0s").is_err());
        assert_eq!(parse_duration("1h 30m").unwrap(), Duration::from_secs(5400));
        assert!(parse_duration("1 fortnight").unwrap_err().contains("not a duration like"));
        assert!(parse_duration("h").is_err());
    }
}
