//! Small index types. PostgreSQL names a process by its `pgprocno`, and the extension
//! names query entries and groups by their index in the shared tables; these newtypes
//! keep the three from being mixed up.

use std::fmt;

macro_rules! index_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub u32);

        impl $name {
            /// The index as a `usize`, for addressing a table.
            #[inline]
            pub fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }
    };
}

index_type!(
    /// A process (backend, parallel worker, pool worker): PostgreSQL's `pgprocno`.
    ProcId
);
index_type!(
    /// A query entry: an index into the shared query table.
    QueryId
);
index_type!(
    /// A resource group: an index into the shared group table (at most 64 groups).
    GroupId
);

/// Marker stored in a "which query" field when there is none.
pub(crate) const NONE: u32 = u32::MAX;
