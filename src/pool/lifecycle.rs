//! Starting and ending pool workers.
//!
//! * A database's pool is started by the first statement there whose plan has a
//!   Gather for the pool ([`ensure_pool`]), and ahead of any statement for
//!   `pg_stride.database` by the groups worker while `parallel_mode` is `pool`
//!   ([`prestart`]).
//! * Its size is bounded by pg_stride_sched::pool::caps: the pool never takes the
//!   background-worker slots that PostgreSQL's own parallel workers, logical
//!   replication and other databases' pools need.
//! * Commands that need a database nobody is connected to (DROP, RENAME, SET
//!   TABLESPACE, CREATE DATABASE … TEMPLATE) must not fail because of its pool, and a
//!   command that fails its permission check must not touch it. PostgreSQL waits up to
//!   5 s for the other backends of such a database to leave and sends SIGTERM to its
//!   autovacuum workers, after its own checks (`CountOtherDBBackends`): an idle pool
//!   worker shows itself to that check as an autovacuum worker
//!   ([`crate::pg::show_as_autovacuum`]). DROP
//!   DATABASE … WITH (FORCE) first terminates every backend of the database, pool
//!   workers included, and refuses to if the caller may not signal them; its drop
//!   hook, which runs right after the ownership check, releases the pool first
//!   ([`release_database`]).

use super::shared::{PoolShared, Slot, State};
use crate::{gucs, parallel};
use pg_stride_sched::pool::caps::{pool_caps, PoolCaps};
use pgrx::pg_sys;
use std::ffi::c_char;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The (sub)transaction in which this backend marked a database as closing
/// ([`mark_closing`]), its outermost if several; 0: none.
static MARKED_IN: AtomicU32 = AtomicU32::new(0);

/// A slot STARTING for longer than this was never started by the postmaster.
const START_TIMEOUT_MS: i64 = 10_000;

/// pg_stride's own static background workers (scheduler, groups loader, tuner).
const STATIC_WORKERS: u32 = 3;

/// The caps in force, from the server's settings as the scheduler worker last read
/// them ([`publish_server_settings`]), or this process's own before it did.
pub fn caps() -> PoolCaps {
    let pool = super::shared::shared();
    // A published value is stored plus one: 0 (zeroed shared memory) is none yet.
    let published = |field: fn(&PoolShared) -> &AtomicI32| {
        pool.and_then(|p| u32::try_from(field(p).load(Ordering::Acquire) - 1).ok())
    };
    // SAFETY: plain reads of PostgreSQL's settings.
    let (processes, own_parallel) =
        unsafe { (pg_sys::max_worker_processes, pg_sys::max_parallel_workers) };
    let parallel = published(|p| &p.server_parallel_workers).unwrap_or(own_parallel.max(0) as u32);
    let size = published(|p| &p.server_pool_size).unwrap_or(super::settings::pool_size() as u32);
    pool_caps(processes.max(0) as u32, parallel, STATIC_WORKERS, size)
}

/// Records the server's `max_parallel_workers` and pool size for [`caps`], which every
/// process then computes alike: `max_parallel_workers` is a user setting that a session
/// (or a role, or a database) may set otherwise, and a backend in a long statement, or a
/// pool worker, applies a reload of `pool_size` only later. The scheduler worker calls
/// it at its start and after each reload: connected to no database, it reads the
/// configuration files' values alone.
pub fn publish_server_settings() {
    if let Some(pool) = super::shared::shared() {
        // SAFETY: a plain read of PostgreSQL's setting.
        let parallel = unsafe { pg_sys::max_parallel_workers };
        pool.server_parallel_workers
            .store(parallel.saturating_add(1), Ordering::Release);
        let size = i32::try_from(super::settings::pool_size()).unwrap_or(i32::MAX);
        pool.server_pool_size
            .store(size.saturating_add(1), Ordering::Release);
    }
}

/// Starts pool workers for `database` up to its cap (counting those starting or
/// running); reclaims slots whose worker never started.
pub fn ensure_pool(pool: &PoolShared, database: pg_sys::Oid) {
    start_workers(pool, database, caps());
}

/// [`ensure_pool`] with `caps`. None for a database being dropped.
fn start_workers(pool: &PoolShared, database: pg_sys::Oid, caps: PoolCaps) {
    if pool.is_closing(database) {
        return;
    }
    let database = u32::from(database);
    let now = super::shared::now_ms();
    let (mut in_db, mut in_server) = (0u32, 0u32);
    // Pool workers per other database: (database, count).
    let mut others: Vec<(u32, u32)> = Vec::new();
    for slot in &pool.slots {
        let (g, s) = slot.load();
        if s == State::Free {
            continue;
        }
        if s == State::Starting
            && now - slot.starting_since_ms.load(Ordering::Acquire) > START_TIMEOUT_MS
        {
            slot.cas((g, State::Starting), (g + 1, State::Free));
            continue;
        }
        in_server += 1;
        let owner = slot.database.load(Ordering::Acquire);
        if owner == database {
            in_db += 1;
        } else if let Some(other) = others.iter_mut().find(|(d, _)| *d == owner) {
            other.1 += 1;
        } else {
            others.push((owner, 1));
        }
    }
    if in_server >= caps.server && in_db < caps.shared {
        make_room(pool, &others, caps.shared);
    }
    for (index, slot) in pool.slots.iter().enumerate() {
        if !caps.may_start(in_db, in_server, others.len() as u32) {
            break;
        }
        let (g, s) = slot.load();
        if s != State::Free || !slot.cas((g, State::Free), (g, State::Starting)) {
            continue;
        }
        slot.database.store(database, Ordering::Release);
        slot.starting_since_ms.store(now, Ordering::Release);
        slot.retire.store(false, Ordering::Release);
        slot.system_user_set.store(false, Ordering::Release);
        for user in &slot.served {
            user.store(pg_sys::InvalidOid.into(), Ordering::Release);
        }
        // What pg_stride.pool shows of a worker is its own, not the slot's last one's.
        slot.fragments.store(0, Ordering::Release);
        slot.errors.store(0, Ordering::Release);
        slot.last_setup_ns.store(0, Ordering::Release);
        slot.leader_pid.store(0, Ordering::Release);
        if spawn(index, database.into(), g) {
            in_db += 1;
            in_server += 1;
        } else {
            slot.cas((g, State::Starting), (g, State::Free));
            break;
        }
    }
}

/// The pool is at its server-wide cap and this database has less than its share:
/// the database with the most pool workers above its share retires one of its idle
/// ones (it exits at its next wake-up, and a later Gather here starts one). Without
/// this, a database whose pool started first (pg_stride.database's, with the server)
/// would keep every pool worker until its idle timeout.
fn make_room(pool: &PoolShared, others: &[(u32, u32)], share: u32) {
    let Some(&(richest, _)) = others
        .iter()
        .filter(|&&(_, n)| n > share)
        .max_by_key(|&&(_, n)| n)
    else {
        return;
    };
    let idle = pool.slots.iter().find(|slot| {
        slot.load().1 == State::Idle
            && slot.database.load(Ordering::Acquire) == richest
            && !slot.retire.load(Ordering::Acquire)
    });
    if let Some(slot) = idle {
        slot.retire.store(true, Ordering::Release);
        super::shared::set_latch_of(slot.procno.load(Ordering::Acquire));
    }
}

/// Whether the caller may terminate the leader that the busy worker of `slot` serves:
/// yes if that leader is gone. A slot just reserved may still name its previous
/// leader, as an idle one that a leader reserves meanwhile is ended all the same.
fn leader_may_be_ended(slot: &Slot) -> bool {
    let leader_pid = slot.leader_pid.load(Ordering::Relaxed);
    match usize::try_from(slot.t_leader_procno.load(Ordering::Relaxed)) {
        Ok(procno) if crate::pg::proc_pid(procno) == leader_pid => {
            crate::pg::may_terminate_backend_of(crate::pg::proc_role(procno))
        }
        _ => true,
    }
}

/// Whether the pool worker in slot `index`, of `database`, is above the caps in force
/// (lowered by a reload since it started, or started by a process that had not seen the
/// reload yet): it then retires, as the lowest slots of its database stay
/// ([`PoolCaps::keeps`]); those already leaving do not count.
pub fn above_caps(pool: &PoolShared, index: usize, database: pg_sys::Oid) -> bool {
    let database = u32::from(database);
    let rank = pool.slots[..index]
        .iter()
        .filter(|slot| {
            !matches!(slot.load().1, State::Free | State::Retiring)
                && !slot.retire.load(Ordering::Acquire)
                && slot.database.load(Ordering::Acquire) == database
        })
        .count();
    !caps().keeps(rank as u32)
}

/// Starts the pool of the database this process is connected to, up to a database's
/// share of the caps, if `parallel_mode` is `pool` for the whole server: the first
/// Gathers there then find idle workers instead of falling back while the pool starts.
/// Called by the groups worker, which is connected to `pg_stride.database`, at its start
/// and after each reload.
pub fn prestart() {
    if let Some(pool) = super::shared::shared().filter(|_| parallel::pool_mode() && gucs::enabled())
    {
        // Only a database's share while others may come: the workers of a pool nobody
        // uses yet would otherwise hold the whole cap until their idle timeout.
        let caps = caps();
        let share = PoolCaps {
            alone: caps.shared,
            ..caps
        };
        // SAFETY: a global set at connection.
        start_workers(pool, unsafe { pg_sys::MyDatabaseId }, share);
    }
}

fn spawn(index: usize, database: pg_sys::Oid, gen: u64) -> bool {
    fn copy(dst: &mut [c_char], src: &str) {
        for (d, b) in dst.iter_mut().zip(src.bytes().chain(std::iter::once(0))) {
            *d = b as c_char;
        }
    }
    // SAFETY: a zeroed BackgroundWorker is valid; RegisterDynamicBackgroundWorker copies
    // it into shared memory.
    unsafe {
        let mut w: pg_sys::BackgroundWorker = std::mem::zeroed();
        w.bgw_flags =
            (pg_sys::BGWORKER_SHMEM_ACCESS | pg_sys::BGWORKER_BACKEND_DATABASE_CONNECTION) as i32;
        w.bgw_start_time = pg_sys::BgWorkerStartTime::BgWorkerStart_ConsistentState;
        w.bgw_restart_time = pg_sys::BGW_NEVER_RESTART;
        copy(&mut w.bgw_library_name, "pg_stride");
        copy(&mut w.bgw_function_name, "pg_stride_pool_main");
        copy(&mut w.bgw_name, &format!("pg_stride pool worker {index}"));
        copy(&mut w.bgw_type, "pg_stride pool");
        w.bgw_main_arg = pg_sys::Datum::from(index);
        let extra = w.bgw_extra.as_mut_ptr();
        std::ptr::write_unaligned(extra.cast::<u32>(), u32::from(database));
        std::ptr::write_unaligned(extra.add(8).cast::<u64>(), gen);
        w.bgw_notify_pid = 0;
        let mut handle = std::ptr::null_mut();
        pg_sys::RegisterDynamicBackgroundWorker(&mut w, &mut handle)
    }
}

/// Terminates the pool workers connected to `database` that serve no leader and, for a
/// drop `WITH (FORCE)` (`forced`), those serving a leader the caller may terminate, as
/// FORCE will terminate the leader (between fragments a worker's PGPROC shows no role,
/// which FORCE would refuse to end); then waits up to 5 s until they are gone. Called
/// from DROP DATABASE's drop hook, after the ownership check but before PostgreSQL's
/// other checks, which may still refuse the drop. Any other worker running a fragment
/// is left to its leader, a session of that database: PostgreSQL refuses the drop while
/// it is connected or, with FORCE, ends it if the caller may; the worker, idle again
/// and shown as autovacuum, is then ended with the database's autovacuum workers.
pub fn release_database(database: pg_sys::Oid, forced: bool) {
    let Some(pool) = super::shared::shared() else {
        return;
    };
    let ours = |slot: &&Slot| slot.database.load(Ordering::Acquire) == u32::from(database);
    let mut ended = Vec::new();
    let mut raced = false;
    for slot in pool.slots.iter().filter(ours) {
        let Some(end) = release(slot, forced, &mut raced) else {
            continue;
        };
        if end {
            let pid = slot.pid.load(Ordering::Acquire);
            if pid > 0 {
                // SAFETY: SIGTERM to our own worker: it exits at its next interrupt check.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
        }
        ended.push(slot);
    }
    // From here on, PostgreSQL's wait terminates the database's idle pool workers as
    // autovacuum workers. It looks at whether each shows itself as one, and signals it
    // later: a worker that took a ticket in between would die under its fragment. So no
    // worker of the database takes a fragment until this command's transaction ends
    // (worker.rs declines one it took already), and no leader posts one.
    mark_closing(database);
    if ended.is_empty() {
        return;
    }
    crate::pg::wait_until(
        || {
            ended.iter().all(|slot| {
                slot.load().1 == State::Free
                    || slot.database.load(Ordering::Acquire) != u32::from(database)
            })
        },
        Some(Instant::now() + Duration::from_secs(5)),
    );
}

/// Whether the pool may run fragments in `database` now or soon: in pool mode, or with
/// workers of the database left from it.
pub fn may_serve(database: pg_sys::Oid) -> bool {
    super::shared::shared().is_some_and(|pool| {
        parallel::pool_mode()
            || pool.slots.iter().any(|slot| {
                slot.load().1 != State::Free
                    && slot.database.load(Ordering::Acquire) == u32::from(database)
            })
    })
}

/// Marks `database` as closing until [`unmark_closing`]: its pool takes no fragment (see
/// [`release_database`]). For a command that needs the database without other backends
/// and passed the permission checks on it.
pub fn mark_closing(database: pg_sys::Oid) {
    if let (Some(pool), Some(procno)) = (super::shared::shared(), own_procno()) {
        if pool.mark_closing(database, procno) {
            let here = crate::pg::current_subtransaction().max(1);
            let marked_in = MARKED_IN.load(Ordering::Relaxed);
            if marked_in == 0 || here < marked_in {
                MARKED_IN.store(here, Ordering::Relaxed);
            }
        } else {
            pgrx::log!(
                "pg_stride: {} database commands wait at once: the pool of database {} is not \
                 held back, and PostgreSQL may terminate its workers under a fragment",
                super::shared::CLOSING_COMMANDS,
                u32::from(database)
            );
        }
    }
}

/// Subtransaction `subid` aborted: a mark made inside it goes (the command that made
/// it failed there).
pub fn subtransaction_aborted(subid: pg_sys::SubTransactionId) {
    if MARKED_IN.load(Ordering::Relaxed) >= subid {
        unmark_closing();
    }
}

/// The command that marked a database as closing returned, or its transaction ended.
pub fn unmark_closing() {
    if MARKED_IN.swap(0, Ordering::Relaxed) != 0 {
        if let (Some(pool), Some(procno)) = (super::shared::shared(), own_procno()) {
            pool.unmark_closing(procno);
        }
    }
}

/// This backend's procno, which names its marks.
fn own_procno() -> Option<u32> {
    crate::pg::my_procno().and_then(|n| u32::try_from(n).ok())
}

/// Makes the pool worker of `slot` leave for [`release_database`]: Some(true) if it is
/// to be terminated now, Some(false) if it leaves by itself, None if the drop need not
/// wait for it. An idle or connecting worker is taken to RETIRING with a
/// compare-and-swap before it is signalled: leaders reserve idle slots only, so a
/// worker that a leader reserved after a look at its state (and before a signal) is
/// never terminated under that leader's fragment. One still starting is not waited for:
/// it has not begun to connect, and cannot get past the lock the command holds on the
/// database until the command ends, so PostgreSQL's wait for the database's backends
/// does not see it; it fails to connect after a drop, and retires at its first idle
/// look after a refused one.
/// `raced`: a test build's fault has held up a look at an idle worker already.
fn release(slot: &Slot, forced: bool, raced: &mut bool) -> Option<bool> {
    loop {
        let (gen, state) = slot.load();
        match state {
            State::Free => return None,
            State::Starting => {
                slot.retire.store(true, Ordering::Release);
                return None;
            }
            State::Retiring => return Some(false),
            State::Connecting | State::Idle => {
                if state == State::Idle && !*raced && crate::pg::test_fault("pool_release_race") {
                    *raced = true;
                    race_a_leader(slot, gen);
                }
                if slot.cas((gen, state), (gen, State::Retiring)) {
                    return Some(true);
                }
            }
            _ if forced && leader_may_be_ended(slot) => {
                slot.retire.store(true, Ordering::Release);
                return Some(true);
            }
            // A reserved or busy worker: its leader is a session of this database. If
            // the drop goes through, that session was ended first, and the worker is
            // ended as an autovacuum worker once idle again; if not, the pool serves on.
            _ => return None,
        }
    }
}

/// A test build's fault: after a look at the idle worker of `slot` (ticket generation
/// `gen`), waits until a leader has reserved it and its fragment runs (at most a
/// second), and logs what the release then finds.
fn race_a_leader(slot: &Slot, gen: u64) {
    pgrx::log!(
        "pg_stride: test fault pool_release_race: waiting for a leader to take an idle pool worker"
    );
    let deadline = Instant::now() + Duration::from_secs(1);
    while slot.load().1 != State::Running && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let now = slot.load();
    let taken = if now.0 != gen && now.1 == State::Running {
        "running a leader's fragment"
    } else {
        "not taken"
    };
    pgrx::log!(
        "pg_stride: test fault pool_release_race: the idle pool worker looked at is {taken}"
    );
}
