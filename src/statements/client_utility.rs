//! The client's command, while it is a utility whose queries are the client's (EXECUTE,
//! DECLARE, EXPLAIN ANALYZE, CREATE TABLE AS, DO, CALL): the utility hook records it,
//! and the statements it runs take the group its tag names (docs/design.md §4 rule 4).

use crate::backend_local::BackendLocal;
use crate::pg;
use std::cell::Cell;

/// The statement the client sent, while it is a utility whose queries are the client's
/// (EXECUTE, DECLARE, EXPLAIN ANALYZE, CREATE TABLE AS, DO, CALL): its queries run in
/// portals of their own, or in no new portal, but take the group its tag names. With it,
/// the subtransaction that was current when it started: if that one aborts (an ERROR
/// inside the client's savepoint), the utility ended with it. Beside the statements, not
/// one of them: it is the client's command, which the executor does not run, and it
/// outlives the statements it runs.
static CLIENT_UTILITY: BackendLocal<Cell<Option<(pg::StatementText, u32)>>> =
    BackendLocal::new(Cell::new(None));

/// A top-level utility whose queries are the client's starts. Plain stores and reads
/// that cannot fail, as the next two: called from hooks, outside pgrx's guard.
pub fn client_utility_started(text: pg::StatementText) {
    CLIENT_UTILITY.set(Some((text, pg::current_subtransaction())));
}

/// The top-level utility has returned, or an ERROR aborted its transaction.
pub fn client_utility_ended() {
    CLIENT_UTILITY.set(None);
}

/// The subtransaction `subid` aborted: a utility that started inside it has ended.
pub fn subtransaction_aborted(subid: u32) {
    if let Some((_, started_in)) = CLIENT_UTILITY.get() {
        if subid <= started_in {
            CLIENT_UTILITY.set(None);
        }
    }
}

/// The group tag of the statement the client sent: a running top-level utility's, or
/// the active portal's statement's.
pub(super) fn group_tag() -> Option<String> {
    CLIENT_UTILITY
        .get()
        .map(|(text, _)| text)
        .or_else(pg::StatementText::of_active_portal)?
        .group_tag()
}

/// Whether a top-level utility whose queries are the client's is running: its queries
/// are never too small to admit (`unadmitted`).
pub(super) fn running() -> bool {
    CLIENT_UTILITY.get().is_some()
}
