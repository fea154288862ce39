//! Which replica serves which namespace, and when a replica may start: pure, driven by what the
//! Leases say and this replica's clock.
//!
//! Every replica holds a Lease of its own and writes on it the digest of the view it acts on:
//! the live replicas and the namespaces pinned to one. A namespace belongs to the live replica
//! pinned for it, else to the one that ranks highest for it (rendezvous hashing), so a replica
//! that joins or leaves moves only its own share.
//!
//! A replica serves only once every live replica's Lease shows the view its own shows, and it
//! stops serving before its Lease shows another. So two replicas never serve one namespace at
//! once: each must have read the other showing its view, and neither shows a new view before
//! it stopped serving under the old. A replica taken for dead stopped writing before: it fences
//! itself at two thirds of its Lease ([`super::gate`]), and the others wait out the whole of it
//! on their own clocks. One that comes back (restarted under its name) comes back as a new
//! incarnation, which is part of the view, so that no view agreed before it came back lets it
//! act.

use std::{
    collections::{BTreeMap, HashMap},
    time::Duration,
};

use k8s_openapi::jiff::Timestamp;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

/// The live replicas and the pinned namespaces, as one replica sees them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// Each live replica and its incarnation.
    members: BTreeMap<String, i32>,
    /// Namespace → the replica it is pinned to.
    pins: BTreeMap<String, String>,
}

impl View {
    pub fn new(members: impl IntoIterator<Item = (String, i32)>, pins: BTreeMap<String, String>) -> Self {
        Self { members: members.into_iter().collect(), pins }
    }

    pub fn members(&self) -> impl Iterator<Item = &str> {
        self.members.keys().map(String::as_str)
    }

    /// The replica that serves `namespace`: its pin when that replica is live, else the highest
    /// ranked.
    pub fn owner(&self, namespace: &str) -> Option<&str> {
        if let Some(pin) = self.pins.get(namespace)
            && self.members.contains_key(pin)
        {
            return Some(pin);
        }
        self.members.keys().max_by_key(|m| (rank(m, namespace), *m)).map(String::as_str)
    }

    /// What a Lease shows of the view: equal for equal views, whatever the replica's build.
    pub fn digest(&self) -> String {
        let mut hash = Sha256::new();
        for (member, incarnation) in &self.members {
            hash.update(member.as_bytes());
            hash.update(format!("#{incarnation}\n"));
        }
        hash.update(b"\0");
        for (namespace, pin) in &self.pins {
            hash.update(namespace.as_bytes());
            hash.update(b"=");
            hash.update(pin.as_bytes());
            hash.update(b"\n");
        }
        hash.finalize()[..12].iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// A stable rank: every replica and every build computes the same.
fn rank(member: &str, namespace: &str) -> u64 {
    let hash = Sha256::new().chain_update(member).chain_update(b"\0").chain_update(namespace).finalize();
    u64::from_be_bytes(hash[..8].try_into().unwrap_or_default())
}

/// The longest claim a Lease of the ring counts for, and the longest `--lease-duration` a
/// sharded replica takes: a Lease claiming more (written by hand, or by mistake) would otherwise
/// hold every replica of the ring waiting, for as long as it claims, once its holder is gone.
pub const MAX_LEASE: Duration = Duration::from_secs(300);

/// One replica's Lease as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// Its holder; none once released.
    pub holder: Option<String>,
    pub renewed: Option<Timestamp>,
    pub duration: Duration,
    /// Counts its holder's starts: a replica back under its name is another incarnation.
    pub incarnation: i32,
    /// The digest of the view it acts on.
    pub view: Option<String>,
}

/// A view served, and whether each namespace was this replica's throughout since it last served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served {
    pub view: View,
    me: String,
    /// The view served before, and each view shown since: while they were shown, another replica
    /// may have served a namespace that any of them gave to it.
    between: Vec<View>,
}

impl Served {
    /// Whether `namespace` stayed this replica's, so that what it holds of it is still true; a
    /// namespace gained or regained starts from its bindings' status, listed afresh.
    pub fn continues(&self, namespace: &str) -> bool {
        !self.between.is_empty() && self.between.iter().all(|v| v.owner(namespace) == Some(self.me.as_str()))
    }

    #[cfg(test)]
    pub fn new(view: View, me: &str, between: Vec<View>) -> Self {
        Self { view, me: me.into(), between }
    }

    pub fn owns(&self, namespace: &str) -> bool {
        self.view.owner(namespace) == Some(self.me.as_str())
    }
}

/// What to do after a look at the Leases.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing new.
    Hold,
    /// The view changed: stop serving (when `drain`), wait for the writes in flight, then show
    /// `digest` on this replica's Lease.
    Publish { drain: bool, digest: String },
    /// Every live replica shows this replica's view: serve it.
    Serve(Served),
}

/// One replica's side of the ring.
#[derive(Debug)]
pub struct Ring {
    me: String,
    incarnation: i32,
    /// Each other Lease's last renewal as listed, and when this replica first listed it.
    heard: HashMap<String, ((Option<Timestamp>, i32), Instant)>,
    /// The digest this replica's Lease shows, once written.
    published: Option<String>,
    serving: Option<View>,
    /// The view served last, and every view shown since, while serving none; empty before the
    /// first view served.
    between: Vec<View>,
}

impl Ring {
    pub fn new(me: String, incarnation: i32) -> Self {
        Self { me, incarnation, heard: HashMap::new(), published: None, serving: None, between: Vec::new() }
    }

    pub fn serving(&self) -> Option<&View> {
        self.serving.as_ref()
    }

    /// This replica's Lease now shows `digest`.
    pub fn published(&mut self, digest: String) {
        self.published = Some(digest);
    }

    /// Looks at the Leases of the ring, listed at `now` (this replica's clock) and `wall`.
    pub fn step(&mut self, leases: &[Seen], pins: BTreeMap<String, String>, now: Instant, wall: Timestamp) -> Step {
        let mut live = Vec::new();
        let mut heard = HashMap::new();
        for lease in leases {
            let Some(holder) = lease.holder.as_deref().filter(|h| !h.is_empty() && *h != self.me) else { continue };
            let record = (lease.renewed, lease.incarnation);
            let duration = lease.duration.min(MAX_LEASE);
            let since = match self.heard.get(holder) {
                Some((heard, since)) if *heard == record => *since,
                _ => now,
            };
            heard.insert(holder.to_owned(), (record, since));
            // Unchanged for its duration on this clock, or so old by the wall clock that no skew
            // could make it live (a Lease left by a replica that died before this one started).
            let quiet = now.duration_since(since) >= duration;
            let ancient = lease.renewed.is_none_or(|r| {
                let age = wall.duration_since(r);
                age.is_positive() && age.unsigned_abs() > duration * 2
            });
            if !quiet && !ancient {
                live.push(((holder.to_owned(), lease.incarnation), lease.view.as_deref()));
            }
        }
        self.heard = heard;
        let view = View::new(live.iter().map(|(m, _)| m.clone()).chain([(self.me.clone(), self.incarnation)]), pins);
        let digest = view.digest();
        if self.published.as_ref() != Some(&digest) {
            let served = self.serving.take();
            let drain = served.is_some();
            self.between.extend(served);
            // Before the first view served there is nothing to continue.
            if !self.between.is_empty() {
                self.between.push(view);
            }
            return Step::Publish { drain, digest };
        }
        let agreed = live.iter().all(|(_, shown)| *shown == Some(digest.as_str()));
        if agreed && self.serving.as_ref() != Some(&view) {
            self.serving = Some(view.clone());
            let between = std::mem::take(&mut self.between);
            return Step::Serve(Served { view, me: self.me.clone(), between });
        }
        Step::Hold
    }
}

#[cfg(test)]
mod tests;
