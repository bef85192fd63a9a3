//! pg_stride's configuration parameters (GUCs): the variable type every module's
//! settings use, `pg_stride.enabled`, and the reservation of the `pg_stride.` prefix.
//!
//! Each module registers its own settings (`register_settings`, called from `_PG_init`
//! in one block) and keeps their variables private, behind typed accessors: admission,
//! `cpu`, `groups`, `numa`, `parallel`, `pool`, `statements`, the executor hooks and the
//! tuner worker. This one holds only what every layer reads. Names, units and ranges
//! follow docs/design.md §5 and PostgreSQL's own conventions: times carry a unit, `0`
//! means "automatic" where PostgreSQL uses that idiom, and settings that let a session
//! take more than its share are superuser-only (`PGC_SUSET`), so a role's values come
//! from `ALTER ROLE … SET` / `ALTER DATABASE … SET`. docs/configuration.md lists them
//! all, checked against the server by regress/docs.py.

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting, GucValue};

/// A setting's variable, read without pgrx's thread check: pgrx's `GucSetting::get`
/// checks on every read that it runs on the thread that loaded the library, and
/// settings are read many times per statement. A backend runs its hooks on its one
/// thread (see `backend_local`), as C extensions read their GUC variables; registration
/// takes the inner `GucSetting`.
pub struct Setting<T: GucValue>(GucSetting<T>);

impl<T: GucValue> Setting<T> {
    /// A setting whose variable starts as `inner`'s, until it is registered.
    pub const fn new(inner: GucSetting<T>) -> Self {
        Setting(inner)
    }

    /// The variable to give `GucRegistry` when the setting is registered.
    pub fn inner(&'static self) -> &'static GucSetting<T> {
        &self.0
    }

    /// The setting's value.
    pub fn get(&self) -> T {
        // SAFETY: the raw value PostgreSQL's GUC machinery stores (a valid one of `T`,
        // as pgrx's own `get` converts it), read on the process's one thread.
        unsafe { T::from_raw(self.raw()) }
    }

    /// The variable as PostgreSQL stores it (an enum's ordinal, a string's pointer):
    /// an enum read without converting it, which panics on an unknown ordinal.
    pub fn raw(&self) -> T::Raw {
        // SAFETY: the variable lives as long as the library; read on the process's one
        // thread, as every GUC variable in C.
        unsafe { *self.0.as_ptr() }
    }
}

static ENABLED: Setting<bool> = Setting::new(GucSetting::<bool>::new(true));

/// `pg_stride.enabled`: the executor hooks ask it for every statement, outside pgrx's
/// error boundary, where nothing may panic (reading a bool cannot).
pub fn enabled() -> bool {
    ENABLED.get()
}

/// Registers `pg_stride.enabled`. Called from `_PG_init` first, before the modules'
/// settings.
pub fn register() {
    GucRegistry::define_bool_guc(
        c"pg_stride.enabled",
        c"Enables pg_stride's admission control and CPU scheduling.",
        c"When off, every pg_stride hook passes straight through to the previous one.",
        ENABLED.inner(),
        GucContext::Suset,
        GucFlags::default(),
    );
}

/// Any other `pg_stride.*` name is a typo: warns about it, as PostgreSQL does for its own
/// prefixes, and refuses it from now on. Called from `_PG_init` after every module
/// registered its settings.
pub fn reserve_prefix() {
    // SAFETY: called from _PG_init after pg_stride's GUCs are defined.
    unsafe { pgrx::pg_sys::MarkGUCPrefixReserved(c"pg_stride".as_ptr()) };
}

/// The value a string GUC's check hook is asked about; empty for none.
///
/// # Safety
/// `newval` is the hook's argument: null, or a pointer to null or to a C string.
pub unsafe fn proposed_string(newval: *mut *mut std::ffi::c_char) -> String {
    // SAFETY: the caller's promise.
    unsafe {
        newval
            .as_ref()
            .filter(|p| !p.is_null())
            .map(|&p| std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned())
    }
    .unwrap_or_default()
}
