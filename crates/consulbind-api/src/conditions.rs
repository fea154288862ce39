//! Condition types and reasons, kept in one place so the controller, tests and docs agree.

/// The targets carry the current content, and nothing blocks the next change.
pub const READY: &str = "Ready";
/// Every bound key was read from Consul.
pub const CONSUL_SYNCED: &str = "ConsulSynced";
/// Every target was found and carries the applied checksum.
pub const TARGETS_UPDATED: &str = "TargetsUpdated";
/// kstatus (Flux, `kubectl wait`): work is under way that ends by itself, such as a quiet period
/// or a staged rollout; the reason is Ready's.
pub const RECONCILING: &str = "Reconciling";
/// kstatus: the binding cannot go on until someone acts (an invalid spec, a denied token, a
/// missing key); the reason is Ready's.
pub const STALLED: &str = "Stalled";
/// The spec does something an earlier release took and a newer API server refuses: it is served
/// as it was, and the message says what to change. Present only then.
pub const SPEC_WARNING: &str = "SpecWarning";

pub mod reason {
    pub const UP_TO_DATE: &str = "UpToDate";
    pub const ROLLED_OUT: &str = "RolledOut";
    pub const BASELINED: &str = "Baselined";
    pub const SYNCED: &str = "Synced";
    /// Read, but the namespace has more Consul tokens than its share of blocking queries: its
    /// watches take turns, and changes may show seconds late.
    pub const WATCHES_IN_TURNS: &str = "WatchesInTurns";
    pub const PENDING: &str = "ChangePending";
    pub const SUSPENDED: &str = "Suspended";
    pub const KEY_MISSING: &str = "KeyMissing";
    /// A required ConfigMap or Secret does not exist.
    pub const OBJECT_MISSING: &str = "ObjectMissing";
    /// A bound ConfigMap or Secret could not be read (the controller's RBAC?).
    pub const OBJECT_UNREADABLE: &str = "ObjectUnreadable";
    /// Consul's index went backwards just as bound content became missing or empty.
    pub const CONSUL_INDEX_RESET: &str = "ConsulIndexReset";
    pub const ACCESS_DENIED: &str = "AccessDenied";
    pub const CONSUL_UNREACHABLE: &str = "ConsulUnreachable";
    pub const CONSUL_ERROR: &str = "ConsulError";
    pub const TOKEN_SECRET_INVALID: &str = "TokenSecretInvalid";
    /// The binding has no token of its own, and the default token may not read its keys there.
    pub const DEFAULT_TOKEN_FORBIDDEN: &str = "DefaultTokenForbidden";
    /// A bound prefix holds more keys or bytes than the controller's limits.
    pub const PREFIX_TOO_LARGE: &str = "PrefixTooLarge";
    /// A binding's sources exceed the controller's limits: its keys and prefixes hold more bytes
    /// together than `--max-binding-bytes`, a bound ConfigMap or Secret has more data keys than
    /// `--max-object-keys`, or its targets reference more ConfigMaps and Secrets than a binding
    /// may read that way.
    pub const BINDING_TOO_LARGE: &str = "BindingTooLarge";
    /// The namespace has more bindings than the controller serves in one
    /// (`--max-bindings-per-namespace`); the oldest are served.
    pub const TOO_MANY_BINDINGS: &str = "TooManyBindings";
    /// The binding's keys would take its namespace past the distinct Consul paths the
    /// controller watches for one namespace (`--max-watched-paths-per-namespace`).
    pub const TOO_MANY_WATCHED_PATHS: &str = "TooManyWatchedPaths";
    /// A staged rollout is rolling a wave and waiting for its targets to become healthy.
    pub const ROLLOUT_IN_PROGRESS: &str = "RolloutInProgress";
    /// A wave is healthy; the next starts after the wave's pause.
    pub const WAVE_PAUSED: &str = "WavePaused";
    /// A rolled target failed or was not healthy within `rollout.healthTimeout`.
    pub const ROLLOUT_HALTED: &str = "RolloutHalted";
    /// A target was rolled as often as `rollout.budget` allows; the change waits.
    pub const ROLLOUT_BUDGET_EXHAUSTED: &str = "RolloutBudgetExhausted";
    /// The change waits for a rollout window (`rollout.windows`); `status.rollout.nextWindow`
    /// says when the next opens.
    pub const OUTSIDE_ROLLOUT_WINDOW: &str = "OutsideRolloutWindow";
    /// Event: the binding's `consulbind.dev/roll-outside-window` annotation let its content
    /// roll outside the rollout windows.
    pub const ROLLED_OUTSIDE_WINDOW: &str = "RolledOutsideWindow";
    /// The namespace is over the controller's `--namespace-write-limit`: changes wait, coalesced.
    pub const WRITE_LIMITED: &str = "WriteLimited";
    /// In `DryRun` mode: the targets would have been rolled, and were not.
    pub const DRY_RUN: &str = "DryRun";
    /// A target's kind is not served by the cluster (Argo Rollouts not installed), or not to
    /// the controller.
    pub const KIND_NOT_SERVED: &str = "KindNotServed";
    pub const INVALID_SPEC: &str = "InvalidSpec";
    pub const TARGET_MISSING: &str = "TargetMissing";
    pub const PATCH_FAILED: &str = "PatchFailed";
    /// The controller failed on this binding (a bug); it is retried, and other bindings go on.
    pub const CONTROLLER_ERROR: &str = "ControllerError";
    /// `SpecWarning`: `maxDelay` shorter than `quietPeriod`, served as before the rule.
    pub const MAX_DELAY_BELOW_QUIET_PERIOD: &str = "MaxDelayBelowQuietPeriod";
}
