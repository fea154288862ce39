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

/// A reason of the conditions or of the events, with what it means and what to do. The book's
/// table of them ("Why didn't it roll?") is made from [`REASONS`].
pub struct Reason {
    pub name: &'static str,
    pub means: &'static str,
    pub action: &'static str,
}

/// Every reason of [`reason`]. Links are relative to the book's `docs/src/`.
pub const REASONS: &[Reason] = &[
    Reason {
        name: reason::UP_TO_DATE,
        means: "The targets carry the current content.",
        action: "Nothing. If you expected a rollout, see [Nothing changed?](#nothing-changed) below.",
    },
    Reason {
        name: reason::PODS_AWAIT_DELETION,
        means: "The targets carry the current content, but a StatefulSet's or DaemonSet's pods run the old one until they are deleted: its `updateStrategy` is `OnDelete`. The message names the workloads and how many pods are updated.",
        action: "Delete the pods named when it suits you (`kubectl delete pod`), one at a time if they serve; each comes back with the current content. Or switch the workload to `RollingUpdate`.",
    },
    Reason {
        name: reason::BASELINED,
        means: "The binding found a running workload and recorded its content as a baseline, without a rollout; or a template's references changed and the new content was recorded.",
        action: "Nothing: the next change rolls it once. To roll on bind, create the binding with `rollout.onBind: true`.",
    },
    Reason {
        name: reason::SYNCED,
        means: "(`ConsulSynced`) Every bound key was read from Consul.",
        action: "Nothing.",
    },
    Reason {
        name: reason::WATCHES_IN_TURNS,
        means: "(`ConsulSynced=True`) The namespace uses more distinct Consul tokens than its share of blocking queries: its watches take turns, and a change may show as late as a round of turns takes (the message gives it).",
        action: "Use fewer distinct tokens in the namespace, raise `--consul-max-connections`, or reach Consul over HTTPS. See [Many keys on few connections](concepts/connections.md).",
    },
    Reason {
        name: reason::PENDING,
        means: "A change waits for its quiet period (or, after a Consul restore, for the restore grace; the message says which).",
        action: "Wait: at most `maxDelay` after the first change (or `--consul-restore-grace` of stable content). See [Debounce](concepts/debounce.md).",
    },
    Reason {
        name: reason::SUSPENDED,
        means: "`spec.suspend` is true.",
        action: "Set it to false; resuming rolls once if the content changed.",
    },
    Reason {
        name: reason::DRY_RUN,
        means: "(`Ready=True`) The targets would have been rolled and were not: `spec.rollout.mode: DryRun` or `--dry-run`.",
        action: "Switch to `Rollout`, or remove `--dry-run`; the targets roll once if their content differs. See [Dry run](guides/dry-run.md).",
    },
    Reason {
        name: reason::KEY_MISSING,
        means: "A required key does not exist; rollouts are held.",
        action: "Create the key, or mark it `optional: true` if its absence is content.",
    },
    Reason {
        name: reason::OBJECT_MISSING,
        means: "A required ConfigMap or Secret does not exist.",
        action: "Create it, or mark it `optional: true`.",
    },
    Reason {
        name: reason::OBJECT_UNREADABLE,
        means: "The controller could not list or read ConfigMaps or Secrets for longer than `--object-failure-grace` (5 s).",
        action: "Check the controller's RBAC; the binding is read again every 15 s.",
    },
    Reason {
        name: reason::CONSUL_INDEX_RESET,
        means: "Consul's data went back (a snapshot restore, a rebuilt cluster) and content was lost; nothing rolls.",
        action: "Restore the data (the same content rolls nothing), or change the binding's spec (for example drop the key) as the go-ahead. See [The data-loss guard](concepts/data-loss-guard.md).",
    },
    Reason {
        name: reason::ACCESS_DENIED,
        means: "Consul answered 403.",
        action: "Grant the token `key_prefix` read on those keys; a grant shows within about 10 s (plus the agent's `acl.token_ttl` where it caches tokens).",
    },
    Reason {
        name: reason::CONSUL_UNREACHABLE,
        means: "Consul has not answered for longer than `--consul-failure-grace` (5 s).",
        action: "Check the address, the network and the agent; the status is back within seconds of Consul answering. See [When Consul fails](operations/consul-failures.md).",
    },
    Reason {
        name: reason::CONSUL_ERROR,
        means: "Consul answers with a 5xx, such as \"No cluster leader\".",
        action: "Check Consul's health.",
    },
    Reason {
        name: reason::TOKEN_SECRET_INVALID,
        means: "The binding's token Secret is missing, lacks the `consulbind.dev/token` label, lacks the key, or holds a value over 1,024 bytes.",
        action: "Create or label the Secret (`consulbind.dev/token=true`), and check `tokenSecretRef.key`.",
    },
    Reason {
        name: reason::DEFAULT_TOKEN_FORBIDDEN,
        means: "The binding has no token of its own, and its namespace may not read those keys with the controller's; Consul was not asked.",
        action: "Annotate the namespace with `consulbind.dev/default-token-prefixes`, set `--default-token-prefixes`, or give the binding its own token. See [Consul ACL tokens and TLS](guides/consul-access.md).",
    },
    Reason {
        name: reason::TOO_MANY_WATCHED_PATHS,
        means: "The namespace's bindings watch more than `--max-watched-paths-per-namespace` distinct paths.",
        action: "Share keys between bindings, or raise the limit; it is looked at again every 15 s.",
    },
    Reason {
        name: reason::PREFIX_TOO_LARGE,
        means: "A bound prefix holds more than `--max-prefix-entries` keys or `--max-prefix-bytes` bytes.",
        action: "Bind a narrower prefix, or raise the limit.",
    },
    Reason {
        name: reason::BINDING_TOO_LARGE,
        means: "The binding's keys hold more than `--max-binding-bytes`, a bound ConfigMap or Secret has more than `--max-object-keys` data keys, or its targets reference more than 64 objects its spec does not name.",
        action: "Split or narrow the binding, or raise the limit; it reads again after 5 minutes, or at once when its spec changes.",
    },
    Reason {
        name: reason::TOO_MANY_BINDINGS,
        means: "The namespace has more bindings than `--max-bindings-per-namespace`; the oldest are served.",
        action: "Delete bindings, or raise the limit; a waiting binding is served as soon as an older one is deleted.",
    },
    Reason {
        name: reason::ROLLOUT_IN_PROGRESS,
        means: "A wave is rolling and its targets are not healthy yet.",
        action: "Wait; `status.targets[]` shows each target's state.",
    },
    Reason {
        name: reason::WAVE_PAUSED,
        means: "A wave is healthy and the next starts after its pause.",
        action: "Wait.",
    },
    Reason {
        name: reason::ROLLOUT_HALTED,
        means: "A rolled target failed or was not healthy within `healthTimeout`; the message names it and what it reports.",
        action: "Fix the workload (the rollout goes on by itself once it is healthy), or push a fix or a revert (a new change starts again from the first wave). See [Staged rollouts](guides/staged-rollouts.md#halts).",
    },
    Reason {
        name: reason::ROLLOUT_BUDGET_EXHAUSTED,
        means: "A target was rolled as often as its budget allows; the message says when the next rollout may happen.",
        action: "Wait (the latest content rolls then, once), or raise `spec.rollout.budget`.",
    },
    Reason {
        name: reason::OUTSIDE_ROLLOUT_WINDOW,
        means: "The change waits for a rollout window; the message and `status.rollout.nextWindow` say when the next opens.",
        action: "Wait, or let it through with the annotation `consulbind.dev/roll-outside-window`. See [Rollout windows](guides/staged-rollouts.md#rollout-windows).",
    },
    Reason {
        name: reason::WRITE_LIMITED,
        means: "The namespace is over `--namespace-write-limit`; its changes wait, coalesced.",
        action: "Wait: the last change rolls once the namespace is within. Raise the limit if it is too tight.",
    },
    Reason {
        name: reason::KIND_NOT_SERVED,
        means: "A target's kind, such as `Rollout`, is not served by the cluster, or not to the controller.",
        action: "Install the CRD (picked up within seconds, without a restart), or grant the controller access.",
    },
    Reason {
        name: reason::INVALID_SPEC,
        means: "The spec breaks a rule; the message names the field.",
        action: "Fix that field. On Kubernetes 1.25 and newer the API server refuses most such specs at apply.",
    },
    Reason {
        name: reason::TARGET_MISSING,
        means: "No workload matches a target, or a target is a Rollout with `spec.workloadRef`.",
        action: "Check kind, name or selector, and the namespace; for such a Rollout, bind the Deployment it references.",
    },
    Reason {
        name: reason::PATCH_FAILED,
        means: "The API server refused the stamp (a webhook, a rule); the message says why.",
        action: "Fix what refuses it; the target is patched again at the next look.",
    },
    Reason {
        name: reason::CONTROLLER_ERROR,
        means: "The controller failed on this binding; it retries, and serves every other binding meanwhile.",
        action: "A bug worth reporting, with the message and the controller's log.",
    },
    Reason {
        name: reason::MAX_DELAY_BELOW_QUIET_PERIOD,
        means: "(`SpecWarning`) A stored spec has `maxDelay` shorter than `quietPeriod`; it is served as before.",
        action: "Set `maxDelay` at least `quietPeriod`.",
    },
    Reason {
        name: reason::ROLLED_OUT,
        means: "Event, on the binding and on the workload: a rollout, naming the sources that changed.",
        action: "Nothing.",
    },
    Reason {
        name: reason::ROLLED_OUTSIDE_WINDOW,
        means: "Event: the annotation `consulbind.dev/roll-outside-window` let a rollout through outside the rollout windows.",
        action: "Nothing; the next change keeps to the windows again.",
    },
];

pub mod reason {
    pub const UP_TO_DATE: &str = "UpToDate";
    /// Up to date but for the pods of `OnDelete` workloads, which take the content when deleted.
    pub const PODS_AWAIT_DELETION: &str = "PodsAwaitDeletion";
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

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/src/troubleshooting.md");
    const BEGIN: &str = "<!-- reasons: generated from crates/consulbind-api/src/conditions.rs by its unit test; \
                         CONSULBIND_WRITE_REFERENCE=1 cargo test -p consulbind-api writes them -->\n";
    const END: &str = "<!-- reasons: end -->\n";

    /// The table of reasons, as the book shows it.
    fn table() -> String {
        let cell = |text: &str| text.replace('|', "\\|");
        let rows: String =
            REASONS.iter().map(|r| format!("| `{}` | {} | {} |\n", r.name, cell(r.means), cell(r.action))).collect();
        format!("{BEGIN}| Reason | What it means | What to do |\n| --- | --- | --- |\n{rows}{END}")
    }

    #[test]
    fn every_reason_has_its_meaning_and_what_to_do() {
        let source = include_str!("conditions.rs");
        let module = &source[source.find("pub mod reason {").unwrap()..];
        let module = &module[..module.find("\n}\n").unwrap()];
        let declared: Vec<&str> = module
            .lines()
            .filter_map(|l| l.trim().strip_prefix("pub const "))
            .filter_map(|l| l.split('"').nth(1))
            .collect();
        let listed: Vec<&str> = REASONS.iter().map(|r| r.name).collect();
        for name in &declared {
            assert!(listed.contains(name), "{name} has no entry in REASONS");
        }
        assert_eq!(listed.len(), declared.len(), "a reason is listed twice");
        assert!(REASONS.iter().all(|r| !r.means.is_empty() && !r.action.is_empty()));
    }

    #[test]
    fn the_books_table_of_reasons_is_current() {
        let page = std::fs::read_to_string(PAGE).unwrap();
        let (start, end) = (page.find(BEGIN).expect("the table's start"), page.find(END).expect("its end") + END.len());
        let current = format!("{}{}{}", &page[..start], table(), &page[end..]);
        if std::env::var("CONSULBIND_WRITE_REFERENCE").as_deref() == Ok("1") {
            std::fs::write(PAGE, &current).unwrap();
            return;
        }
        assert!(
            page == current,
            "docs/src/troubleshooting.md's table of reasons is stale; run \
             CONSULBIND_WRITE_REFERENCE=1 cargo test -p consulbind-api and commit it"
        );
    }
}
