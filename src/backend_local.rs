//! Process-local state of a PostgreSQL process.
//!
//! A PostgreSQL backend is one single-threaded process, and pgrx refuses calls into
//! PostgreSQL from any other thread: a `static` of [`BackendLocal`] is the Rust spelling
//! of a file-level `static` variable in a C extension (pg_stat_statements keeps its
//! nesting level that way). It is used instead of `thread_local!` because in a shared
//! library every access to a thread-local is a call of `__tls_get_addr`, and the
//! per-statement path reads such state many times, while a `BackendLocal` is a plain
//! memory access.
//!
//! The accessors mirror those of `std::thread::LocalKey` for `Cell` and `RefCell`, so
//! the code reads the same; a `RefCell` still catches a re-entrant mutable borrow.

use std::cell::{Cell, OnceCell, RefCell};

/// A value owned by the process's one thread (see the module comment).
pub struct BackendLocal<T>(T);

// SAFETY: PostgreSQL runs a process's backend code on a single thread, and every use of
// a BackendLocal is on that path (hooks, callbacks and SQL functions called by
// PostgreSQL), so no two threads ever touch the value.
unsafe impl<T> Sync for BackendLocal<T> {}

impl<T> BackendLocal<T> {
    pub const fn new(value: T) -> Self {
        BackendLocal(value)
    }
}

impl<T> BackendLocal<T> {
    /// The value itself, for a type made of cells of its own (an array of them).
    pub fn cells(&self) -> &T {
        &self.0
    }
}

impl<T: Copy> BackendLocal<Cell<T>> {
    pub fn get(&self) -> T {
        self.0.get()
    }

    pub fn set(&self, value: T) {
        self.0.set(value)
    }

    pub fn replace(&self, value: T) -> T {
        self.0.replace(value)
    }
}

impl<T> BackendLocal<RefCell<T>> {
    #[inline]
    pub fn with_borrow<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        f(&self.0.borrow())
    }

    /// Like `with_borrow`, but `None` instead of a panic while the value is borrowed
    /// mutably: for callbacks that must not panic outside pgrx's error boundary.
    #[inline]
    pub fn try_with_borrow<R>(&self, f: impl FnOnce(&T) -> R) -> Option<R> {
        self.0.try_borrow().ok().map(|value| f(&value))
    }

    /// Like `with_borrow_mut`, but `None` instead of a panic while the value is borrowed.
    #[inline]
    pub fn try_with_borrow_mut<R>(&self, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        self.0.try_borrow_mut().ok().map(|mut value| f(&mut value))
    }

    #[inline]
    pub fn with_borrow_mut<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut self.0.borrow_mut())
    }

    pub fn set(&self, value: T) {
        *self.0.borrow_mut() = value;
    }
}

impl<T> BackendLocal<OnceCell<T>> {
    /// The value, made by `init` at the first call.
    pub fn get_or_init(&'static self, init: impl FnOnce() -> T) -> &'static T {
        self.0.get_or_init(init)
    }
}
