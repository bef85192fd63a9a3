//! Who decides the decay parameters in force: the configuration (`pg_stride.decay_lambda`,
//! `pg_stride.decay_start`, `pg_stride.slice`) or the tuner.
//!
//! Reloads happen for many reasons (any GUC, a change of the groups table), and each
//! one applies the decay settings again. Were they applied as they are, every reload
//! would silently undo the tuner's choice. The rules:
//!
//! * while the tuner is on, a reload that leaves the configured parameters as they were
//!   keeps the tuned ones in force;
//! * a reload that changes them installs them at once: a DBA's explicit change wins,
//!   and the tuner starts again from it;
//! * with the tuner off, the configured parameters are in force;
//! * the tuner's choice is installed only if the configuration did not change while it
//!   searched (it searched around parameters that are no longer configured), and the
//!   tuner was not switched off meanwhile.
//!
//! Plain data, kept in shared memory under a lock by the extension.

use crate::decay::DecayParams;

/// The configured parameters, and the tuned ones in force instead, if any.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecayChoice {
    configured: DecayParams,
    tuned: Option<DecayParams>,
    /// Counts changes of `configured`, and switches of the tuner to off, so that a
    /// search can tell whether the configuration it started from is still the one in
    /// force.
    generation: u64,
    /// Whether the last reload found the tuner on: a search that read the generation
    /// after the tuner was switched off (the tuner process reads the setting only after
    /// its round) installs nothing either.
    tuner_on: bool,
}

impl DecayChoice {
    /// The choice at startup: the configuration, nothing tuned, the tuner on or not
    /// (`tuner_on`).
    pub fn new(configured: DecayParams, tuner_on: bool) -> DecayChoice {
        DecayChoice {
            configured,
            tuned: None,
            generation: 0,
            tuner_on,
        }
    }

    /// The parameters to have in force.
    pub fn in_force(&self) -> DecayParams {
        self.tuned.unwrap_or(self.configured)
    }

    /// The configured parameters: the tuner's fallback.
    pub fn configured(&self) -> DecayParams {
        self.configured
    }

    /// Whether tuned parameters are in force.
    pub fn is_tuned(&self) -> bool {
        self.tuned.is_some()
    }

    /// The configuration generation a search starts from (pass it to [`Self::adopt`]).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// A reload applies `configured` with the tuner `tuner_on`; returns the parameters
    /// to have in force.
    pub fn reload(&mut self, configured: DecayParams, tuner_on: bool) -> DecayParams {
        if configured != self.configured {
            self.configured = configured;
            self.generation += 1;
            self.tuned = None;
        }
        if !tuner_on {
            self.tuned = None;
            // A search that was running when the tuner was switched off must not
            // install its choice afterwards: the tuner process reads the new setting
            // only after its round.
            self.generation += 1;
        }
        self.tuner_on = tuner_on;
        self.in_force()
    }

    /// The tuner adopts `tuned`, found by a search that started at configuration
    /// `generation`. Returns the parameters to have in force, or `None` (nothing to
    /// install) when the configuration changed meanwhile.
    pub fn adopt(&mut self, tuned: DecayParams, generation: u64) -> Option<DecayParams> {
        if generation != self.generation || !self.tuner_on {
            return None;
        }
        // Parameters equal to the configured ones are the configuration, not a choice
        // to keep across its changes.
        self.tuned = (tuned != self.configured).then_some(tuned);
        Some(self.in_force())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(lambda: f64, d_start: u32) -> DecayParams {
        DecayParams {
            lambda,
            d_start,
            quantum_ns: 2_000_000,
        }
    }

    #[test]
    fn a_reload_that_changes_nothing_keeps_the_tuned_parameters() {
        let mut c = DecayChoice::new(params(0.9, 8), true);
        let g = c.generation();
        assert_eq!(c.adopt(params(0.98, 64), g), Some(params(0.98, 64)));
        assert_eq!(c.reload(params(0.9, 8), true), params(0.98, 64));
        assert!(c.is_tuned());
    }

    #[test]
    fn a_changed_configuration_wins_and_a_search_from_the_old_one_is_dropped() {
        let mut c = DecayChoice::new(params(0.9, 8), true);
        let g = c.generation();
        c.adopt(params(0.98, 64), g);
        assert_eq!(c.reload(params(0.8, 4), true), params(0.8, 4));
        assert!(!c.is_tuned());
        // A search that began before the change finishes after it.
        assert_eq!(c.adopt(params(0.95, 32), g), None);
        assert_eq!(c.in_force(), params(0.8, 4));
        let g = c.generation();
        assert_eq!(c.adopt(params(0.95, 32), g), Some(params(0.95, 32)));
    }

    #[test]
    fn the_tuner_off_puts_the_configuration_back() {
        let mut c = DecayChoice::new(params(0.9, 8), true);
        c.adopt(params(0.98, 64), 0);
        assert_eq!(c.reload(params(0.9, 8), false), params(0.9, 8));
        assert!(!c.is_tuned());
        // A slice change changes the quantum: a configuration change too.
        let mut c = DecayChoice::new(params(0.9, 8), true);
        c.adopt(params(0.98, 64), 0);
        let slice = DecayParams {
            quantum_ns: 1_000_000,
            ..params(0.9, 8)
        };
        assert_eq!(c.reload(slice, true), slice);
    }

    #[test]
    fn a_search_running_when_the_tuner_is_switched_off_installs_nothing() {
        let mut c = DecayChoice::new(params(0.9, 8), true);
        let g = c.generation();
        assert_eq!(c.reload(params(0.9, 8), false), params(0.9, 8));
        assert_eq!(c.adopt(params(0.98, 64), g), None);
        // One that read the configuration after the tuner was switched off, before
        // its process read the setting.
        assert_eq!(c.adopt(params(0.98, 64), c.generation()), None);
        assert_eq!(c.in_force(), params(0.9, 8));
        assert!(!c.is_tuned());
        // Switched on again, a new search installs its choice.
        c.reload(params(0.9, 8), true);
        assert_eq!(
            c.adopt(params(0.98, 64), c.generation()),
            Some(params(0.98, 64))
        );
    }

    #[test]
    fn adopting_the_configured_parameters_is_not_a_tuned_choice() {
        let mut c = DecayChoice::new(params(0.9, 8), true);
        c.adopt(params(0.98, 64), 0);
        assert_eq!(c.adopt(params(0.9, 8), 0), Some(params(0.9, 8)));
        assert!(!c.is_tuned());
    }
}
