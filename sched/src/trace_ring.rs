//! A fixed-size ring of fixed-size records in shared memory, written by many processes
//! without a lock and read by one (the tuner, docs/design.md §9).
//!
//! Every record gets a ticket `n` from one `fetch_add` on the head; it goes to slot
//! `n % capacity`. Each slot carries a sequence word that says which ticket it holds and
//! whether that ticket is complete: `2n + 1` while ticket `n` is being written, `2n + 2`
//! once it is. A writer claims its slot by compare-and-swap from a complete, older
//! ticket, so two writers never write one slot at once: the one that loses (a ring so
//! short that the head went round while a record was being written) drops its record and
//! counts it lost. A reader asks for a ticket, copies the words and checks that the
//! sequence word said "ticket n, complete" before and after the copy (a seqlock): a
//! record overwritten or still being written is reported as such, never returned torn.
//!
//! Like [`SchedShared`](crate::SchedShared) the ring holds only integers and atomics, so
//! it can live in PostgreSQL's shared memory and be used from every process.

use std::alloc::{self, Layout};
use std::mem::size_of;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU64, Ordering::*};

/// Words of one record; with its sequence word a slot takes 160 bytes, 192 with its
/// alignment (three cache lines).
pub const RECORD_WORDS: usize = 19;

/// One record's payload.
pub type Words = [u64; RECORD_WORDS];

const MAGIC: u64 = 0x7374_7269_6465_7472; // "stridetr"
const ALIGN: usize = 64;

/// Why [`TraceRing::read`] has no record for a ticket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Missing {
    /// The ticket has not been handed out yet.
    NotYetWritten,
    /// The ticket's writer has not finished, or dropped its record (see [`TraceRing::lost`]).
    Incomplete,
    /// A later ticket has taken the slot.
    Overwritten,
}

/// Why [`TraceRing::init_in`] or [`TraceRing::attach`] failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingError {
    /// The capacity is zero.
    BadCapacity,
    /// No initialised ring at that address.
    NotInitialized,
}

impl std::fmt::Display for RingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RingError::BadCapacity => "trace ring capacity is zero",
            RingError::NotInitialized => "trace ring not initialised",
        })
    }
}

#[repr(C, align(64))]
struct Slot {
    seq: AtomicU64,
    words: [AtomicU64; RECORD_WORDS],
}

/// The ring's header; the slots follow it in the same region.
#[repr(C, align(64))]
pub struct TraceRing {
    magic: AtomicU64,
    capacity: u64,
    /// Next ticket to hand out.
    head: AtomicU64,
    /// Records dropped because their slot was still being written.
    lost: AtomicU64,
}

impl TraceRing {
    /// Bytes a ring of `capacity` records needs, alignment slack included.
    pub fn region_size(capacity: u32) -> usize {
        size_of::<TraceRing>() + capacity as usize * size_of::<Slot>() + ALIGN - 1
    }

    /// Initialises a ring in `ptr` and returns it. Call once, in one process, before any
    /// other attaches.
    ///
    /// # Safety
    /// `ptr` must point to at least [`TraceRing::region_size`]`(capacity)` writable bytes
    /// that stay mapped for the rest of the process's life and that nothing else uses.
    pub unsafe fn init_in(ptr: *mut u8, capacity: u32) -> Result<&'static TraceRing, RingError> {
        if capacity == 0 {
            return Err(RingError::BadCapacity);
        }
        let header = align_up(ptr) as *mut TraceRing;
        // SAFETY: the caller gives region_size(capacity) bytes, which cover the aligned
        // header and the slots after it; all-zero bytes are valid atomics, and a zero
        // sequence word means "no ticket" (tickets start at sequence 1).
        let ring: &'static TraceRing = unsafe {
            std::ptr::write_bytes(
                header as *mut u8,
                0,
                size_of::<TraceRing>() + capacity as usize * size_of::<Slot>(),
            );
            (*header).capacity = capacity as u64;
            &*header
        };
        ring.magic.store(MAGIC, Release);
        Ok(ring)
    }

    /// Attaches to a ring that [`TraceRing::init_in`] initialised at `ptr`.
    ///
    /// # Safety
    /// `ptr` must be the pointer given to `init_in` (or the same memory mapped again) and
    /// stay mapped for the rest of the process's life.
    pub unsafe fn attach(ptr: *mut u8) -> Result<&'static TraceRing, RingError> {
        // SAFETY: the caller's promise: init_in placed a ring here that stays mapped.
        let ring: &'static TraceRing = unsafe { &*(align_up(ptr) as *const TraceRing) };
        if ring.magic.load(Acquire) != MAGIC {
            return Err(RingError::NotInitialized);
        }
        Ok(ring)
    }

    /// Records the ring can hold.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The next ticket to be handed out: tickets below it have been handed out.
    pub fn head(&self) -> u64 {
        self.head.load(Acquire)
    }

    /// Records dropped by writers that found their slot still being written.
    pub fn lost(&self) -> u64 {
        self.lost.load(Relaxed)
    }

    fn slot(&self, ticket: u64) -> &Slot {
        let index = (ticket % self.capacity) as usize;
        // SAFETY: init_in sized the region for `capacity` slots right after the header,
        // and index < capacity.
        unsafe { &*(self as *const TraceRing).add(1).cast::<Slot>().add(index) }
    }

    /// Appends a record and returns its ticket, or `None` if it was dropped.
    pub fn push(&self, words: &Words) -> Option<u64> {
        let ticket = self.head.fetch_add(1, AcqRel);
        let slot = self.slot(ticket);
        let writing = 2 * ticket + 1;
        let current = slot.seq.load(Acquire);
        // Claim the slot only from a complete, older ticket (or none): a writer of an
        // older ticket still at work, or of a newer one, keeps it.
        if current % 2 == 1
            || current >= writing
            || slot
                .seq
                .compare_exchange(current, writing, AcqRel, Acquire)
                .is_err()
        {
            self.lost.fetch_add(1, Relaxed);
            return None;
        }
        // The odd sequence word must be visible before any word of the new record: a
        // reader that copies one of them then sees the slot change (the seqlock pairing
        // with the reader's acquire fence).
        fence(Release);
        for (to, from) in slot.words.iter().zip(words) {
            to.store(*from, Relaxed);
        }
        slot.seq.store(writing + 1, Release);
        Some(ticket)
    }

    /// The record of `ticket`, if the ring still holds it complete.
    pub fn read(&self, ticket: u64) -> Result<Words, Missing> {
        if ticket >= self.head() {
            return Err(Missing::NotYetWritten);
        }
        let slot = self.slot(ticket);
        let complete = 2 * ticket + 2;
        let before = slot.seq.load(Acquire);
        if before != complete {
            return Err(if before > complete {
                Missing::Overwritten
            } else {
                Missing::Incomplete
            });
        }
        let mut words = [0; RECORD_WORDS];
        for (to, from) in words.iter_mut().zip(&slot.words) {
            *to = from.load(Relaxed);
        }
        // The copy must not be reordered after the second look at the sequence word.
        fence(Acquire);
        if slot.seq.load(Relaxed) != complete {
            return Err(Missing::Overwritten);
        }
        Ok(words)
    }
}

fn align_up(ptr: *mut u8) -> *mut u8 {
    ptr.wrapping_add(ptr.align_offset(ALIGN))
}

/// A ring on the heap, for tests and the simulator.
pub struct OwnedRing {
    ptr: NonNull<u8>,
    layout: Layout,
    ring: &'static TraceRing,
}

impl OwnedRing {
    /// A zeroed ring of `capacity` records.
    pub fn new(capacity: u32) -> Result<OwnedRing, RingError> {
        let layout = Layout::from_size_align(TraceRing::region_size(capacity), ALIGN)
            .map_err(|_| RingError::BadCapacity)?;
        // SAFETY: the layout has a non-zero size (the header).
        let ptr = NonNull::new(unsafe { alloc::alloc(layout) })
            .unwrap_or_else(|| alloc::handle_alloc_error(layout));
        // SAFETY: `layout` bytes at `ptr`, owned by this value until drop; the reference
        // does not outlive it (Deref borrows self).
        match unsafe { TraceRing::init_in(ptr.as_ptr(), capacity) } {
            Ok(ring) => Ok(OwnedRing { ptr, layout, ring }),
            Err(e) => {
                // SAFETY: allocated above with this layout.
                unsafe { alloc::dealloc(ptr.as_ptr(), layout) };
                Err(e)
            }
        }
    }
}

impl Deref for OwnedRing {
    type Target = TraceRing;
    fn deref(&self) -> &TraceRing {
        self.ring
    }
}

impl Drop for OwnedRing {
    fn drop(&mut self) {
        // SAFETY: allocated in new with this layout; no reference outlives self.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

// SAFETY: the ring is only atomics and an immutable capacity.
unsafe impl Send for OwnedRing {}
// SAFETY: as above.
unsafe impl Sync for OwnedRing {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    fn record(n: u64) -> Words {
        std::array::from_fn(|i| n.rotate_left(i as u32 * 5) ^ (i as u64).wrapping_mul(0x9E37_79B9))
    }

    #[test]
    fn records_come_back_until_overwritten() {
        let ring = OwnedRing::new(4).unwrap();
        assert_eq!(ring.read(0), Err(Missing::NotYetWritten));
        for n in 0..6 {
            assert_eq!(ring.push(&record(n)), Some(n));
        }
        assert_eq!(ring.head(), 6);
        assert_eq!(ring.read(0), Err(Missing::Overwritten));
        assert_eq!(ring.read(1), Err(Missing::Overwritten));
        for n in 2..6 {
            assert_eq!(ring.read(n), Ok(record(n)));
        }
        assert_eq!(ring.read(6), Err(Missing::NotYetWritten));
        assert_eq!(ring.lost(), 0);
    }

    #[test]
    fn a_slot_still_being_written_is_neither_read_nor_taken() {
        let ring = OwnedRing::new(2).unwrap();
        ring.push(&record(0)).unwrap();
        // A writer of ticket 2 claimed slot 0 and has not finished.
        ring.head.store(3, Release);
        ring.slot(2).seq.store(2 * 2 + 1, Release);
        assert_eq!(ring.read(2), Err(Missing::Incomplete));
        assert_eq!(ring.read(0), Err(Missing::Overwritten));
        // Ticket 4 maps to the same slot: it is dropped, not interleaved.
        ring.head.store(4, Release);
        assert_eq!(ring.push(&record(4)), None);
        assert_eq!(ring.lost(), 1);
        assert_eq!(ring.read(2), Err(Missing::Incomplete));
    }

    #[test]
    fn attach_finds_an_initialised_ring_only() {
        let ring = OwnedRing::new(3).unwrap();
        ring.push(&record(1)).unwrap();
        // SAFETY: the pointer init_in was given; the ring outlives the reference's use.
        let again = unsafe { TraceRing::attach(ring.ptr.as_ptr()) }.unwrap();
        assert_eq!(again.read(0), Ok(record(1)));
        let mut blank = vec![0u8; TraceRing::region_size(3)];
        // SAFETY: zeroed bytes of the right size, alive for the call.
        let attached = unsafe { TraceRing::attach(blank.as_mut_ptr()) };
        assert_eq!(attached.err(), Some(RingError::NotInitialized));
        assert_eq!(OwnedRing::new(0).err(), Some(RingError::BadCapacity));
    }

    /// Four writers and a reader race on a small ring: every record read is one that a
    /// writer pushed whole, and every ticket is accounted for as pushed or lost. The
    /// writers go on past their 50,000 records until the reader has read some records
    /// whole (or a minute has passed), so a busy machine that runs the reader late cannot
    /// make the race vanish.
    #[test]
    fn concurrent_readers_never_see_a_torn_record() {
        const WANTED: u64 = 100;
        let ring = Arc::new(OwnedRing::new(8).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(AtomicU64::new(0));
        let start = std::time::Instant::now();
        let writers: Vec<_> = (0..4)
            .map(|_| {
                let (ring, seen) = (Arc::clone(&ring), Arc::clone(&seen));
                std::thread::spawn(move || {
                    let mut pushed = 0u64;
                    let mut i = 0u64;
                    while i < 50_000
                        || (seen.load(Relaxed) < WANTED
                            && start.elapsed() < std::time::Duration::from_secs(60))
                    {
                        // Any payload works: the reader checks consistency, not the ticket.
                        if ring.push(&record(i * 31 + 5)).is_some() {
                            pushed += 1;
                        }
                        i += 1;
                    }
                    pushed
                })
            })
            .collect();
        let reader = {
            let (ring, stop, seen) = (Arc::clone(&ring), Arc::clone(&stop), Arc::clone(&seen));
            std::thread::spawn(move || {
                while !stop.load(Acquire) {
                    let head = ring.head();
                    for ticket in head.saturating_sub(8)..head {
                        if let Ok(words) = ring.read(ticket) {
                            assert_eq!(words, record(words[0]), "torn record at ticket {ticket}");
                            seen.fetch_add(1, Relaxed);
                        }
                    }
                }
            })
        };
        let pushed: u64 = writers.into_iter().map(|w| w.join().unwrap()).sum();
        stop.store(true, Release);
        reader.join().unwrap();
        assert_eq!(pushed + ring.lost(), ring.head());
        assert!(ring.head() >= 200_000);
        assert!(
            seen.load(Relaxed) >= WANTED,
            "the reader read {} records whole",
            seen.load(Relaxed)
        );
        let head = ring.head();
        for ticket in head - 8..head {
            if let Ok(words) = ring.read(ticket) {
                assert_eq!(words, record(words[0]));
            }
        }
    }
}
