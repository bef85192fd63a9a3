//! Tables a write too small to admit may write (docs/design.md §4 rule 4). A write's
//! plan bounds its work only with what the table itself does for each row kept out:
//! a trigger may run any query, a CHECK constraint, a partition's bound or a stored
//! generated column any function, an index on an expression or with a predicate any
//! immutable function, and access methods other than the heap, B-tree and hash may do
//! deferred work in the writing statement (a GIN index's pending list, a columnar
//! table's stripes). So a table qualifies for a command when it is a plain heap table
//! with no trigger that fires on the command but a foreign key's check of the row
//! written (one index lookup in the referenced table), and, for INSERT and UPDATE, which
//! write rows, not a partition and with none of the others (a DELETE writes no row).
//!
//! The answer comes from the relation cache, which costs more than the rest of the
//! check: it is kept in a small process-local cache, by table, and dropped whenever
//! PostgreSQL invalidates that table's relation-cache entry (CREATE TRIGGER, CREATE
//! INDEX, ALTER TABLE, any change of its pg_class row). PostgreSQL delivers those
//! invalidations when a statement takes its lock on the table, before the executor
//! starts, so the answer is as fresh as the relation cache the executor itself uses: a
//! change that commits while a write runs (CREATE INDEX CONCURRENTLY takes a lock that
//! does not conflict with it) counts from the table's next statement, as it does for
//! the executor.

use crate::backend_local::BackendLocal;
use pgrx::{pg_sys, PgList};
use std::cell::{Cell, RefCell};

/// The commands a cached answer covers, as bits of [`Entry::allowed`].
const INSERT: u8 = 1;
const UPDATE: u8 = 2;
const DELETE: u8 = 4;

#[derive(Clone, Copy)]
struct Entry {
    relid: pg_sys::Oid,
    /// The commands ([`INSERT`], [`UPDATE`], [`DELETE`]) a write too small to admit may
    /// run on the table.
    allowed: u8,
}

/// How many tables the cache holds: each in the place its OID picks (modulo), which a
/// table whose OID picks the same place takes over. An application's tables, created
/// together, have OIDs close to each other, so they rarely share one.
const PLACES: usize = 64;

/// The tables looked at, by place; empty entries have InvalidOid.
struct Cache {
    entries: [Entry; PLACES],
}

const EMPTY: Entry = Entry {
    relid: pg_sys::InvalidOid,
    allowed: 0,
};

static CACHE: BackendLocal<RefCell<Cache>> = BackendLocal::new(RefCell::new(Cache {
    entries: [EMPTY; PLACES],
}));

fn place(relid: pg_sys::Oid) -> usize {
    relid.to_u32() as usize % PLACES
}
/// Counts the invalidations received: an answer worked out while one arrived is used
/// but not kept.
static INVALIDATIONS: BackendLocal<Cell<u64>> = BackendLocal::new(Cell::new(0));
/// Whether the last [`known`] found no answer for its table.
static MISSED: BackendLocal<Cell<bool>> = BackendLocal::new(Cell::new(false));

fn bit(command: pg_sys::CmdType::Type) -> u8 {
    use pg_sys::CmdType::*;
    match command {
        CMD_INSERT => INSERT,
        CMD_UPDATE => UPDATE,
        CMD_DELETE => DELETE,
        _ => 0,
    }
}

/// Whether a write too small to admit may run `command` on table `relid`, from the
/// cache alone: `false` when the table is not in it, which [`missed`] then tells. Plain
/// reads of process-local memory, which cannot panic: asked outside pgrx's error
/// boundary.
pub fn known(relid: pg_sys::Oid, command: pg_sys::CmdType::Type) -> bool {
    let cached = CACHE.try_with_borrow(|cache| {
        let entry = cache.entries[place(relid)];
        (entry.relid == relid).then_some(entry.allowed)
    });
    match cached {
        Some(Some(allowed)) => {
            MISSED.set(false);
            allowed & bit(command) != 0
        }
        _ => {
            MISSED.set(true);
            false
        }
    }
}

/// Whether the last [`known`] found its table missing from the cache, so that the
/// guarded path should ask [`allowed`].
pub fn missed() -> bool {
    MISSED.get()
}

/// Forgets that [`known`] missed: a statement arrives that was not asked about yet.
pub fn forget_miss() {
    MISSED.set(false);
}

/// As [`known`], looking the table up in the relation cache when it is not cached. Call
/// inside a guarded function.
pub fn allowed(relid: pg_sys::Oid, command: pg_sys::CmdType::Type) -> bool {
    if relid == pg_sys::InvalidOid {
        return false;
    }
    if known(relid, command) {
        return true;
    }
    if !MISSED.replace(false) {
        return false;
    }
    let before = INVALIDATIONS.get();
    // SAFETY: a relation-cache lookup in a guarded function (the caller's promise); the
    // statement about to write the table holds a lock on it.
    let allowed = unsafe { commands_allowed(relid) };
    if INVALIDATIONS.get() == before {
        CACHE.with_borrow_mut(|cache| cache.entries[place(relid)] = Entry { relid, allowed });
    }
    allowed & bit(command) != 0
}

/// Registers the invalidation callback. Called once from `_PG_init`, in the postmaster,
/// whose processes inherit it: PostgreSQL keeps a fixed number of callbacks, and
/// registering one past them is FATAL, which ends a server's start rather than a
/// session.
pub fn install() {
    // SAFETY: registers a callback that only clears process-local state.
    unsafe { pg_sys::CacheRegisterRelcacheCallback(Some(invalidated), pg_sys::Datum::from(0)) };
}

/// PostgreSQL invalidated the relation-cache entry of `relid` (of every relation when it
/// is InvalidOid). Cannot panic: called outside pgrx's error boundary; no borrow of the
/// cache is held across a call into PostgreSQL, so this one always succeeds.
unsafe extern "C-unwind" fn invalidated(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    INVALIDATIONS.set(INVALIDATIONS.get().wrapping_add(1));
    CACHE.try_with_borrow_mut(|cache| {
        for e in cache.entries.iter_mut() {
            if relid == pg_sys::InvalidOid || e.relid == relid {
                *e = EMPTY;
            }
        }
    });
}

/// The commands ([`INSERT`], [`UPDATE`], [`DELETE`]) a write too small to admit may run
/// on table `relid` (see the module comment).
///
/// # Safety
/// Called inside a guarded function, by a statement that holds a lock on the table.
unsafe fn commands_allowed(relid: pg_sys::Oid) -> u8 {
    // SAFETY: the caller's promise; a relation opened here is closed before returning,
    // and its fields named here are those of an open relation-cache entry.
    unsafe {
        let rel = pg_sys::RelationIdGetRelation(relid);
        if rel.is_null() {
            return 0;
        }
        let form = (*rel).rd_rel;
        let constraints = (*(*rel).rd_att).constr;
        let mut allowed = 0;
        if (*form).relkind as u8 == pg_sys::RELKIND_RELATION
            && (*form).relam == pg_sys::HEAP_TABLE_AM_OID
        {
            allowed = (INSERT | UPDATE | DELETE) & !fired_triggers((*rel).trigdesc);
            // Constraints, partition bounds, generated columns and indexes are for rows
            // written by INSERT and UPDATE only.
            let checks_rows = (*form).relispartition
                || (!constraints.is_null()
                    && ((*constraints).num_check > 0 || (*constraints).has_generated_stored));
            if checks_rows || ((*form).relhasindex && !plain_indexes(rel)) {
                allowed &= DELETE;
            }
        }
        pg_sys::RelationClose(rel);
        allowed
    }
}

/// The commands for which `triggers` holds a trigger that fires, other than a foreign
/// key's check of the row written.
///
/// # Safety
/// `triggers` is null or an open relation's TriggerDesc.
unsafe fn fired_triggers(triggers: *const pg_sys::TriggerDesc) -> u8 {
    let mut fired = 0;
    // SAFETY: the caller's promise; a TriggerDesc holds `numtriggers` Triggers.
    unsafe {
        let Some(desc) = triggers.as_ref() else {
            return 0;
        };
        let count = usize::try_from(desc.numtriggers).unwrap_or(0);
        for i in 0..count {
            let trigger = &*desc.triggers.add(i);
            let checks_a_key = trigger.tgfoid == pg_sys::Oid::from(pg_sys::F_RI_FKEY_CHECK_INS)
                || trigger.tgfoid == pg_sys::Oid::from(pg_sys::F_RI_FKEY_CHECK_UPD);
            if checks_a_key {
                continue;
            }
            let on = trigger.tgtype as u32;
            if on & pg_sys::TRIGGER_TYPE_INSERT != 0 {
                fired |= INSERT;
            }
            if on & pg_sys::TRIGGER_TYPE_UPDATE != 0 {
                fired |= UPDATE;
            }
            if on & pg_sys::TRIGGER_TYPE_DELETE != 0 {
                fired |= DELETE;
            }
        }
    }
    fired
}

/// Whether every index of `rel` is a B-tree or hash index on columns only, without a
/// predicate.
///
/// # Safety
/// `rel` is an open relation, in a guarded function.
unsafe fn plain_indexes(rel: pg_sys::Relation) -> bool {
    // SAFETY: the caller's promise; RelationGetIndexList gives a copied List of index
    // OIDs, freed here.
    unsafe {
        let list = pg_sys::RelationGetIndexList(rel);
        let plain = PgList::<pg_sys::Oid>::from_pg(list)
            .iter_oid()
            .all(|index| plain_index(index));
        pg_sys::list_free(list);
        plain
    }
}

/// Whether index `index` is a B-tree or hash index on columns only, without a predicate.
///
/// # Safety
/// Called inside a guarded function, by a statement that holds a lock on its table.
unsafe fn plain_index(index: pg_sys::Oid) -> bool {
    // SAFETY: the caller's promise; the index opened here is closed before returning,
    // and its fields named here are those of an open index's relation-cache entry.
    unsafe {
        let rel = pg_sys::RelationIdGetRelation(index);
        if rel.is_null() {
            return false;
        }
        let tuple = (*rel).rd_indextuple;
        let am = (*(*rel).rd_rel).relam;
        let column =
            |attribute: u32| pg_sys::heap_attisnull(tuple, attribute as i32, std::ptr::null_mut());
        let plain = (am == pg_sys::BTREE_AM_OID || am == pg_sys::HASH_AM_OID)
            && !tuple.is_null()
            && column(pg_sys::Anum_pg_index_indexprs)
            && column(pg_sys::Anum_pg_index_indpred);
        pg_sys::RelationClose(rel);
        plain
    }
}
