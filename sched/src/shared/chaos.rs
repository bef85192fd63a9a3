//! Race widening. The lock-free protocol has windows of a few instructions between its
//! steps where another process may act; a real preemption there is rare. In this crate's
//! unit-test build, [`point`] yields the thread at random at those places, so the stress
//! test runs through the unlucky interleavings thousands of times. In every other build
//! it is empty and inlined away.

/// A place in the protocol where a concurrent process may act.
#[cfg(not(test))]
#[inline(always)]
pub(crate) fn point() {}

/// A place in the protocol where a concurrent process may act: yields one time in 16.
#[cfg(test)]
pub(crate) fn point() {
    use std::cell::Cell;
    thread_local!(static STATE: Cell<u32> = const { Cell::new(0x2545_F491) });
    let yield_now = STATE.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        s.set(x);
        x % 16 == 0
    });
    if yield_now {
        std::thread::yield_now();
    }
}
