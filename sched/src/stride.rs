//! Fixed-point stride arithmetic (wagner2021 §2.1).
//!
//! A task with priority `p` has stride `S = K / p`; running it for a fraction `f` of a
//! slice advances its pass by `f · S` (non-preemptive charging, `f` may exceed 1). Here
//! the fraction is not formed explicitly: the pass advances by
//! `used_ns · S / 2^CHARGE_SHIFT`, which is `f · S` scaled by the constant
//! `slice_ns / 2^CHARGE_SHIFT`. Passes are only ever compared with each other, so a
//! constant factor shared by every task changes no decision, and the slice length can
//! change at run time without rescaling stored passes.
//!
//! Passes live in `u64` and wrap; they are compared by signed difference
//! ([`pass_before`]), which is exact while the spread of live passes stays below
//! 2^63 — at the lowest priority (1) one second of CPU advances a pass by about 2^50,
//! so a query that runs for hours at priority 1 beside queries of high priority, which
//! keep its group's virtual time almost still, would get there. Each pass is therefore
//! kept within [`MAX_LAG`] of the virtual time it competes at ([`bounded`]): as it is
//! charged, and when it starts waiting. A query that far ahead is last in any case,
//! and one that far behind first.

use std::cmp::Ordering;

/// `K`: the stride of priority 1.
pub const STRIDE_ONE: u64 = 1 << 40;

/// How far a pass may lead or trail its virtual time: a quarter of the range over
/// which signed differences order passes, so that two passes bounded by one virtual
/// time are always ordered right (about 2,000 s of CPU at priority 1).
pub const MAX_LAG: u64 = 1 << 61;

/// `pass` brought within [`MAX_LAG`] of the virtual time `vtime`.
#[inline]
pub fn bounded(pass: u64, vtime: u64) -> u64 {
    let lead = pass.wrapping_sub(vtime) as i64;
    if lead > MAX_LAG as i64 {
        vtime.wrapping_add(MAX_LAG)
    } else if lead < -(MAX_LAG as i64) {
        vtime.wrapping_sub(MAX_LAG)
    } else {
        pass
    }
}

/// Right shift applied to `used_ns · stride` when charging.
pub const CHARGE_SHIFT: u32 = 20;

/// Stride of a task (or group) with priority (or weight, or priority sum) `p`.
/// A zero `p` is treated as 1, the lowest priority there is.
#[inline]
pub fn stride(p: u64) -> u64 {
    STRIDE_ONE / p.max(1)
}

/// Pass increment for `used_ns` of CPU at stride `stride`.
#[inline]
pub fn charge(used_ns: u64, stride: u64) -> u64 {
    ((used_ns as u128 * stride as u128) >> CHARGE_SHIFT) as u64
}

/// Orders two passes that may have wrapped: `a` before `b` when `a - b` is negative.
#[inline]
pub fn pass_cmp(a: u64, b: u64) -> Ordering {
    (a.wrapping_sub(b) as i64).cmp(&0)
}

/// `a` is strictly before `b` in pass order.
#[inline]
pub fn pass_before(a: u64, b: u64) -> bool {
    pass_cmp(a, b) == Ordering::Less
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_keeps_a_pass_within_the_lag_of_its_virtual_time_across_the_wrap() {
        let v = u64::MAX - 5;
        assert_eq!(bounded(v.wrapping_add(10), v), v.wrapping_add(10));
        assert_eq!(bounded(v.wrapping_sub(10), v), v.wrapping_sub(10));
        assert_eq!(
            bounded(v.wrapping_add(MAX_LAG + 1), v),
            v.wrapping_add(MAX_LAG)
        );
        assert_eq!(
            bounded(v.wrapping_sub(MAX_LAG + 1), v),
            v.wrapping_sub(MAX_LAG)
        );
        // A lead past 2^63 reads as a trail: bounded, it is still behind.
        let far = v.wrapping_add((1 << 63) + 1);
        assert!(pass_before(bounded(far, v), v));
    }

    /// Equal up to the rounding of the fixed-point arithmetic.
    fn close(a: u64, b: u64) -> bool {
        a.abs_diff(b) <= 1 + a.max(b) / 1_000_000_000
    }

    #[test]
    fn stride_is_inverse_to_priority() {
        assert_eq!(stride(1), STRIDE_ONE);
        assert_eq!(stride(0), STRIDE_ONE);
        assert_eq!(stride(2) * 2, STRIDE_ONE);
        // Twice the priority: half the pass growth for the same CPU time.
        let slice = 2_000_000;
        assert!(close(
            charge(slice, stride(200)) * 2,
            charge(slice, stride(100))
        ));
    }

    #[test]
    fn charge_is_proportional_to_used_time() {
        let s = stride(10_000);
        // f = 2.5: a slice that overran its target is charged 2.5 times.
        assert!(close(charge(5_000_000, s), charge(2_000_000, s) * 5 / 2));
        assert_eq!(charge(0, s), 0);
    }

    #[test]
    fn pass_order_survives_wrapping() {
        let near_end = u64::MAX - 10;
        let wrapped = near_end.wrapping_add(100);
        assert!(pass_before(near_end, wrapped));
        assert!(!pass_before(wrapped, near_end));
        assert_eq!(pass_cmp(7, 7), Ordering::Equal);
    }
}
