//! When the groups loader tries again a read of its table that failed: 1 s after the
//! first failure, twice as long after each one that follows, at most a minute, so that
//! a table that stays unreadable (a column's type changed by hand) costs a WARNING a
//! minute, not one a second. A newer request (the groups changed again) is tried at
//! once; the request that failed is not tried again before its time, whatever else
//! wakes the loader. Time is passed in.

use std::time::{Duration, Instant};

/// The loader's retry state: nothing while its last read succeeded.
#[derive(Default, Debug)]
pub struct RetryAfterFailure {
    /// The wait before the next try; None while the last read succeeded.
    backoff: Option<Duration>,
    next_try: Option<Instant>,
    /// The request pending when the last read failed.
    failed_request: Option<u64>,
}

impl RetryAfterFailure {
    pub const FIRST: Duration = Duration::from_secs(1);
    pub const LONGEST: Duration = Duration::from_secs(60);

    /// A read that answered `request` (the newest pending when it began) ended at `now`.
    pub fn record(&mut self, now: Instant, read: bool, request: Option<u64>) {
        self.backoff = (!read).then(|| {
            self.backoff
                .map_or(Self::FIRST, |b| (b * 2).min(Self::LONGEST))
        });
        self.next_try = self.backoff.map(|b| now + b);
        self.failed_request = if read { None } else { request };
    }

    /// Whether to read the table at `now`, `pending` being the newest request not
    /// answered yet.
    pub fn should_try(&self, now: Instant, pending: Option<u64>) -> bool {
        match self.next_try {
            None => pending.is_some(),
            Some(at) => now >= at || (pending.is_some() && pending != self.failed_request),
        }
    }

    /// How long the loader may sleep at `now`: until the next try (at least 1 ms), or,
    /// None, until it is woken.
    pub fn wait(&self, now: Instant) -> Option<Duration> {
        self.next_try
            .map(|t| t.saturating_duration_since(now).max(Duration::from_millis(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_success_waits_only_for_requests() {
        let t = Instant::now();
        let mut r = RetryAfterFailure::default();
        r.record(t, true, Some(1));
        assert_eq!(r.wait(t), None);
        assert!(!r.should_try(t + Duration::from_secs(3600), None));
        assert!(r.should_try(t, Some(2)));
    }

    #[test]
    fn failures_back_off_doubling_up_to_a_minute() {
        let mut t = Instant::now();
        let mut r = RetryAfterFailure::default();
        let mut waits = Vec::new();
        for _ in 0..9 {
            r.record(t, false, Some(1));
            let wait = r.wait(t).unwrap();
            waits.push(wait.as_secs());
            // Not before its time, even though the failed request is still pending.
            assert!(!r.should_try(t + wait - MS, Some(1)));
            t += wait;
            assert!(r.should_try(t, Some(1)));
        }
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        r.record(t, true, Some(1));
        r.record(t, false, None);
        assert_eq!(r.wait(t), Some(RetryAfterFailure::FIRST), "a success starts over");
    }

    #[test]
    fn a_newer_request_is_tried_at_once() {
        let t = Instant::now();
        let mut r = RetryAfterFailure::default();
        r.record(t, false, Some(7));
        assert!(!r.should_try(t + MS, Some(7)));
        assert!(r.should_try(t + MS, Some(8)));
        // A failed first read, made with no request pending, is retried in time.
        let mut first = RetryAfterFailure::default();
        first.record(t, false, None);
        assert!(!first.should_try(t + MS, None));
        assert!(first.should_try(t + RetryAfterFailure::FIRST, None));
        assert!(first.should_try(t + MS, Some(1)));
    }

    #[test]
    fn the_wait_is_never_zero() {
        let t = Instant::now();
        let mut r = RetryAfterFailure::default();
        r.record(t, false, None);
        assert_eq!(r.wait(t + Duration::from_secs(5)), Some(MS));
    }
}
