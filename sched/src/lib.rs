//! pg_stride's scheduling decisions, with no PostgreSQL types: stride scheduling,
//! decaying priorities, adaptive slices and the concurrency hint. The extension places
//! the shared-memory structures defined here into PostgreSQL's shared memory.
