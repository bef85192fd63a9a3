//! The word in a process's shared entry that names the CPU it is pinned to
//! (`pg_stride.pin_slots`).
//!
//! Up to three processes may set one process's CPU mask at once: a giver pinning its
//! receiver, a holder swapping CPUs with it, the process itself unpinning. Each sets the
//! mask, then writes the word by compare-and-swap from the value it read before, and
//! sets the mask again if the word changed meanwhile, so that the word names the last
//! mask set. A word that held only the CPU could change and change back between one
//! writer's read and its compare-and-swap (a pin and an unpin by the two others), and
//! the stale writer would then succeed with a mask that is no longer the last. The word
//! therefore also counts its writes.

/// The bits below it hold the CPU (+1; 0 = none), those from it up the write count.
const GENERATION: u32 = 1 << 16;

/// The largest CPU number a word can name.
pub const MAX_CPU: u32 = GENERATION - 2;

/// The CPU that `word` names.
pub fn cpu(word: u32) -> Option<u32> {
    (word % GENERATION).checked_sub(1)
}

/// The word after `word` that names `cpu` (at most [`MAX_CPU`]), one write later; the
/// count wraps after 65 536 writes.
pub fn next(word: u32, cpu: Option<u32>) -> u32 {
    debug_assert!(cpu.is_none_or(|c| c <= MAX_CPU));
    let generation = (word / GENERATION).wrapping_add(1) % GENERATION;
    generation * GENERATION + cpu.map_or(0, |c| c + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_zero_word_names_no_cpu() {
        assert_eq!(cpu(0), None);
        assert_eq!(cpu(next(0, Some(0))), Some(0));
        assert_eq!(cpu(next(0, None)), None);
    }

    #[test]
    fn a_pin_and_an_unpin_do_not_bring_the_word_back() {
        let unpinned = next(next(0, Some(3)), None);
        assert_eq!(cpu(unpinned), None);
        assert_ne!(unpinned, 0);
    }

    #[test]
    fn the_count_wraps_without_touching_the_cpu() {
        let mut word = 0;
        for _ in 0..GENERATION + 5 {
            word = next(word, Some(MAX_CPU));
            assert_eq!(cpu(word), Some(MAX_CPU));
        }
        assert_eq!(word / GENERATION, 5);
    }

    proptest! {
        #[test]
        fn every_write_names_its_cpu_and_changes_the_word(
            word in any::<u32>(), cpu_ in proptest::option::of(0..=MAX_CPU)
        ) {
            let after = next(word, cpu_);
            prop_assert_eq!(cpu(after), cpu_);
            prop_assert_ne!(after, word);
        }
    }
}
