//! Leader election on a `coordination.k8s.io/v1` Lease. Only the leader watches Consul and
//! writes to the cluster; standbys wait, ready but idle.
//!
//! Expiry is judged by how long the lease record has gone unchanged on this replica's own
//! clock, as client-go does, so clock skew between replicas cannot hand over early.
//!
//! Not kube-lease-manager (0.13): when renewals fail, its `watch()` logs and backs off for up
//! to 30 s while still reporting leadership, so a leader cut off from the API server would go
//! on acting after a standby took over. Here a leader that has not renewed for two thirds of
//! the lease exits before anyone else may take it. Its durations are also whole seconds.

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{Api, Client, api::PostParams};
use tokio::{sync::watch as signal, time::Instant};
use tracing::{error, info, warn};

use crate::{config::Config, metrics::Metrics};

pub struct Leadership {
    api: Api<Lease>,
    name: String,
    identity: String,
    renewer: tokio::task::JoinHandle<()>,
}

/// Waits until this replica leads, then keeps the lease renewed in the background; if it
/// cannot, the process exits at once so that two leaders never act. Returns `None` when
/// `shutdown` fired first.
pub async fn acquire(
    client: &Client,
    config: &Config,
    metrics: &Metrics,
    ready: &AtomicBool,
    shutdown: &mut signal::Receiver<bool>,
) -> Option<Leadership> {
    let namespace = match &config.lease_namespace {
        Some(ns) => ns.clone(),
        None => crate::config::own_namespace(client),
    };
    let identity = config.identity.clone().unwrap_or_else(hostname);
    let api: Api<Lease> = Api::namespaced(client.clone(), &namespace);
    let lease_secs = i32::try_from(config.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX);
    let mut observed: Option<(Option<String>, Option<MicroTime>, Instant)> = None;
    ready.store(true, Ordering::Relaxed);
    metrics.leader.set(0);
    info!(lease = %format!("{namespace}/{}", config.lease_name), %identity, "waiting for leadership");
    loop {
        match try_acquire(&api, &config.lease_name, &identity, lease_secs, &mut observed).await {
            Ok(true) => break,
            Ok(false) => {}
            Err(error) => warn!(%error, "leader election attempt failed"),
        }
        tokio::select! {
            _ = tokio::time::sleep(config.lease_renew) => {}
            _ = shutdown.wait_for(|stop| *stop) => return None,
        }
    }
    info!(%identity, "became leader");
    metrics.leader.set(1);
    let renewer = tokio::spawn(renew(
        api.clone(),
        config.lease_name.clone(),
        identity.clone(),
        config.lease_duration,
        config.lease_renew,
    ));
    Some(Leadership { api, name: config.lease_name.clone(), identity, renewer })
}

impl Leadership {
    /// Hands the lease back so a standby can take over without waiting for it to expire.
    pub async fn release(self) {
        self.renewer.abort();
        let result = async {
            let mut lease = self.api.get(&self.name).await?;
            let spec = lease.spec.get_or_insert_with(Default::default);
            if spec.holder_identity.as_deref() == Some(&self.identity) {
                spec.holder_identity = None;
                spec.lease_duration_seconds = Some(1);
                self.api.replace(&self.name, &PostParams::default(), &lease).await?;
            }
            Ok::<_, kube::Error>(())
        }
        .await;
        match result {
            Ok(()) => info!("released the leader lease"),
            Err(error) => warn!(%error, "could not release the leader lease"),
        }
    }
}

async fn try_acquire(
    api: &Api<Lease>,
    name: &str,
    identity: &str,
    lease_secs: i32,
    observed: &mut Option<(Option<String>, Option<MicroTime>, Instant)>,
) -> kube::Result<bool> {
    let now = MicroTime(Timestamp::now());
    let Some(mut lease) = api.get_opt(name).await? else {
        let lease = Lease {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            spec: Some(claim(identity, lease_secs, &now, 0)),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let record = (spec.holder_identity.clone(), spec.renew_time.clone());
    let unchanged_since = match observed {
        Some((holder, renew, since)) if (holder.clone(), renew.clone()) == record => *since,
        _ => {
            *observed = Some((record.0.clone(), record.1.clone(), Instant::now()));
            Instant::now()
        }
    };
    let held_for =
        Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64).max(Duration::from_secs(1));
    let free = spec.holder_identity.as_deref().is_none_or(str::is_empty)
        || spec.holder_identity.as_deref() == Some(identity)
        || unchanged_since.elapsed() >= held_for;
    if !free {
        return Ok(false);
    }
    let transitions =
        spec.lease_transitions.unwrap_or(0) + i32::from(spec.holder_identity.as_deref() != Some(identity));
    lease.spec = Some(claim(identity, lease_secs, &now, transitions));
    // Replace carries the resourceVersion we read, so two standbys cannot both win.
    match api.replace(name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

fn claim(identity: &str, lease_secs: i32, now: &MicroTime, transitions: i32) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(identity.into()),
        lease_duration_seconds: Some(lease_secs),
        acquire_time: Some(now.clone()),
        renew_time: Some(now.clone()),
        lease_transitions: Some(transitions),
        ..Default::default()
    }
}

async fn renew(api: Api<Lease>, name: String, identity: String, lease_duration: Duration, every: Duration) {
    let attempt = || {
        let (api, name, identity) = (api.clone(), name.clone(), identity.clone());
        async move {
            let mut lease = api.get(&name).await?;
            let spec = lease.spec.get_or_insert_with(Default::default);
            if spec.holder_identity.as_deref() != Some(identity.as_str()) {
                return Ok(false);
            }
            spec.renew_time = Some(MicroTime(Timestamp::now()));
            api.replace(&name, &PostParams::default(), &lease).await.map(|_| true)
        }
    };
    match keep_renewed(attempt, lease_duration, every).await {
        Lost::Taken => error!("another replica holds the leader lease; exiting"),
        Lost::Late => error!("leader lease not renewed in time; exiting so that no two leaders act"),
    }
    std::process::exit(1);
}

/// Why a leader stops.
#[derive(Debug, PartialEq, Eq)]
enum Lost {
    Taken,
    Late,
}

/// Renews every `every` until the lease is lost: taken by another replica, or not renewed
/// within two thirds of `lease_duration`, well before a standby may take over. A renewal counts
/// from when it was sent, not when its answer came: the lease was renewed no later than that,
/// and a slow answer must not eat the margin. A hung request counts as a failure.
async fn keep_renewed<F, R>(mut attempt: F, lease_duration: Duration, every: Duration) -> Lost
where
    F: FnMut() -> R,
    R: std::future::Future<Output = kube::Result<bool>>,
{
    let deadline = lease_duration * 2 / 3;
    let mut last_renewed = Instant::now();
    loop {
        tokio::time::sleep(every).await;
        let sent = Instant::now();
        let left = deadline.saturating_sub(last_renewed.elapsed());
        match tokio::time::timeout(left, attempt()).await {
            Ok(Ok(true)) => last_renewed = sent,
            Ok(Ok(false)) => return Lost::Taken,
            Ok(Err(error)) => warn!(%error, "could not renew the leader lease"),
            Err(_) => warn!("renewing the leader lease timed out"),
        }
        if last_renewed.elapsed() >= deadline {
            return Lost::Late;
        }
    }
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "consulbind".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Renewals that each take 4.9 s, on a 15 s lease renewed every 5 s: the one sent at 5 s is
    /// answered at 9.9 s, and the leader stops 10 s after it was sent, not 10 s after the answer.
    #[tokio::test(start_paused = true)]
    async fn a_slow_renewal_counts_from_when_it_was_sent() {
        let start = Instant::now();
        let slow = || async {
            tokio::time::sleep(Duration::from_millis(4_900)).await;
            Ok(true)
        };
        let lost = tokio::time::timeout(
            Duration::from_secs(120),
            keep_renewed(slow, Duration::from_secs(15), Duration::from_secs(5)),
        )
        .await
        .expect("a leader with slow renewals never stopped");
        assert_eq!(lost, Lost::Late);
        assert_eq!(Instant::now() - start, Duration::from_secs(15));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_taken_by_another_stops_at_once_and_prompt_renewals_go_on() {
        let taken = keep_renewed(|| async { Ok(false) }, Duration::from_secs(15), Duration::from_secs(5)).await;
        assert_eq!(taken, Lost::Taken);
        let prompt = keep_renewed(|| async { Ok(true) }, Duration::from_secs(15), Duration::from_secs(5));
        assert!(tokio::time::timeout(Duration::from_secs(600), prompt).await.is_err(), "a healthy leader stopped");
    }
}
