//! Which slot holder owns which CPU (`pg_stride.pin_slots`): a fixed array of atomics in
//! the region's header, indexed by the kernel's CPU number, holding the owner's process
//! number + 1 (0 = free), and the CPUs the postmaster may run on, read once when the
//! region is created. Plain atomics, no pointers: valid at any mapping address.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// CPUs that can be owned: kernel CPU numbers 0 to `MAX_CPUS - 1` (the size of glibc's
/// `cpu_set_t`); a CPU numbered beyond is never owned and its processes run unpinned.
pub const MAX_CPUS: usize = 1024;
// A process's pin word (`ProcEntry::pinned_cpu`) names any CPU that can be owned.
const _: () = assert!(MAX_CPUS as u32 - 1 <= pg_stride_sched::pin_word::MAX_CPU);

#[repr(C)]
pub struct CpuOwners {
    owner: [AtomicU32; MAX_CPUS],
    /// The postmaster's CPUs as a bit set: the mask an unpinned process runs with.
    allowed: [AtomicU64; MAX_CPUS / 64],
}

impl CpuOwners {
    /// Initialises the table in place with `allowed` as the CPUs processes may use.
    /// Caller: shared-memory initialisation, in the postmaster.
    ///
    /// # Safety
    /// `at` points to writable, unused memory for a `CpuOwners`.
    pub unsafe fn init(at: *mut CpuOwners, allowed: &[u32]) {
        // SAFETY: the caller's promise; all-zero atomics are valid.
        unsafe {
            at.write(CpuOwners {
                owner: std::array::from_fn(|_| AtomicU32::new(0)),
                allowed: std::array::from_fn(|_| AtomicU64::new(0)),
            });
            for &cpu in allowed.iter().filter(|&&c| (c as usize) < MAX_CPUS) {
                (*at).allowed[cpu as usize / 64].fetch_or(1 << (cpu % 64), Ordering::Relaxed);
            }
        }
    }

    /// The CPUs processes may use, in increasing order.
    pub fn allowed(&self) -> Vec<u32> {
        (0..MAX_CPUS as u32)
            .filter(|&c| self.is_allowed(c))
            .collect()
    }

    /// Whether `cpu` is one processes may use.
    pub fn is_allowed(&self, cpu: u32) -> bool {
        (cpu as usize) < MAX_CPUS
            && self.allowed[cpu as usize / 64].load(Ordering::Relaxed) & (1 << (cpu % 64)) != 0
    }

    /// The owned CPUs with their owners' process numbers. Reads only the allowed CPUs'
    /// entries: a holder asks at every slice end (`pinning::serve_stalled`).
    pub fn owned(&self) -> impl Iterator<Item = (u32, usize)> + '_ {
        self.allowed.iter().enumerate().flat_map(move |(w, word)| {
            let mut bits = word.load(Ordering::Relaxed);
            std::iter::from_fn(move || {
                let bit = (bits != 0).then(|| bits.trailing_zeros())?;
                bits &= bits - 1;
                Some((w * 64) as u32 + bit)
            })
            .filter_map(move |c| Some((c, self.owner(c)?)))
        })
    }

    /// Process number owning `cpu`, if any.
    pub fn owner(&self, cpu: u32) -> Option<usize> {
        let o = self.owner.get(cpu as usize)?.load(Ordering::Acquire);
        (o != 0).then(|| o as usize - 1)
    }

    /// Makes `procno` the owner of `cpu` if it is free; returns whether `procno` owns it
    /// now (it may have already: a swap gives a holder its CPU behind its back).
    pub fn claim(&self, cpu: u32, procno: usize) -> bool {
        self.swap_owner(cpu, None, Some(procno)) || self.owner(cpu) == Some(procno)
    }

    /// Makes `procno` the owner of the first free CPU of `prefer`, else of the first free
    /// one in CPU order; returns it, or `None` when every CPU is owned.
    pub fn claim_free(&self, procno: usize, prefer: &[Option<u32>]) -> Option<u32> {
        if let Some(&cpu) = prefer.iter().flatten().find(|&&c| self.claim(c, procno)) {
            return Some(cpu);
        }
        for (w, word) in self.allowed.iter().enumerate() {
            let mut bits = word.load(Ordering::Relaxed);
            while bits != 0 {
                let cpu = (w * 64) as u32 + bits.trailing_zeros();
                if self.claim(cpu, procno) {
                    return Some(cpu);
                }
                bits &= bits - 1;
            }
        }
        None
    }

    /// Hands `cpu` from `from` to `to` (`None`: frees it) if `from` still owns it;
    /// returns whether it did.
    pub fn pass(&self, cpu: u32, from: usize, to: Option<usize>) -> bool {
        self.swap_owner(cpu, Some(from), to)
    }

    fn swap_owner(&self, cpu: u32, from: Option<usize>, to: Option<usize>) -> bool {
        let enc = |p: Option<usize>| p.map_or(0, |p| p as u32 + 1);
        self.is_allowed(cpu)
            && self.owner[cpu as usize]
                .compare_exchange(enc(from), enc(to), Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }
}
