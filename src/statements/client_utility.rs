//! The client's command, while it is a utility whose queries are the client's (EXECUTE,
//! DECLARE, EXPLAIN ANALYZE, CREATE TABLE AS, DO, CALL): the utility hook records it,
//! and the statements it runs take the group its tag names (docs/design.md §4 rule 4)
//! and are judged as statements of the role that sent it (rule 11).

use crate::backend_local::BackendLocal;
use crate::pg;
use pgrx::pg_sys;
use std::cell::Cell;

/// The statement the client sent, while it is a utility whose queries are the client's
/// (EXECUTE, DECLARE, EXPLAIN ANALYZE, CREATE TABLE AS, DO, CALL): its queries run in
/// portals of their own, or in no new portal, but take the group its tag names. Beside
/// the statements, not one of them: it is the client's command, which the executor does
/// not run, and it outlives the statements it runs.
static CLIENT_UTILITY: BackendLocal<Cell<Option<ClientUtility>>> =
    BackendLocal::new(Cell::new(None));

#[derive(Clone, Copy)]
struct ClientUtility {
    text: pg::StatementText,
    /// The subtransaction current when it started: if that one aborts (an ERROR inside
    /// the client's savepoint), the utility ended with it.
    subtransaction: u32,
    /// The role that sent it: the statements of a SECURITY DEFINER procedure it calls
    /// run as the procedure's owner, and are still the caller's.
    role: pg_sys::Oid,
    /// Which of the backend's utilities it is: tells the statements it runs from those
    /// of another command.
    serial: u64,
}

/// The serial of the last utility that started.
static SERIAL: BackendLocal<Cell<u64>> = BackendLocal::new(Cell::new(0));

/// A top-level utility whose queries are the client's starts. Plain stores and reads
/// that cannot fail, as the next three: called from hooks, outside pgrx's guard.
pub fn client_utility_started(text: pg::StatementText) {
    SERIAL.set(SERIAL.get() + 1);
    CLIENT_UTILITY.set(Some(ClientUtility {
        text,
        subtransaction: pg::current_subtransaction(),
        role: pg::current_role(),
        serial: SERIAL.get(),
    }));
}

/// The top-level utility has returned, or an ERROR aborted its transaction.
pub fn client_utility_ended() {
    CLIENT_UTILITY.set(None);
}

/// The subtransaction `subid` aborted: a utility that started inside it has ended.
pub fn subtransaction_aborted(subid: u32) {
    if let Some(utility) = CLIENT_UTILITY.get() {
        if subid <= utility.subtransaction {
            CLIENT_UTILITY.set(None);
        }
    }
}

/// The group tag of the statement the client sent: a running top-level utility's, or
/// the active portal's statement's.
pub(super) fn group_tag() -> Option<String> {
    CLIENT_UTILITY
        .get()
        .map(|utility| utility.text)
        .or_else(pg::StatementText::of_active_portal)?
        .group_tag()
}

/// The role whose statement this is, for what pg_stride allows it (a group tag, the
/// superusers' exemption): the role that sent the running top-level utility, else the
/// current one (a top-level statement runs as the role that sent it).
pub(super) fn sender() -> pg_sys::Oid {
    CLIENT_UTILITY
        .get()
        .map_or_else(pg::current_role, |utility| utility.role)
}

/// The running top-level utility whose queries are the client's, as a number the
/// backend gives no other: its statements are one client command's.
pub(super) fn command() -> Option<u64> {
    CLIENT_UTILITY.get().map(|utility| utility.serial)
}

/// Whether a top-level utility whose queries are the client's is running: its queries
/// are never too small to admit (`unadmitted`).
pub(super) fn running() -> bool {
    CLIENT_UTILITY.get().is_some()
}
