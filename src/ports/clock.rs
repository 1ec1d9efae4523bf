//! The wall-clock time the ports' records speak: milliseconds since the Unix epoch (the
//! `*_ms` fields of run records, node status and journal rows). One reading of the system
//! clock for every layer that stamps or ages such a record; the domain never reads it (its
//! decisions take `now` from their callers).

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    unix_ms(SystemTime::now())
}

/// `at` in milliseconds since the Unix epoch (0 before it; `u64::MAX` past what fits).
pub fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn times_before_the_epoch_are_zero_and_after_it_count_milliseconds() {
        assert_eq!(unix_ms(UNIX_EPOCH - Duration::from_secs(1)), 0);
        assert_eq!(unix_ms(UNIX_EPOCH + Duration::from_millis(1_500)), 1_500);
    }
}
